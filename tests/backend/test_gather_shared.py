"""Loads into shared tiles whose rows an index tensor names (`rows_at` in a global → shared load): the interpreter
against numpy, the lowered PTX (simulated per thread: cp.async landing only at its wait) against the interpreter, in
a loop the pipeline turns into a cp.async ring (sm_80's mma.sync and sm_90a's wgmma alike; never TMA), outside
loops, and through the element-by-element path of a tensor that is not 4-byte aligned; and the oracle failing where
the lowering reads the wrong rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_
from reference import gathered_rows, random_bf16, rel_err, row_numbers

import tkc
from tkc.backend import addressing
from tkc.backend.ptxas import assemble, find_ptxas
from tkc.backend.simulator import simulate
from tkc.compiler import compile_kernels, lower_kernel, tensor_alignment
from tkc.errors import TkcError
from tkc.lang import (bf16, block_idx, cdiv, const, f32, gl, i32, i64, load, mma_AB, rows_at, rt, st, store, warp_id,
                      zeros)

ROWS = 100  # rows of the gathered table


@tkc.kernel(warps=4, stages="STAGES")
def gathered_gemm(X: gl[bf16, 2], P: gl["PT", 1], W: gl[bf16, 2], O: gl[f32, 2], PT: const = i32,
                  BK: const = 32, STAGES: const = 3):
    """O's 64-row tile b = rows P[64·b ..] of X times W: the rows of X gathered into shared memory a BK-column slice
    at a time (cp.async, pipelined), each warp's 16 rows of it an mma's A operand."""
    b = block_idx()[0]
    acc = zeros(rt[f32, 16, 64])
    for k in range(cdiv(X.shape[1], BK)):
        x = load(X, (rows_at(P, 64 * b), k), st[bf16, 64, BK])
        w = load(W, (k, 0), st[bf16, BK, 64])
        acc = mma_AB(load(x, (warp_id(), 0), rt[bf16, 16, BK]), load(w), acc)
    store(O, acc, (4 * b + warp_id(), 0))


@tkc.kernel(warps=4, stages=3, mixed_ring="MIXED", min_target="sm_90a")
def gathered_gemm_wgmma(X: gl[bf16, 2], P: gl["PT", 1], W: gl[bf16, 2], O: gl[f32, 2], PT: const = i32,
                        BK: const = 32, MIXED: const = 1):
    """As gathered_gemm on Hopper's wgmma: the warpgroup multiplies the gathered shared tile by W's from shared
    memory (the ring keeps a stage spare for the wgmma still reading); MIXED=0: a cp.async ring for both loads."""
    b = block_idx()[0]
    acc = zeros(rt[f32, 16, 64])
    for k in range(cdiv(X.shape[1], BK)):
        acc = mma_AB(load(X, (rows_at(P, 64 * b), k), st[bf16, 64, BK]), load(W, (k, 0), st[bf16, BK, 64]), acc)
    store(O, acc, (4 * b + warp_id(), 0))


@tkc.kernel(warps=2)
def gathered_rows_once(X: gl["DT", 2], P: gl["PT", 1], O: gl[f32, 2], PT: const = i64, DT: const = f32):
    """O's tile b: rows P[32·b ..] of X, through a shared tile (one synchronous copy, no loop)."""
    b = block_idx()[0]
    x = load(X, (rows_at(P, 32 * b), 0), st[DT, 32, 16])
    store(O, load(x, conflicts=2), (b, 0))


def run_both(kernel, args, grid, constants, target):
    aligns = {p.name: tensor_alignment(a) for p, a in zip(kernel.runtime_params, args) if p.kind == "tensor"}
    module = lower_kernel(kernel, target, constants, aligns=aligns)
    interp = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    sim = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    kernel.interpret(*interp, grid=grid, **constants)
    simulate(module, kernel.name, sim, grid)
    return interp, sim


def gemm_case(seed: int, k: int, count: int, dtype: type = np.int32):
    rng = np.random.default_rng(seed)
    x, w = random_bf16(rng, ROWS, k), random_bf16(rng, k, 64)
    positions = row_numbers(rng, count, dtype, ROWS)
    out = np.full((128, 64), np.nan, dtype=np.float32)
    expected = gathered_rows(x.astype(np.float64), positions, 128) @ w.astype(np.float64)
    return [x, positions, w, out], expected


