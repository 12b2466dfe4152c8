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
from tkc.lang import block_idx, cluster_rank, cluster_sync, const, empty, gl, load, rt, st, store, warp_id

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
    interp, sim = run_both(exchange, [x, y], (blocks,), constants, target="sm_90a", order="shuffled")
    want = np.empty_like(x)
    for b in range(blocks):
        rank = b % cluster
        for w in range(warps):
            peer = b - rank + (rank + shift + w) % cluster
            rows = slice((b * warps + w) * 16, (b * warps + w + 1) * 16)
            want[rows] = x[(peer * warps + w) * 16:(peer * warps + w + 1) * 16]
    np.testing.assert_array_equal(interp[1], want)
    np.testing.assert_array_equal(sim[1], want)
