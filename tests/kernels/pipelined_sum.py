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


@tkc.kernel(warps=4, min_target="sm_80")
def strided_block_sum(X: gl[bf16, 2], Out: gl[f32, 2], n: int):
    """Block b's 64 rows of Out = Σ of X's 64-row blocks b, b + G, b + 2G, ... below n (G blocks): a persistent
    kernel's loop, whose step is known only at run time."""
    acc = zeros(rt[f32, 16, 64])
    for j in range(block_idx()[0], n, num_blocks()[0]):
        block = load(X, (j, 0), st[bf16, 64, 64])
        acc = acc + load(block, (warp_id(), 0), rt[bf16, 16, 64]).to(f32)
    store(Out, acc, (block_idx()[0] * 4 + warp_id(), 0))
