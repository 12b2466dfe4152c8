"""Distributed shared memory: `load(s, index, spec, rank=r)` reads block r's copy of a shared tile after a
`cluster_sync()`. The interpreter (the grid in lockstep, gathering along the block axis) and the per-thread
simulation of the PTX (mapa + ld.shared::cluster into the peer's bytes) agree with numpy on random cluster sizes,
tile shapes, dtypes and per-warp ranks."""

from __future__ import annotations

import numpy as np
import pytest
from backend.test_simulate import run_both
from hypothesis import given, settings
from hypothesis import strategies as st_
from reference import BF16

import tkc
from tkc import lang
from tkc.lang import block_idx, cluster_rank, cluster_sync, const, empty, gl, load, rt, st, store, warp_id, zeros

pytestmark = pytest.mark.filterwarnings("ignore:.*bank conflict")  # some shapes' rows; not what this tests


@tkc.kernel(warps="WARPS", cluster="CLUSTER", min_target="sm_90a")
def exchange(X: gl["DT", 2], Y: gl["DT", 2], WARPS: const = 4, CLUSTER: const = 2, SHIFT: const = 1,
             COLS: const = 32, DT: const = lang.f32):
    """Each block stores its 16·WARPS × COLS tile of X in shared memory; after the cluster sync warp w reads its
    16 rows of the tile of the block (rank + SHIFT + w) % CLUSTER of its cluster into Y."""
    b = block_idx()[0]
    mine = store(empty(st[DT, 16 * WARPS, COLS]), load(X, (b * WARPS + warp_id(), 0), rt[DT, 16, COLS]),
                 (warp_id(), 0))
    cluster_sync()
    peer = (cluster_rank() + SHIFT + warp_id()) % CLUSTER
    store(Y, load(mine, (warp_id(), 0), rt[DT, 16, COLS], rank=peer), (b * WARPS + warp_id(), 0))


@settings(max_examples=12, deadline=None)
@given(cluster=st_.integers(1, 4), clusters=st_.integers(1, 2), warps=st_.sampled_from([1, 2, 4]),
       cols=st_.sampled_from([16, 32, 64]), shift=st_.integers(0, 3), dtype=st_.sampled_from(["f32", "bf16"]),
       seed=st_.integers(0, 2**16))
def test_blocks_read_each_others_tiles(cluster: int, clusters: int, warps: int, cols: int, shift: int, dtype: str,
                                       seed: int) -> None:
    blocks = cluster * clusters
    numpy_type = np.float32 if dtype == "f32" else BF16
    x = np.random.default_rng(seed).standard_normal((blocks * 16 * warps, cols)).astype(numpy_type)
    y = np.full_like(x, np.nan)
    constants = {"WARPS": warps, "CLUSTER": cluster, "SHIFT": shift, "COLS": cols, "DT": getattr(lang, dtype)}
    interp, sim = run_both(exchange, [x, y], (blocks,), constants, target="sm_90a", order="ahead" if seed % 2 else
                           "shuffled")
    want = np.empty_like(x)
    for b in range(blocks):
        rank = b % cluster
        for w in range(warps):
            peer = b - rank + (rank + shift + w) % cluster
            rows = slice((b * warps + w) * 16, (b * warps + w + 1) * 16)
            want[rows] = x[(peer * warps + w) * 16:(peer * warps + w + 1) * 16]
    np.testing.assert_array_equal(interp[1], want)
    np.testing.assert_array_equal(sim[1], want)


@tkc.kernel(warps=2, cluster=2, min_target="sm_90a")
def exchange_in_a_loop(X: gl[lang.f32, 3], Y: gl[lang.f32, 2]):
    """Step i: each block stores X[i]'s rows into its shared tile, and after the sync adds up its peer's."""
    b = block_idx()[0]
    s = empty(st[lang.f32, 32, 32])
    total = zeros(rt[lang.f32, 16, 32])
    for i in range(X.shape[0]):
        s = store(s, load(X, (i, b * 2 + warp_id(), 0), rt[lang.f32, 16, 32]), (warp_id(), 0))
        cluster_sync()
        total = total + load(s, (warp_id(), 0), rt[lang.f32, 16, 32], rank=(cluster_rank() + 1) % 2)
        cluster_sync()  # no block stores step i + 1 before its peer has read step i (without it: an error)
    store(Y, total, (b * 2 + warp_id(), 0))


@pytest.mark.parametrize("second_sync", [1, 0])
def test_a_block_running_ahead_of_its_peer(second_sync: int) -> None:
    """The mutation: the loop's second cluster barrier removed from the PTX (the frontend refuses the kernel
    without its cluster_sync()), so a block stores step i + 1 into the tile its peer is about to read. The lockstep
    interpreter cannot see it; the simulator's order "ahead" (a block runs as far as it can) does."""
    from tkc.backend import ptx
    from tkc.backend.simulator import simulate
    from tkc.compiler import lower_kernel

    x = np.random.default_rng(0).standard_normal((6, 64, 32)).astype(np.float32)
    want = x.sum(0).reshape(2, 32, 32)[::-1].reshape(64, 32)  # each block the sum of its peer's rows
    interp = np.full((64, 32), np.nan, np.float32)
    exchange_in_a_loop.interpret(x, interp, grid=(2,))
    np.testing.assert_allclose(interp, want, rtol=1e-5, atol=1e-5)
    module = lower_kernel(exchange_in_a_loop, "sm_90a", {}, aligns={"X": 16, "Y": 16})
    kernel = next(op for op in module.walk() if isinstance(op, ptx.KernelOp))
    barriers = [op for op in kernel.body.block.ops if isinstance(op, ptx.ClusterBarrierOp)]
    assert len(barriers) == 6  # the loop's two, then the exit's
    if not second_sync:
        for op in barriers[2:4]:
            op.detach()
            op.erase()
    sim = np.full((64, 32), np.nan, np.float32)
    simulate(module, "exchange_in_a_loop", [x, sim], (2,), order="ahead")
    assert (np.abs(sim - want).max() < 1e-4) == bool(second_sync)
