"""Probe (not a benchmark of record): attention with several query tiles per block (tests/kernels/
tiled_attention.py: the next tile's queries prefetched through a ring on the tile loop) next to attention_sm90
and cuDNN, at N = 1024 and 4096, to see how much of a block's start-up a tile loop hides.

    python bench/tiles_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
from common import checked_time, time_ms  # noqa: E402
from tiled_attention import tiled_attention  # noqa: E402

from tkc.kernels import attention_sm90  # noqa: E402
from tkc.kernels.attention import sm90_config  # noqa: E402

for n in (1024, 4096):
    for d in (64, 128):
        b, h = 16384 // n, 16
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o = torch.empty_like(q)
        lse = torch.empty(1, 1, 1, device="cuda")
        flops = 4 * b * h * n * n * d
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            cudnn = time_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        print(f"N={n} D={d}: cuDNN {flops / cudnn / 1e9:.0f} TFLOP/s", flush=True)
        cfg = sm90_config(d, n)
        ms, err = checked_time(lambda: attention_sm90[(-(-n // (16 * cfg["WARPS"])), h, b)](
            q, k, v, o, lse, d**-0.5, D=d, **cfg, target="sm_90a"), o, ref)
        print(f"  attention_sm90 {cfg}: {flops / ms / 1e9:.0f} ({cudnn / ms:.2f}x cuDNN) err {err:.1e}", flush=True)
        if d == 64:
            variants = [dict(KEYS=64, WARPS=8, STAGES=3, TILES=t) for t in (1, 2, 4)]
            variants += [dict(KEYS=128, WARPS=12, STAGES=3, PRODUCER=1, DEFER=1, TILES=t) for t in (1, 2, 4)]
        else:
            variants = [dict(KEYS=128, WARPS=8, STAGES=3, PRODUCER=1, DEFER=1, Q_REGS=1, TILES=t) for t in (1, 2, 4, 8)]
        for c in variants:
            grid = (-(-n // (16 * c["WARPS"] * c["TILES"])), h, b)
            try:
                ms, err = checked_time(lambda: tiled_attention[grid](q, k, v, o, d**-0.5, D=d, **c, target="sm_90a"), o, ref)
                print(f"  tiled {c}: {flops / ms / 1e9:.0f} ({cudnn / ms:.2f}x cuDNN) err {err:.1e}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"  tiled {c}: {type(e).__name__}: {str(e)[:200]}")
