"""A persistent attention forward for the specialize-warps and defer-wgmma tests: each block walks (query block, head,
batch) tiles; per tile the consumer warps load the queries into shared memory themselves (a plain load inside the
consumer role), then stream K and V through the TMA ring, which the producer warpgroup keeps filling across tiles."""

import tkc
from tkc.lang import *  # noqa: F403


@tkc.kernel(warps=8, stages=3, defer="DEFER", producer="PRODUCER", min_target="sm_90a")
def persistent_attention(Q: gl[bf16, 4], K: gl[bf16, 4], V: gl[bf16, 4], O: gl[bf16, 4], scale: float,
                         D: const = 64, KEYS: const = 64, DEFER: const = 0, PRODUCER: const = 0):
    """Not causal; 128 query rows per tile (64 per warpgroup, 16 per warp). Grid: (blocks,)."""
    n_blk = cdiv(Q.shape[2], 128)
    heads = Q.shape[1]
    for tile in range(block_idx()[0], n_blk * heads * Q.shape[0], num_blocks()[0]):
        blk, h, b = tile % n_blk, tile // n_blk % heads, tile // n_blk // heads
        q = load(load(Q, (b, h, blk, 0), st[bf16, 128, D]), (warpgroup_id(), 0), st[bf16, 64, D])
        m, l, o = neg_infty(rv[f32, 16]), zeros(rv[f32, 16]), zeros(rt[f32, 16, D])
        key_blocks = cdiv(K.shape[2], KEYS)
        for j in range(key_blocks):
            k_s, v_s = load(K, (b, h, j, 0), st[bf16, KEYS, D]), load(V, (b, h, j, 0), st[bf16, KEYS, D])
            s = mma_ABt(q, k_s, zeros(rt[f32, 16, KEYS]))
            if j == key_blocks - 1:
                s = keep_cols(s, K.shape[2] - j * KEYS)
            m_new = max(m, row_max(s))
            correction = exp2((m - m_new) * scale * LOG2E)
            l, o, m = l * correction, mul_row(o, correction), m_new
            p = exp2(sub_row(s * scale * LOG2E, m * scale * LOG2E))
            l = l + row_sum(p)
            o = mma_AB(p.to(bf16), v_s, o)
        store(O, div_row(o, l).to(bf16), (b, h, blk * 8 + warp_id(), 0))
