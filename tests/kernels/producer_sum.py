"""A small warp-specialized kernel for the specialize-warps tests: a producer warpgroup streams 64×64 blocks of X
through a TMA ring while the four consumer warps sum them (ldmatrix reads, no wgmma), then swap their rows through
shared memory (a consumer-only barrier) before storing."""

import tkc
from tkc.lang import *  # noqa: F403


@tkc.kernel(warps=4, stages="STAGES", producer=1, min_target="sm_90a")
def producer_sum(X: gl[bf16, 2], Out: gl[f32, 2], n: int, STAGES: const = 3):
    """Out (64×64) = Σ over j < n of the j-th 64×64 block of rows of X; warp w stores the rows warp 3-w summed."""
    acc = zeros(rt[f32, 16, 64])
    for j in range(n):
        block = load(X, (j, 0), st[bf16, 64, 64])
        acc = acc + load(block, (warp_id(), 0), rt[bf16, 16, 64]).to(f32)
    swap = store(empty(st[f32, 64, 64]), acc, (3 - warp_id(), 0))
    store(Out, load(swap, (warp_id(), 0), rt[f32, 16, 64]), (warp_id(), 0))
