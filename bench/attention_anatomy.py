"""Where attention_sm90's time goes: the kernel beside variants of itself with one part taken out (not the
benchmark of record; the variants compute wrong answers on purpose). At B·N = 16384, H = 16, D = 128 by default.

    python bench/attention_anatomy.py [--n 4096] [--d 128] [--keys 128] [-D PINGPONG=1] [-D DEFER=1 -D PRODUCER=1]

  full        the kernel (attention_sm90's loop)
  no-softmax  P = S in bf16: the two wgmmas and the ring only
  no-pv       S = Q·Kᵀ and the softmax, no P·V
  no-exp      the softmax with exp2 taken out (max, subtract, sum): what MUFU costs
-D QREG=1: Q·Kᵀ takes Q from registers rather than shared memory (QREG=2: the first half of its columns). -D BLOCKS_FIRST=1: grid (blocks, H, B).
Figures are the full kernel's FLOPs over each variant's time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import time_ms  # noqa: E402

import tkc  # noqa: E402
from tkc.lang import *  # noqa: E402,F403


@tkc.kernel(warps="WARPS", stages="STAGES", pingpong="PINGPONG", defer="DEFER", producer="PRODUCER", min_target="sm_90a")
def anatomy(Q: gl[bf16, 4], K: gl[bf16, 4], V: gl[bf16, 4], O: gl[bf16, 4], scale: float, D: const = 128,  # noqa: F405
            KEYS: const = 128, WARPS: const = 8, STAGES: const = 3, PINGPONG: const = 0, PART: const = 0, QREG: const = 0, BLOCKS_FIRST: const = 0,
            DEFER: const = 0, PRODUCER: const = 0):
    if BLOCKS_FIRST:  # grid (blocks, H, B): the blocks running at once share a few heads' K and V (in L2)
        blk, h, b = block_idx()  # noqa: F405
    else:
        b, h, blk = block_idx()  # noqa: F405
    q_block = load(Q, (b, h, blk, 0), st[bf16, 16 * WARPS, D])  # noqa: F405
    q = load(q_block, (warpgroup_id(), 0), st[bf16, 64, D])  # noqa: F405
    q_tile = blk * WARPS + warp_id()  # noqa: F405
    if QREG == 1:  # Q·Kᵀ with A from registers (each warp its 16 rows), not from shared memory
        q = load(Q, (b, h, q_tile, 0), rt[bf16, 16, D])  # noqa: F405
    if QREG == 2:  # the first half of Q's columns from registers, the second from shared memory
        q_low = load(Q, (b, h, q_tile, 0), rt[bf16, 16, D // 2])  # noqa: F405
        q_high = load(load(q_block, (0, 1), st[bf16, 16 * WARPS, D // 2]), (warpgroup_id(), 0), st[bf16, 64, D // 2])  # noqa: F405
    scale_log2 = scale * LOG2E  # noqa: F405
    m, l, o = neg_infty(rv[f32, 16]), zeros(rv[f32, 16]), zeros(rt[f32, 16, D])  # noqa: F405
    for j in range(cdiv(K.shape[2], KEYS)):  # noqa: F405
        k_s, v_s = load(K, (b, h, j, 0), st[bf16, KEYS, D]), load(V, (b, h, j, 0), st[bf16, KEYS, D])  # noqa: F405
        if QREG == 2:
            s = mma_ABt(q_low, load(k_s, (0, 0), st[bf16, KEYS, D // 2]), zeros(rt[f32, 16, KEYS]))  # noqa: F405
            s = mma_ABt(q_high, load(k_s, (0, 1), st[bf16, KEYS, D // 2]), s)  # noqa: F405
        else:
            s = mma_ABt(q, k_s, zeros(rt[f32, 16, KEYS]))  # noqa: F405
        if PART == 1:  # no softmax
            p = s
        else:
            m_new = max(m, row_max(s))  # noqa: F405
            correction = exp2((m - m_new) * scale_log2)  # noqa: F405
            l, o, m = l * correction, mul_row(o, correction), m_new  # noqa: F405
            if PART == 3:  # no exp2
                p = sub_row(s * scale_log2, m * scale_log2)  # noqa: F405
            else:
                p = exp2(sub_row(s * scale_log2, m * scale_log2))  # noqa: F405
            l = l + row_sum(p)  # noqa: F405
        if PART != 2:
            o = mma_AB(p.to(bf16), v_s, o)  # noqa: F405
    if PART == 1:
        l = l + 1.0
    store(O, div_row(o, l).to(bf16), (b, h, q_tile, 0))  # noqa: F405


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--keys", type=int, default=128)
    parser.add_argument("-D", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    extra = {k: int(v) for k, v in (kv.split("=") for kv in args.D)}
    n, d = args.n, args.d
    b, h = max(1, 16384 // n), 16
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    flops = 4 * b * h * n * n * d
    for part, name in enumerate(["full", "no-softmax", "no-pv", "no-exp"]):
        grid = (n // 128, h, b) if extra.get("BLOCKS_FIRST") else (b, h, n // 128)
        run = lambda part=part: anatomy[grid](q, k, v, o, d**-0.5, D=d, KEYS=args.keys, PART=part,  # noqa: E731
                                                          **extra, target="sm_90a")
        try:
            ms = time_ms(run)
        except Exception as e:  # noqa: BLE001  (e.g. defer=1 without P·V: one wgmma)
            print(f"{name:11s} {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            continue
        check = ""
        if part == 0:  # the full kernel computes attention: say how close
            ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
            check = f"  err {((o.float() - ref).norm() / ref.norm()).item():.1e}"
        print(f"{name:11s} {ms * 1e3:8.1f} µs  {flops / ms / 1e9:5.0f} TFLOP/s  {extra or ''}{check}", flush=True)


if __name__ == "__main__":
    main()
