"""C = gelu_tanh(A·B + bias): a GEMM with a fused epilogue (bias over columns, then the tanh form of GELU)."""

import math

import tkc
from tkc.lang import *  # noqa: F403

GELU_C = math.sqrt(2.0 / math.pi)


@tkc.func
def gelu_tanh(x):
    """0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), elementwise on an f32 register tile."""
    inner = (x + x * x * x * 0.044715) * GELU_C
    return x * 0.5 * (tanh(inner) + 1.0)


@tkc.kernel(warps=4, min_target="sm_80")
def gemm_bias_gelu(A: gl[bf16, 2], B: gl[bf16, 2], Bias: gl[bf16, 1], C: gl[bf16, 2],
                   BM: const = 64, BN: const = 64, BK: const = 32):
    """A (M×K), B (K×N), Bias (N,), C (M×N). Grid: (cdiv(N, BN), cdiv(M, BM)).

    The 4 warps form a 2×2 grid over the BM×BN block; each keeps a (BM/2)×(BN/2) f32 accumulator. Ragged edges
    read zeros and their stores are dropped.
    """
    WM, WN = BM // 2, BN // 2
    bn, bm, _ = block_idx()
    wm, wn = warp_id() // 2, warp_id() % 2
    acc = zeros(rt[f32, WM, WN])
    for k in range(cdiv(A.shape[1], BK)):
        a_s = load(A, (bm, k), st[bf16, BM, BK])
        b_s = load(B, (k, bn), st[bf16, BK, BN])
        acc = mma_AB(load(a_s, (wm, 0), rt[bf16, WM, BK]), load(b_s, (0, wn), rt[bf16, BK, WN]), acc)
    bias = load(Bias, (bn * 2 + wn,), rv[f32, WN])    # this warp's WN columns of the bias
    store(C, gelu_tanh(add_col(acc, bias)).to(bf16), (bm * 2 + wm, bn * 2 + wn))
