"""insert-async-pipeline: correct when the loop runs 0, 1, fewer times than there are stages, or many times, for
2 to 4 stages, with a constant or a run-time step (a persistent kernel's loop), in the tile interpreter (copies land
only at waits) and in the PTX simulation."""

from __future__ import annotations

import numpy as np
import pytest
from reference import random_bf16

from kernels.pipelined_sum import column_block_sum, paged_block_sum, strided_block_sum
from tkc.backend import ptx
from tkc.backend.simulator import simulate
from tkc.compiler import default_pipeline, lower_kernel
from tkc.ir import async_ops as a

from .helpers import before_and_after


def _expected(x: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((64, 64), dtype=np.float64)
    for j in range(n):
        out += x[64 * j:64 * (j + 1)].astype(np.float64)
    return out


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("trips", [0, 1, 2, 3, 6])
def test_pipeline_any_trip_count(stages: int, trips: int) -> None:
    rng = np.random.default_rng(stages * 10 + trips)
    x = random_bf16(rng, 64 * 6, 64)
    out = np.full((64, 64), np.nan, dtype=np.float32)
    before, after, module = before_and_after(column_block_sum, f"insert-async-pipeline{{stages={stages}}}",
                                             [x, out, trips], (1,))
    assert any(isinstance(op, a.RingAllocOp) for op in module.walk())
    np.testing.assert_allclose(before[1], _expected(x, trips), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(after[1], before[1])


@pytest.mark.parametrize("stages, trips", [(2, 0), (3, 1), (3, 2), (4, 5)])
def test_pipeline_simulated(stages: int, trips: int) -> None:
    rng = np.random.default_rng(stages + trips)
    x = random_bf16(rng, 64 * 5, 64)
    out = np.full((64, 64), np.nan, dtype=np.float32)
    module = lower_kernel(column_block_sum, "sm_80", pipeline=default_pipeline("sm_80", stages))
    simulate(module, "column_block_sum", [x, out, trips], (1,), order="shuffled")
    np.testing.assert_allclose(out, _expected(x, trips), rtol=1e-5, atol=1e-5)


def test_wait_is_one_less_than_stages() -> None:
    _, _, module = before_and_after(column_block_sum, "insert-async-pipeline{stages=4}",
                                    [random_bf16(np.random.default_rng(0), 64, 64), np.zeros((64, 64), np.float32), 1], (1,))
    waits = [op.pending.value.data for op in module.walk() if isinstance(op, a.WaitGroupOp)]
    commits = [op for op in module.walk() if isinstance(op, a.CommitGroupOp)]
    assert waits == [2] and len(commits) == 4  # 3 in the prologue, 1 per iteration


def _expected_strided(x: np.ndarray, n: int, grid: int) -> np.ndarray:
    out = np.zeros((64 * grid, 64), dtype=np.float64)
    for j in range(n):
        out[64 * (j % grid):64 * (j % grid + 1)] += x[64 * j:64 * (j + 1)].astype(np.float64)
    return out


@pytest.mark.parametrize("stages, trips", [(2, 0), (2, 2), (3, 4), (3, 11), (4, 7), (4, 20)])
def test_pipeline_with_a_run_time_step(stages: int, trips: int) -> None:
    """Three blocks striding over the row blocks (each runs trips/3 steps, some one more): the ring and its
    prologue count steps of the run-time stride, interpreted and simulated."""
    rng = np.random.default_rng(stages * 100 + trips)
    x = random_bf16(rng, 64 * 20, 64)
    out = np.full((64 * 3, 64), np.nan, dtype=np.float32)
    before, after, module = before_and_after(strided_block_sum, f"insert-async-pipeline{{stages={stages}}}",
                                             [x, out, trips], (3,))
    assert any(isinstance(op, a.RingAllocOp) for op in module.walk())
    np.testing.assert_allclose(before[1], _expected_strided(x, trips, 3), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(after[1], before[1])
    module = lower_kernel(strided_block_sum, "sm_80", pipeline=default_pipeline("sm_80", stages))
    simulate(module, "strided_block_sum", [x, out, trips], (3,), order="shuffled")
    np.testing.assert_allclose(out, _expected_strided(x, trips, 3), rtol=1e-5, atol=1e-5)


def _expected_paged(x: np.ndarray, pages: np.ndarray, n: int) -> np.ndarray:
    return sum((x[64 * p:64 * (p + 1)].astype(np.float64) for p in pages[:n]), np.zeros((64, 64)))


@pytest.mark.parametrize("stages, trips", [(2, 0), (2, 3), (3, 1), (3, 5), (4, 2), (4, 7)])
def test_pipeline_reads_a_page_table_ahead(stages: int, trips: int) -> None:
    """A load whose block comes from a page table read in the loop (Pages[j], a tensor the kernel never writes) is
    pipelined, the table read again for the steps loaded ahead: interpreted before and after the pass, and
    simulated; a kernel that also writes the table keeps its loads synchronous (no ring), as correct."""
    rng = np.random.default_rng(stages * 10 + trips)
    x = random_bf16(rng, 64 * 9, 64)
    pages = rng.permutation(9)[:8].astype(np.int32)
    out = np.full((64, 64), np.nan, dtype=np.float32)
    for writes in (0, 1):
        before, after, module = before_and_after(paged_block_sum, f"insert-async-pipeline{{stages={stages}}}",
                                                 [x, pages, out, trips], (1,), {"WRITES_PAGES": writes})
        assert any(isinstance(op, a.RingAllocOp) for op in module.walk()) == (not writes and stages > 1)
        np.testing.assert_allclose(before[2], _expected_paged(x, pages, trips), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(after[2], before[2])
        np.testing.assert_array_equal(after[1], before[1])
    for target in ("sm_80", "sm_90a"):  # cp.async, or TMA (insert-tma-pipeline's indices are the same slice)
        module = lower_kernel(paged_block_sum, target, pipeline=default_pipeline(target, stages))
        assert any(isinstance(op, ptx.TmaLoadOp) for op in module.walk()) == (target == "sm_90a")
        sim_out = np.full((64, 64), np.nan, dtype=np.float32)
        simulate(module, "paged_block_sum", [x, pages, sim_out, trips], (1,), order="shuffled")
        np.testing.assert_allclose(sim_out, _expected_paged(x, pages, trips), rtol=1e-5, atol=1e-5)
