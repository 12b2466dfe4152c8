"""GEMM: C = A·B or A·Bᵀ in bf16 with f32 accumulation, through shared tiles and the tensor cores."""

import tkc
from tkc.lang import *  # noqa: F403


@tkc.kernel(warps=4, min_target="sm_80")
def gemm_kernel(A: gl[bf16, 2], B: gl[bf16, 2], C: gl[bf16, 2],
                TRANS_B: const = 0, BM: const = 128, BN: const = 128, BK: const = 32):
    """C (M×N) = A (M×K) · B (K×N), or · Bᵀ with TRANS_B=1 (B is N×K). Grid: (cdiv(N, BN), cdiv(M, BM)).

    The block stages a BM×BK slice of A and a BK×BN slice of B in shared memory per step of K; its 4 warps
    form a 2×2 grid and each accumulates a (BM/2)×(BN/2) piece of C in registers. Edges read zeros and
    their stores are dropped, so any M, N, K works.
    """
    WM, WN = BM // 2, BN // 2
    bn, bm, _ = block_idx()
    wm, wn = warp_id() // 2, warp_id() % 2
    acc = zeros(rt[f32, WM, WN])
    for k in range(cdiv(A.shape[1], BK)):
        a = load(load(A, (bm, k), st[bf16, BM, BK]), (wm, 0), rt[bf16, WM, BK])
        if TRANS_B:
            b = load(load(B, (bn, k), st[bf16, BN, BK]), (wn, 0), rt[bf16, WN, BK])
            acc = mma_ABt(a, b, acc)
        else:
            b = load(load(B, (k, bn), st[bf16, BK, BN]), (0, wn), rt[bf16, BK, WN])
            acc = mma_AB(a, b, acc)
    store(C, acc.to(bf16), (bm * 2 + wm, bn * 2 + wn))
