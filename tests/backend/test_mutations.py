"""The CPU oracles can fail: a pipeline missing one wait, a wrong swizzle XOR on one side, a wrong fragment index,
ldmatrix addresses out of step with the matrix order and a shared tile reloaded after it was overwritten each make
the answer wrong in the simulation (and, for the wait, already in the tile interpreter)."""

from __future__ import annotations

import numpy as np
import pytest
from reference import attention_ref, gemm_ref, poisoned, random_bf16, rel_err

import tkc
from kernels.pipelined_sum import column_block_sum
from tkc.backend import lower_memory, lowering, ptx
from tkc.backend.simulator import simulate
from tkc.compiler import Dumps, PassTimer, lower_kernel, parse_pipeline, run_passes
from tkc.frontend.kernel import build_module
from tkc.interpreter import run_function
from tkc.ir import async_ops as a
from tkc.ir import ops as t
from tkc.ir.types import SharedTileType
from tkc.kernels import attention_fwd, gemm_kernel
from tkc.lang import bf16, f32, gl, load, mma_AB, mma_ABt, rt, st, store, zeros

BACK_END = "assign-layouts,assign-swizzles,allocate-shared,insert-barriers,lower-to-ptx"


def _blocks_sum(x: np.ndarray, n: int) -> np.ndarray:
    return sum((x[64 * j:64 * (j + 1)].astype(np.float64) for j in range(n)), np.zeros((64, 64)))


def test_missing_wait_is_caught() -> None:
    rng = np.random.default_rng(0)
    x = random_bf16(rng, 64 * 4, 64)
    module = build_module([column_block_sum], "sm_80")
    run_passes(module, parse_pipeline("canonicalize,cse,insert-async-pipeline{stages=3}"), Dumps(), PassTimer())
    waits = [op for op in module.walk() if isinstance(op, a.WaitGroupOp)]
    assert len(waits) == 1
    waits[0].detach()
    waits[0].erase()
    # the tile interpreter sees stale (poisoned) stages
    out = np.zeros((64, 64), np.float32)
    run_function(module, "column_block_sum", [x, out, 4], (1,))
    assert rel_err(out, _blocks_sum(x, 4)) > 1e-2
    # and so does the simulation of the PTX
    run_passes(module, parse_pipeline(BACK_END), Dumps(), PassTimer())
    out = np.zeros((64, 64), np.float32)
    simulate(module, "column_block_sum", [x, out, 4], (1,))
    assert rel_err(out, _blocks_sum(x, 4)) > 1e-2


def test_pipeline_without_mutation_is_right() -> None:
    rng = np.random.default_rng(0)
    x = random_bf16(rng, 64 * 4, 64)
    module = lower_kernel(column_block_sum, "sm_80")
    out = np.zeros((64, 64), np.float32)
    simulate(module, "column_block_sum", [x, out, 4], (1,))
    assert rel_err(out, _blocks_sum(x, 4)) < 1e-5


