"""Probe (not a benchmark of record): attention_sm90 taking TILES query blocks per block in turn (the next tile's
queries prefetched through a ring on the tile loop) next to cuDNN, at N = 1024 and 4096, not causal: how much of
a block's start-up the tile loop hides.

    python bench/tiles_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import checked_time, time_ms  # noqa: E402

from tkc.kernels import attention_sm90  # noqa: E402

VARIANTS = {
    128: [dict(KEYS=128, WARPS=8, DEFER=1, PRODUCER=1, Q_REGS=1, PINGPONG=p, TILES=t) for p in (0, 1) for t in (1, 2, 4)],
    64: [dict(KEYS=64, WARPS=8, TILES=t) for t in (1, 2, 4)]
    + [dict(KEYS=128, WARPS=12, DEFER=1, PRODUCER=1, TILES=t) for t in (1, 2, 4)],
}
for n in (1024, 4096):
    for d in (128, 64):
        b, h = 16384 // n, 16
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o = torch.empty_like(q)
        lse = torch.empty(1, 1, 1, device="cuda")
        flops = 4 * b * h * n * n * d
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            cudnn = time_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            flash = time_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        print(f"N={n} D={d}: cuDNN {flops / cudnn / 1e9:.0f}, flash {flops / flash / 1e9:.0f} TFLOP/s", flush=True)
        for c in VARIANTS[d]:
            grid = (-(-n // (16 * c["WARPS"] * c["TILES"])), h, b)
            try:
                ms, err = checked_time(lambda: attention_sm90[grid](q, k, v, o, lse, d**-0.5, D=d, **c, target="sm_90a"),
                                       o, ref)
                print(f"  {c}: {flops / ms / 1e9:.0f} ({cudnn / ms:.2f}x cuDNN, {flash / ms:.2f}x flash) err {err:.1e}",
                      flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"  {c}: {type(e).__name__}: {str(e)[:200]}")
