"""A kernel for atomic-add.test: every warp adds its 16×64 f32 tile of X into tile warp % 2 of Y."""

import tkc
from tkc.lang import atomic_add, f32, gl, load, rt, warp_id


@tkc.kernel(warps=4, min_target="sm_80")
def tiles_summed(X: gl[f32, 2], Y: gl[f32, 2]):
    atomic_add(Y, load(X, (warp_id(), 0), rt[f32, 16, 64]), (warp_id() % 2, 0))
