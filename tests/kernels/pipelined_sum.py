"""A small kernel whose loop trip count is a run-time argument: the pipelining tests run it 0, 1, 2, ... times."""

import tkc
from tkc.lang import *  # noqa: F403


@tkc.kernel(warps=4, min_target="sm_80")
def column_block_sum(X: gl[bf16, 2], Out: gl[f32, 2], n: int):
    """Out (64×64) = Σ over j < n of the j-th 64×64 block of rows of X, each warp summing 16 rows of it."""
    acc = zeros(rt[f32, 16, 64])
    for j in range(n):
        block = load(X, (j, 0), st[bf16, 64, 64])
        acc = acc + load(block, (warp_id(), 0), rt[bf16, 16, 64]).to(f32)
    store(Out, acc, (warp_id(), 0))
