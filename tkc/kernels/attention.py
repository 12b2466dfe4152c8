"""Attention forward (FlashAttention-2 style): O = softmax(Q·Kᵀ/√D)·V, causal or not, with online softmax."""

import tkc
from tkc.lang import *  # noqa: F403


@tkc.kernel(warps=4, min_target="sm_80")
def attention_fwd(Q: gl[bf16, 4], K: gl[bf16, 4], V: gl[bf16, 4], O: gl[bf16, 4], D: const = 64, CAUSAL: const = 0):
    """q, k, v, o: (B, H, N, D) with N a multiple of 64. Grid: (B, H, N / 64).

    Each block takes 64 query rows, 16 per warp, and streams K and V through shared memory 64 rows at a time.
    With CAUSAL, query i sees keys j <= i: blocks past the diagonal are skipped and the diagonal one is masked.
    """
    static_assert(D in (64, 128), f"head dim D must be 64 or 128, got {D}")
    b, h, blk = block_idx()
    q_tile = blk * 4 + warp_id()                           # this warp's 16 query rows, in tiles of 16
    q = load(Q, (b, h, q_tile, 0), rt[bf16, 16, D])
    m, l, o = neg_infty(rv[f32, 16]), zeros(rv[f32, 16]), zeros(rt[f32, 16, D])
    for j in range(blk + 1 if CAUSAL else cdiv(K.shape[2], 64)):
        k_s, v_s = load(K, (b, h, j, 0), st[bf16, 64, D]), load(V, (b, h, j, 0), st[bf16, 64, D])
        s = mma_ABt(q, load(k_s), zeros(rt[f32, 16, 64])) * (D**-0.5 * LOG2E)   # scores, in log2 units
        if CAUSAL:
            s = tril(s, q_tile * 16 - j * 64, -float("inf"))  # key j*64+c is visible to query q_tile*16+r if c <= r + diag
        m_new = max(m, row_max(s))
        p = exp2(sub_row(s, m_new))
        correction = exp2(m - m_new)
        l = l * correction + row_sum(p)
        o = mma_AB(p.to(bf16), load(v_s), mul_row(o, correction))
        m = m_new
    store(O, div_row(o, l).to(bf16), (b, h, q_tile, 0))
