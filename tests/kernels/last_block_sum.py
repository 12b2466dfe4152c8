"""A sum split over blocks that one launch finishes: each block leaves its part, and the block that arrives last at
the counter (arrive_last) adds all the parts up, where a split-K GEMM would launch a second kernel."""

import tkc
from tkc.lang import *  # noqa: F403


@tkc.kernel(warps=2, min_target="sm_80")
def last_block_sum(X: gl[f32, 2], Parts: gl[f32, 2], Out: gl[f32, 2], Counter: gl[i32, 1], N: const = 64):
    """Out (32×N) = Σ over the blocks b of X's rows 32b .. 32b + 31 (each warp 16 of them): block b leaves its rows in
    Parts, and the last block of the grid to arrive at Counter[0] (zero before the first launch, and again after
    each) sums Parts into Out."""
    b = block_idx()[0]
    store(Parts, load(X, (2 * b + warp_id(), 0), rt[f32, 16, N]), (2 * b + warp_id(), 0))
    if arrive_last(Counter, 0, num_blocks()[0]):
        total = zeros(rt[f32, 16, N])
        for part in runtime_range(num_blocks()[0]):
            total = total + load(Parts, (2 * part + warp_id(), 0), rt[f32, 16, N])
        store(Out, total, (warp_id(), 0))
