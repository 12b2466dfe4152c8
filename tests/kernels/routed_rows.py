"""A mixture of experts' permute and combine by row numbers (rows_at): rows gathered from where a routing table
says, and added into the rows another names, several entries into one row summing."""

import tkc
from tkc.lang import *  # noqa: F403


@tkc.kernel(warps=4, min_target="sm_80")
def routed_rows(X: gl[bf16, 2], Src: gl[i64, 1], Dst: gl[i32, 1], Y: gl[f32, 2], Z: gl[bf16, 2]):
    """Each warp's 16 entries e of Src / Dst: row Src[e] of X, doubled, added into row Dst[e] of Y (the combine)
    and stored into row e of Z (the permute), 64 columns at a time. Entries past Src's end, or numbers outside X's
    or Y's rows, read zeros and write nothing."""
    e = 16 * (block_idx()[0] * 4 + warp_id())
    for j in range(cdiv(X.shape[1], 64)):
        picked = load(X, (rows_at(Src, e), j), rt[f32, 16, 64])
        atomic_add(Y, picked * 2.0, (rows_at(Dst, e), j))
        store(Z, picked, (rows(e), j))