@pytest.mark.parametrize("kernel, target, constants", [
    (gathered_gemm, "sm_80", {}), (gathered_gemm, "sm_90a", {}), (gathered_gemm_wgmma, "sm_90a", {"MIXED": 0}),
    (gathered_gemm_wgmma, "sm_90a", {"MIXED": 1})])
@pytest.mark.parametrize("index_type", ["i32", "i64"])
def test_gathered_gemm(kernel, target: str, constants: dict, index_type: str) -> None:
    """Five steps of K through a 3-stage ring (cp.async, or on sm_90a with mixed_ring=1 W by TMA and the gathered rows
    by cp.async on the same barriers); the second tile runs past the index's end (its last rows zeros)."""
    args, expected = gemm_case(1, 160, 110, np.int64 if index_type == "i64" else np.int32)
    interp, sim = run_both(kernel, args, 2, {"PT": i64 if index_type == "i64" else i32, **constants}, target)
    assert rel_err(interp[3], expected) < 1e-5
    np.testing.assert_allclose(sim[3], interp[3], rtol=1e-5, atol=1e-5)


def test_the_gathered_loop_mixes_tma_and_cp_async_on_sm90a() -> None:
    """On sm_90a with mixed_ring=1 a loop whose loads gather rows keeps TMA for the others: one ring whose barriers count W's TMA bytes
    and every thread's arrival once its cp.async chunks of X's gathered rows land (TMA boxes cannot gather rows);
    with no load TMA can make (W unaligned), or without mixed_ring=1, a cp.async ring as on sm_80."""
    plain = compile_kernels([gathered_gemm_wgmma], "sm_90a", {"MIXED": 0})
    assert "cp.async.cg.shared.global" in plain and "cp.async.bulk" not in plain and "mbarrier" not in plain
    ptx = compile_kernels([gathered_gemm_wgmma], "sm_90a", {})
    assert "cp.async.cg.shared.global" in ptx and "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx
    assert "cp.async.mbarrier.arrive.noinc.shared::cta.b64" in ptx and "cp.async.wait_group" not in ptx
    assert "mbarrier.init.shared::cta.b64 [%r" in ptx and ", 129;" in ptx  # 1 + the 128 threads that copy
    module = lower_kernel(gathered_gemm_wgmma, "sm_90a", {}, pipeline="canonicalize,cse,insert-tma-pipeline,"
                          "insert-async-pipeline", aligns={"W": 2})
    text = str(module)
    assert "tile.stage_copy" not in text and "tile.copy_async" in text


