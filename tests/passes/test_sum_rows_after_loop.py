"""sum-rows-after-loop (`late_sums=1`): attention's l keeps its lanes' parts of the row sums through the key loop
and exchanges them once after it. The interpreter's results do not change (exactly); the PTX simulation, lanes and
all, agrees with the interpreter in several of attention_sm90's schedules; a finish that does not exchange the
parts is caught; loops whose carried value does more than add row sums are left alone."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import attention_ref, poisoned, random_bf16, rel_err
from xdsl.dialects import func, scf
from xdsl.dialects.builtin import UnitAttr

from backend.test_simulate import run_both
from tkc.backend import lowering, ptxas
from tkc.backend.lower_compute import pack, unpack
from tkc.compiler import Dumps, PassTimer, compile_for_launch, parse_pipeline, run_passes
from tkc.frontend.kernel import build_module
from tkc.ir import ops as t
from tkc.kernels import attention_fwd, attention_sm90

from .helpers import before_and_after

PIPELINE = "canonicalize,cse,sum-rows-after-loop"


def _inputs(nq: int, nk: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed + nq + nk)
    q, k, v = random_bf16(rng, 1, 2, nq, 64), random_bf16(rng, 1, 2, nk, 64), random_bf16(rng, 1, 2, nk, 64)
    return [q, k, v, poisoned(1, 2, nq, 64), poisoned(1, 2, nq, dtype=np.float32), 0.125]


def test_the_loops_row_sum_is_partial_and_finished_after_the_loop() -> None:
    module = build_module([attention_sm90], "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 4, "LSE": 1, "LATE_SUMS": 1})
    run_passes(module, parse_pipeline(PIPELINE), Dumps(), PassTimer())
    key_loop = next(op for op in module.walk() if isinstance(op, scf.ForOp)
                    and any(isinstance(o, t.WgmmaOp) for o in op.body.block.ops))
    sums = [op for op in key_loop.walk() if isinstance(op, t.ReduceOp) and op.fn == "sum"]
    assert len(sums) == 1 and t.PARTIAL in sums[0].attributes
    (finish,) = [op for op in module.walk() if isinstance(op, t.FinishRowSumOp)]
    assert finish.input is key_loop.results[finish.input.index] and finish.parent_block() is key_loop.parent_block()
    users = {use.operation.name for use in finish.result.uses}
    assert users == {"tile.div_row", "tile.log"}  # the output's normalization and the log-sum-exp
    assert not any(use.operation is not finish for use in key_loop.results[finish.input.index].uses)


@pytest.mark.parametrize("kernel, constants", [
    (attention_sm90, {"D": 64, "KEYS": 64, "WARPS": 4, "ROWSUM_MMA": 1, "LATE_SUMS": 1}),  # l: P·1's row max
    (attention_sm90, {"D": 64, "KEYS": 64, "WARPS": 4}),  # late_sums not asked for
])
def test_loops_it_cannot_change_are_left_alone(kernel, constants) -> None:
    module = build_module([kernel], "sm_90a", constants)
    run_passes(module, parse_pipeline("canonicalize,cse"), Dumps(), PassTimer())
    before = str(module)
    run_passes(module, parse_pipeline("sum-rows-after-loop"), Dumps(), PassTimer())
    assert str(module) == before


def test_a_sum_rescaled_inside_a_branch_is_left_alone() -> None:
    """attention_fwd rescales l only in steps where a row's maximum grew a lot (inside an scf.if): the carried
    value's chain goes through the branch, which the pass does not follow."""
    module = build_module([attention_fwd], "sm_80", {"D": 64})
    for fn in module.walk():
        if isinstance(fn, func.FuncOp):
            fn.attributes["tkc.late_sums"] = UnitAttr()
    run_passes(module, parse_pipeline("canonicalize,cse"), Dumps(), PassTimer())
    before = str(module)
    run_passes(module, parse_pipeline("sum-rows-after-loop"), Dumps(), PassTimer())
    assert str(module) == before