def _wrong_xor(t_, row, col):
    from tkc.ir.types import element_bytes

    rows, cols = t_.shape
    e = element_bytes(t_.element_type)
    s = t_.swizzle or 0
    colbyte = col * e
    linear = (colbyte // s) * (rows * s) + row * s + colbyte % s
    return linear ^ ((((linear >> 7) + 1) & (s // 16 - 1)) << 4)  # off by one line


def test_wrong_swizzle_xor_on_the_reader_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = lower_memory._ldmatrix_addresses

    def mutated(*args):
        monkeypatch.setattr(lower_memory, "tile_offset", _wrong_xor)
        try:
            return original(*args)
        finally:
            monkeypatch.undo()

    rng = np.random.default_rng(1)
    a_, b_ = random_bf16(rng, 64, 64), random_bf16(rng, 64, 64)
    with monkeypatch.context() as m:
        m.setattr(lower_memory, "_ldmatrix_addresses", mutated)
        module = lower_kernel(gemm_kernel, "sm_80", {"BM": 64, "BN": 64})
    c = poisoned(64, 64)
    simulate(module, "gemm_kernel", [a_, b_, c], (1, 1))
    assert not rel_err(c, gemm_ref(a_, b_)) < 1e-2


def test_wrong_fragment_index_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from tkc.backend.lower_compute import lower_mma as original

    def mutated(lw, op):
        result = original(lw, op)
        mma = lw.body[-1]
        table = mma.instructions.copy()
        table[:, [8, 9]] = table[:, [9, 8]]  # swap the two B registers of every mma.sync
        mma.properties["regs_table"] = ptx._ints(table)
        mma.__dict__.pop("_tables", None)
        return result

    monkeypatch.setitem(lowering._HANDLERS, t.MMA_OPS["mma_ABt"], mutated)
    rng = np.random.default_rng(2)
    q, k, v = (random_bf16(rng, 1, 1, 64, 64) for _ in range(3))
    module = lower_kernel(attention_fwd, "sm_80", {"D": 64, "CAUSAL": 0})
    o = poisoned(1, 1, 64, 64)
    simulate(module, "attention_fwd", [q, k, v, o, 0.125], (1, 1, 1))
    assert not rel_err(o, attention_ref(q, k, v, scale=0.125)) < 1e-2


def test_ldmatrix_addresses_out_of_step_with_the_matrix_order_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lanes giving the rows of the matrices in one order while the registers are read in the other."""
    original = lower_memory._ldmatrix_addresses

    def mutated(lw, ref, rt_type, coords, down_first, plan):
        return original(lw, ref, rt_type, coords, not down_first, plan)

    monkeypatch.setattr(lower_memory, "_ldmatrix_addresses", mutated)
    rng = np.random.default_rng(3)
    a_, b_ = random_bf16(rng, 64, 64), random_bf16(rng, 64, 64)
    c = poisoned(64, 64)
    module = lower_kernel(gemm_kernel, "sm_80", {"BM": 64, "BN": 64})
    simulate(module, "gemm_kernel", [a_, b_, c], (1,))
    assert not rel_err(c, gemm_ref(a_, b_)) < 1e-2


def test_missing_barrier_in_the_pipelined_loop_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """insert-barriers forgetting the one barrier per k-step (the one in front of the prefetch's `if`)."""
    from xdsl.dialects import scf

    from tkc.passes import insert_barriers

    original = insert_barriers.BarrierInserter.need_barrier

    def mutated(self, op, state):
        if isinstance(op, scf.IfOp):
            state.barrier()  # believes there is one, inserts none
            return
        original(self, op, state)

    monkeypatch.setattr(insert_barriers.BarrierInserter, "need_barrier", mutated)
    rng = np.random.default_rng(4)
    a_, b_ = random_bf16(rng, 64, 200), random_bf16(rng, 200, 64)
    c = poisoned(64, 64)
    module = lower_kernel(gemm_kernel, "sm_80", {"BM": 64, "BN": 64})
    simulate(module, "gemm_kernel", [a_, b_, c], (1,), order="shuffled")
    assert not rel_err(c, gemm_ref(a_, b_)) < 1e-2


@tkc.kernel(warps=1, min_target="sm_80")
def two_roles_across_a_store(A: gl[bf16, 2], X: gl[bf16, 2], C: gl[f32, 2]):
    """a (from shared memory) in both layouts, its shared tile overwritten by x in between: C = a·aᵀ + a·a + x·xᵀ."""
    a_s = load(A, (0, 0), st[bf16, 16, 16])
    a = load(a_s)
    c = mma_ABt(a, a, zeros(rt[f32, 16, 16]))
    a_s = store(a_s, load(X, (0, 0), rt[bf16, 16, 16]))
    c = mma_AB(a, a, c)
    x = load(a_s)
    store(C, mma_ABt(x, x, c), (0, 0))


@pytest.mark.parametrize("mutated", [False, True])
def test_reload_across_a_shared_write_is_caught(monkeypatch: pytest.MonkeyPatch, mutated: bool) -> None:
    """assign-layouts reloads a shared tile in another layout only where nothing writes shared memory in between;
    a mutated pass that reloads across the store reads the new data, and the simulation shows it."""
    from tkc.passes import assign_layouts

    if mutated:
        monkeypatch.setattr(assign_layouts, "_reloadable", lambda value, user: isinstance(value.owner, t.LoadOp)
                            and isinstance(value.owner.source.type, SharedTileType))
    rng = np.random.default_rng(1)
    a, x = random_bf16(rng, 16, 16), random_bf16(rng, 16, 16)
    c = np.zeros((16, 16), np.float32)
    simulate(lower_kernel(two_roles_across_a_store, "sm_80"), "two_roles_across_a_store", [a, x, c], (1,))
    a64 = a.astype(np.float64)
    x64 = x.astype(np.float64)
    assert (rel_err(c, a64 @ a64.T + a64 @ a64 + x64 @ x64.T) > 1e-2) == mutated


@pytest.mark.parametrize("mutation", ["no broadcast", "no reset"])
def test_arrive_last_mutations_are_caught(mutation: str) -> None:
    """arrive_last's PTX with `bar.red.or.pred` made a plain `bar.sync 0` (each thread keeps its own verdict: only
    thread 0's is set, so its warp's `if` diverges, which the simulation reports), or without the guarded store that
    resets the count (the next launch never finishes: its sum is never made)."""
    from tkc.backend.simulator import SimulationError

    from kernels.last_block_sum import last_block_sum

    module = lower_kernel(last_block_sum, "sm_80", {"N": 64})
    if mutation == "no broadcast":
        (red,) = [op for op in module.walk() if isinstance(op, ptx.BarRedOp)]
        red.result.replace_all_uses_with(red.value)
        red.parent_block().insert_op_before(ptx.BarSyncOp(0), red)
        red.detach()
        red.erase()
    else:
        (reset,) = [op for op in module.walk() if isinstance(op, ptx.StoreOp) and op.ptx_type.data == "u32"]
        reset.detach()
        reset.erase()
    rng = np.random.default_rng(3)
    right = True
    counter = np.zeros(1, np.int32)
    for _ in range(2):
        x = rng.standard_normal((32 * 4, 64)).astype(np.float32)
        out = np.full((32, 64), np.nan, np.float32)
        try:
            simulate(module, "last_block_sum", [x, np.full_like(x, np.nan), out, counter], (4,))
        except SimulationError as e:
            assert mutation == "no broadcast" and "diverges" in str(e)
            return
        right = right and rel_err(out, x.reshape(4, 32, 64).astype(np.float64).sum(0)) < 1e-6
    assert not right


def test_linear_layout_out_of_step_between_dtypes_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A linear-layout f32 tile's registers must hold, slot for slot, the elements of the bf16 registers it is
    converted from: f32 registers with the two row halves swapped (rows g and g + 8 of a lane) turn each rotary row
    by another row's angles."""
    from reference import rotary_ref

    from tkc.backend import fragments
    from tkc.kernels import rotary_kernel

    original = fragments._linear_elements

    def mutated(rows: int, cols: int, packed: bool) -> np.ndarray:
        out = original(rows, cols, packed)
        if not packed:
            out = out.copy()
            out[:, :16] = np.concatenate([out[:, 8:16], out[:, :8]], axis=1)
        return out

    monkeypatch.setattr(fragments, "_linear_elements", mutated)
    fragments._tile_elements.cache_clear()
    try:
        rng = np.random.default_rng(4)
        x = random_bf16(rng, 1, 2, 16, 64)
        angles = rng.uniform(0, 2 * np.pi, (16, 32))
        cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        module = lower_kernel(rotary_kernel, "sm_80", {"D": 64, "R": 64})
        out = poisoned(1, 2, 16, 64)
        simulate(module, "rotary_kernel", [x, cos, sin, out, x, out, np.zeros(1, np.int32), 0, 0], (1, 1, 1))
        assert not rel_err(out, rotary_ref(x, cos, sin)) < 1e-2
    finally:
        fragments._tile_elements.cache_clear()
