"""Attention forward for the specialize-warps tests: each block takes TILES query blocks in turn (a tile loop around
the key loop). insert-tma-pipeline gives the queries a ring of their own on the tile loop, so with a producer
warpgroup the next tile's queries load while this tile's keys stream."""

import tkc
from tkc.lang import *  # noqa: F403


@tkc.kernel(warps="WARPS", stages="STAGES", defer="DEFER", producer="PRODUCER", min_target="sm_90a")
def tiled_attention(Q: gl[bf16, 4], K: gl[bf16, 4], V: gl[bf16, 4], O: gl[bf16, 4], scale: float,
                    D: const = 128, KEYS: const = 128, WARPS: const = 8, STAGES: const = 2, DEFER: const = 0,
                    PRODUCER: const = 0, TILES: const = 2, Q_REGS: const = 0):
    """Not causal. Grid: (cdiv(Nq, 16·WARPS·TILES), H, B); each block takes TILES query blocks in turn."""
    blk0, h, b = block_idx()
    BLOCK_ROWS = 16 * WARPS
    for t in runtime_range(TILES):
        blk = blk0 * TILES + t
        q_block = load(Q, (b, h, blk, 0), st[bf16, BLOCK_ROWS, D])
        if Q_REGS:  # read once, at the tile's start: a one-stage ring then prefetches the next tile's queries
            q = load(q_block, (warp_id(), 0), rt[bf16, 16, D])
        else:
            q = load(q_block, (warpgroup_id(), 0), st[bf16, 64, D])
        q_tile = blk * WARPS + warp_id()
        scale_log2 = scale * LOG2E
        m, l, o = neg_infty(rv[f32, 16]), zeros(rv[f32, 16]), zeros(rt[f32, 16, D])
        key_blocks = cdiv(K.shape[2], KEYS)
        for j in range(key_blocks):
            k_s, v_s = load(K, (b, h, j, 0), st[bf16, KEYS, D]), load(V, (b, h, j, 0), st[bf16, KEYS, D])
            s = mma_ABt(q, k_s, zeros(rt[f32, 16, KEYS]))
            if j == key_blocks - 1:
                s = keep_cols(s, K.shape[2] - j * KEYS)
            m_new = max(m, row_max(s))
            correction = exp2((m - m_new) * scale_log2)
            l, o, m = l * correction, mul_row(o, correction), m_new
            p = exp2(sub_row(s * scale_log2, m * scale_log2))
            l = l + row_sum(p)
            o = mma_AB(p.to(bf16), v_s, o)
        store(O, div_row(o, l).to(bf16), (b, h, q_tile, 0))