@given(nq=st.integers(1, 200), nk=st.integers(1, 300), causal=st.integers(0, 1), seed=st.integers(0, 2**31))
@settings(max_examples=5, deadline=None)
def test_the_interpreter_agrees_before_and_after(nq: int, nk: int, causal: int, seed: int) -> None:
    args = _inputs(nq, nk, seed)
    constants = {"D": 64, "KEYS": 64, "WARPS": 4, "CAUSAL": causal, "LSE": 1, "LATE_SUMS": 1}
    before, after, _ = before_and_after(attention_sm90, "sum-rows-after-loop", args, (2 * -(-nq // 64),),
                                        constants, target="sm_90a", prefix="canonicalize,cse")
    assert np.array_equal(before[3].astype(np.float32), after[3].astype(np.float32), equal_nan=True)
    assert np.array_equal(before[4], after[4], equal_nan=True)


CONFIGS = [
    (300, 333, 1, {"KEYS": 128, "WARPS": 8, "PRODUCER": 2, "Q_REGS": 1, "DEFER": 2}, 3),  # attention()'s short one
    (200, 460, 0, {"KEYS": 64, "WARPS": 8, "PRODUCER": 1, "Q_REGS": 1, "DEFER": 3}, 2),
    (300, 333, 0, {"KEYS": 128, "WARPS": 12, "PRODUCER": 1, "DEFER": 1}, 2),
    (257, 300, 1, {"KEYS": 64, "WARPS": 4}, 5),
    (130, 300, 0, {"KEYS": 128, "WARPS": 8, "PINGPONG": 1, "PRODUCER": 1, "Q_REGS": 1, "DEFER": 2}, 2),
    (200, 333, 1, {"KEYS": 64, "WARPS": 8, "PRODUCER": 1, "Q_REGS": 1, "DEFER": 1, "OVERLAP": 1}, 2),  # bench's B
]


@pytest.mark.parametrize("nq, nk, causal, extra, grid", CONFIGS)
def test_simulation_agrees(nq: int, nk: int, causal: int, extra: dict, grid: int) -> None:
    """Persistent blocks (several tiles each, the sums restarting at 0 every tile), step 0 peeled, the tile loop
    rotated, three consumer warpgroups, ping-pong: the lanes' parts, exchanged after the loop, give the sums."""
    args = _inputs(nq, nk)
    constants = {"D": 64, "CAUSAL": causal, "LSE": 1, "LATE_SUMS": 1, **extra}
    interp, sim = run_both(attention_sm90, args, (grid,), constants, target="sm_90a", order="shuffled")
    ref, ref_lse = attention_ref(*args[:3], causal=bool(causal), scale=0.125, lse=True)
    assert rel_err(interp[3], ref) < 2e-2 and rel_err(sim[3], interp[3]) < 2e-3
    assert rel_err(sim[4], ref_lse) < 1e-4


def test_a_finish_that_does_not_exchange_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutated lowering: finish_row_sum passes each lane's part on as the row's sum. The output (divided by a
    quarter of l) and the log-sum-exp come out wrong."""
    def each_lane_alone(lw, op):
        return [pack(lw, unpack(lw, lw.value(op.input), op.result.type), op.result.type)]

    monkeypatch.setitem(lowering._HANDLERS, t.FinishRowSumOp, each_lane_alone)
    nq, nk, causal, extra, grid = CONFIGS[0]
    args = _inputs(nq, nk)
    constants = {"D": 64, "CAUSAL": causal, "LSE": 1, "LATE_SUMS": 1, **extra}
    interp, sim = run_both(attention_sm90, args, (grid,), constants, target="sm_90a", order="shuffled")
    assert rel_err(sim[4], interp[4]) > 1e-2 or rel_err(sim[3], interp[3]) > 1e-1


def test_the_short_configuration_loses_its_shuffles_and_keeps_its_registers() -> None:
    """attention()'s short D=64 configuration with late_sums=1: 0 spills, and per key step 4 fewer shuffles in the
    SASS (the row sums' exchange of two rows, two butterfly levels each)."""
    if ptxas.find_ptxas() is None:
        pytest.skip("ptxas not installed")
    aligns = {p.name: 16 for p in attention_sm90.runtime_params if p.kind == "tensor"}
    base = {"D": 64, "KEYS": 128, "WARPS": 8, "DEFER": 2, "PRODUCER": 2, "Q_REGS": 1, "LSE": 1}
    counts = []
    for late in (0, 1):
        compiled = compile_for_launch(attention_sm90, "sm_90a", {**base, "LATE_SUMS": late}, aligns)
        (report,) = ptxas.assemble(compiled.ptx, "sm_90a").values()
        assert report.spill_stores == 0 and report.stack_bytes == 0 and not report.notes, report.log
        counts.append(ptxas.disassemble(compiled.ptx, "sm_90a").count("SHFL.BFLY"))
    assert counts[0] - counts[1] >= 4, counts


def test_values_holding_partial_sums_are_known() -> None:
    """assign-layouts refuses to move these between layouts (a relayout reads a row's value from one lane): the
    loop's carried sum, its result and the partial row_sum hold parts; the finished sum and the correction do not."""
    from tkc.passes.sum_rows_after_loop import holds_partial_sums

    module = build_module([attention_sm90], "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 4, "LATE_SUMS": 1})
    run_passes(module, parse_pipeline(PIPELINE), Dumps(), PassTimer())
    (finish,) = [op for op in module.walk() if isinstance(op, t.FinishRowSumOp)]
    loop = finish.input.owner
    carried = loop.body.block.args[1 + finish.input.index]
    (partial,) = [op for op in loop.walk() if isinstance(op, t.ReduceOp) and t.PARTIAL in op.attributes]
    assert holds_partial_sums(finish.input) and holds_partial_sums(carried) and holds_partial_sums(partial.result)
    row_max = next(op for op in loop.walk() if isinstance(op, t.ReduceOp) and op.fn == "max")
    assert not holds_partial_sums(finish.result) and not holds_partial_sums(row_max.result)
