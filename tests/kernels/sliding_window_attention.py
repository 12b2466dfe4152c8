"""Causal sliding-window attention: query i sees keys j with i - WINDOW < j <= i. O = softmax(Q·Kᵀ/√D)·V."""

import tkc
from tkc.lang import *  # noqa: F403


@tkc.kernel(warps=4, min_target="sm_80")
def sliding_window_attention(Q: gl[bf16, 4], K: gl[bf16, 4], V: gl[bf16, 4], O: gl[bf16, 4],
                             D: const = 64, WINDOW: const = 128):
    """q, k, v, o: (B, H, N, D), N a multiple of 64. Grid: (B, H, N / 64).

    Block `blk` holds queries 64·blk .. 64·blk+63 (16 per warp). Their windows reach back to key block
    blk - WINDOW/64, so the loop runs over key blocks max(blk - WINDOW/64, 0) .. blk only. It walks them from the
    diagonal down: the diagonal block has a visible key for every query (itself), so the running max is finite
    before a block can mask out a whole row (the last row of the first block of the window sees none of it).
    """
    static_assert(D in (64, 128), f"head dim D must be 64 or 128, got {D}")
    static_assert(WINDOW > 0 and WINDOW % 64 == 0, f"WINDOW must be a positive multiple of 64, got {WINDOW}")
    b, h, blk = block_idx()
    q_tile = blk * 4 + warp_id()
    q = load(Q, (b, h, q_tile, 0), rt[bf16, 16, D])
    m, l, o = neg_infty(rv[f32, 16]), zeros(rv[f32, 16]), zeros(rt[f32, 16, D])
    first = max(blk - WINDOW // 64, 0)
    for i in range(first, blk + 1):
        j = blk + first - i                                   # blk, blk-1, ..., first
        k_s, v_s = load(K, (b, h, j, 0), st[bf16, 64, D]), load(V, (b, h, j, 0), st[bf16, 64, D])
        s = mma_ABt(q, load(k_s), zeros(rt[f32, 16, 64])) * (D**-0.5 * LOG2E)
        diag = q_tile * 16 - j * 64                           # key j*64+c vs query q_tile*16+r
        s = tril(s, diag, -float("inf"))                      # causal: c <= r + diag
        s = triu(s, diag - WINDOW + 1, -float("inf"))         # window: c > r + diag - WINDOW
        m_new = max(m, row_max(s))
        p = exp2(sub_row(s, m_new))
        correction = exp2(m - m_new)
        l = l * correction + row_sum(p)
        o = mma_AB(p.to(bf16), load(v_s), mul_row(o, correction))
        m = m_new
    store(O, div_row(o, l).to(bf16), (b, h, q_tile, 0))
