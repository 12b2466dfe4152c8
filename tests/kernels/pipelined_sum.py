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


@tkc.kernel(warps=4, min_target="sm_80")
def paged_block_sum(X: gl[bf16, 2], Pages: gl[i32, 1], Out: gl[f32, 2], n: int, WRITES_PAGES: const = 0):
    """Out (64×64) = Σ over j < n of X's 64-row block Pages[j] (a page table read in the loop, whose entries the
    pipeline reads again for the steps it loads ahead); WRITES_PAGES=1 also writes the table (then its reads are
    not the pipeline's to repeat)."""
    acc = zeros(rt[f32, 16, 64])
    for j in range(n):
        block = load(X, (Pages[j], 0), st[bf16, 64, 64])
        acc = acc + load(block, (warp_id(), 0), rt[bf16, 16, 64]).to(f32)
    store(Out, acc, (warp_id(), 0))
    if WRITES_PAGES:  # (an atomic on the table's entry past its n, as a counter)
        if arrive_last(Pages, n, 1):
            store(Out, acc, (warp_id(), 0))