@pytest.mark.parametrize("fault", ["no arrival", "the next stage"])
def test_a_mixed_ring_without_its_arrivals_or_stages_is_caught(monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """A mixed ring whose copies never tell the barrier (their phase would never complete: the simulation reports
    the hang), or that copies into the stage of the step after its own (a stage written under the wgmma reading it,
    or wrong rows multiplied): caught."""
    from tkc.backend import lower_tma, ptx
    from tkc.backend.simulator import SimulationError

    args, _ = gemm_case(5, 160, 110)
    if fault == "no arrival":
        emit = lower_tma.KernelLowering.emit

        def emit_but_arrivals(lw, op):
            if isinstance(op, ptx.MbarrierOp) and op.kind.data == "cp_async_arrive":
                return op
            return emit(lw, op)
        monkeypatch.setattr(lower_tma.KernelLowering, "emit", emit_but_arrivals)
        with pytest.raises(SimulationError):
            run_both(gathered_gemm_wgmma, args, 2, {}, "sm_90a")
        return
    stage_address = __import__("tkc.backend.lower_copies", fromlist=["_stage_address"])._stage_address
    monkeypatch.setattr("tkc.backend.lower_copies._stage_address", lambda lw, ring, stage: stage_address(
        lw, ring, lower_tma.Imm(int(stage.value) + 1) if isinstance(stage, lower_tma.Imm)
        else lw.op("rem.u32", "b32", lw.op("add.u32", "b32", stage, lower_tma.Imm(1), n=1),
                   lower_tma.Imm(ring.type.stages.data), n=1)))
    try:  # (the simulation may stop first: a stage written under a wgmma still reading it)
        interp, sim = run_both(gathered_gemm_wgmma, args, 2, {}, "sm_90a")
    except SimulationError:
        return
    assert not np.allclose(sim[3], interp[3], rtol=1e-3, atol=1e-3)


@settings(max_examples=10, deadline=None)
@given(seed=st_.integers(0, 2**31), k=st_.sampled_from([32, 72, 96]), count=st_.integers(0, 140),
       stages=st_.sampled_from([1, 2, 3]))
def test_gathered_gemm_any_positions(seed: int, k: int, count: int, stages: int) -> None:
    """Random positions, K not a multiple of the slice (the last columns zeros), any pipeline depth."""
    args, expected = gemm_case(seed, k, count)
    interp, sim = run_both(gathered_gemm, args, 2, {"STAGES": stages}, "sm_80")
    assert rel_err(interp[3], expected) < 1e-5 or np.abs(expected).max() == 0
    np.testing.assert_allclose(sim[3], interp[3], rtol=1e-5, atol=1e-5)


@settings(max_examples=6, deadline=None)
@given(seed=st_.integers(0, 2**31), k=st_.sampled_from([32, 72, 96, 160]), count=st_.integers(0, 140))
def test_mixed_ring_any_positions(seed: int, k: int, count: int) -> None:
    """The mixed ring (W by TMA, X's gathered rows by cp.async on the same barriers) at random positions, K not a
    multiple of the slice, fewer steps than stages: the simulation against the interpreter."""
    args, expected = gemm_case(seed, k, count)
    interp, sim = run_both(gathered_gemm_wgmma, args, 2, {}, "sm_90a")
    assert rel_err(interp[3], expected) < 1e-5 or np.abs(expected).max() == 0
    np.testing.assert_allclose(sim[3], interp[3], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype, cols", [("f32", 16), ("f32", 6), ("f32", 3), ("bf16", 5)])
def test_gathered_rows_once(target: str, dtype: str, cols: int) -> None:
    """A copy outside a loop, the tile wider than the tensor: 16-byte chunks (f32 rows of 64 bytes), 8-byte ones (24-byte
    rows), 4-byte ones (12-byte rows), and single elements where bf16 rows of 10 bytes are not 4-byte aligned
    (loaded and stored one by one)."""
    rng = np.random.default_rng(cols)
    table = rng.standard_normal((ROWS, cols)).astype(np.float32)
    if dtype == "bf16":
        table = random_bf16(rng, ROWS, cols)
    positions = row_numbers(rng, 60, np.int64, ROWS)
    out = np.full((64, 16), np.nan, dtype=np.float32)
    interp, sim = run_both(gathered_rows_once, [table, positions, out], 2, {"DT": bf16 if dtype == "bf16" else f32},
                           target)
    expected = np.zeros((64, 16), dtype=np.float32)
    expected[:, :cols] = gathered_rows(table.astype(np.float32), positions, 64)
    np.testing.assert_array_equal(interp[2], expected)
    np.testing.assert_array_equal(sim[2], interp[2])


def test_reading_the_wrong_rows_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lowering that reads each chunk's row number one entry of the index too far: the simulation differs from
    the interpreter (which it matches without the fault)."""
    from tkc.backend import lower_copies, lower_memory  # (imported first: a first import under the patch would keep it)

    args, _ = gemm_case(4, 64, 128)
    pointers = addressing.gathered_row_pointers
    for module in (addressing, lower_copies, lower_memory):
        monkeypatch.setattr(module, "gathered_row_pointers",
                            lambda lw, g, index, row0, rows, ptr, end=None: pointers(lw, g, index, row0,
                                                                                     [r + 1 for r in rows], ptr, end))
    interp, sim = run_both(gathered_gemm, args, 2, {}, "sm_80")
    assert not np.allclose(sim[3], interp[3], rtol=1e-3, atol=1e-3)


def test_multicast_gathers_are_refused() -> None:
    @tkc.kernel(warps=4, cluster=2)
    def multicast_gather(X: gl[bf16, 2], P: gl[i32, 1], O: gl[bf16, 2]):
        x = load(X, (rows_at(P, 0), 0), st[bf16, 64, 64], multicast=True)
        store(O, x, (0, 0))

    with pytest.raises(TkcError, match="rows_at"):
        compile_kernels([multicast_gather], "sm_90a", {})


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed (pip install nvidia-cuda-nvcc==13.0.88)")
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_ptxas_accepts_shared_gathers(target: str) -> None:
    kernels = [(gathered_gemm, {}), (gathered_gemm, {"PT": i64}), (gathered_rows_once, {})]
    if target == "sm_90a":
        kernels.append((gathered_gemm_wgmma, {}))
    for kernel, constants in kernels:
        report = assemble(compile_kernels([kernel], target, constants), target)[kernel.name]
        assert report.spill_stores == 0
