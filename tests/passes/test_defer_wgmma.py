"""defer-wgmma: attention's P·V runs in the next step, under that step's softmax (FlashAttention-3's overlap within a
warpgroup). The pass keeps the kernel's meaning (the interpreter agrees before and after it, on random inputs);
the PTX simulation, which poisons a wgmma's accumulator until a wait covers it and checks that nothing rewrites its
A registers or the shared memory it reads before then, agrees with the interpreter with and without a producer
warpgroup and ping-pong; waits one group short are caught; ptxas keeps the wait for P·V after the softmax. With overlap=1 as well, both
wgmmas (P_{j-1}·V_{j-1} and S_{j+1}) run under the softmax of S_j."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import attention_ref, poisoned, random_bf16, rel_err
from xdsl.dialects import scf

from backend.test_simulate import run_both
from tkc.backend import ptxas
from tkc.backend.simulator import SimulationError, simulate
from tkc.compiler import Dumps, PassTimer, compile_for_launch, lower_kernel, parse_pipeline, run_passes
from tkc.errors import TkcError
from tkc.frontend.kernel import build_module
from tkc.ir import ops as t
from tkc.kernels import attention_sm90
from tkc.kernels.attention import sm90_blocks, sm90_constants
from tkc.passes import defer_wgmma

from .helpers import before_and_after

PREFIX = "canonicalize,cse,insert-tma-pipeline"
ALIGNS = {"Q": 16, "K": 16, "V": 16, "O": 16, "L": 4}


def _inputs(nq: int, nk: int, d: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed + nq + nk + d)
    q, k, v = random_bf16(rng, 1, 2, nq, d), random_bf16(rng, 1, 2, nk, d), random_bf16(rng, 1, 2, nk, d)
    return [q, k, v, poisoned(1, 2, nq, d), poisoned(1, 2, nq, dtype=np.float32), d**-0.5]


@given(nq=st.integers(1, 200), nk=st.integers(1, 400), causal=st.integers(0, 1), seed=st.integers(0, 2**31))
@settings(max_examples=6, deadline=None)
def test_the_interpreter_agrees_before_and_after(nq: int, nk: int, causal: int, seed: int) -> None:
    args = _inputs(nq, nk, 64, seed)
    constants = {"D": 64, "KEYS": 64, "WARPS": 4, "CAUSAL": causal, "LSE": 1, "DEFER": 1}
    before, after, _ = before_and_after(attention_sm90, "defer-wgmma", args, (2 * -(-nq // 64),), constants,
                                        target="sm_90a", prefix=PREFIX)
    assert np.array_equal(before[3].astype(np.float32), after[3].astype(np.float32), equal_nan=True)
    assert np.array_equal(before[4], after[4], equal_nan=True)


@pytest.mark.parametrize("nq, nk, d, causal, keys, warps, extra", [
    (256, 320, 64, 0, 64, 8, {}), (200, 200, 64, 1, 64, 4, {}), (128, 520, 128, 0, 128, 8, {"STAGES": 2}),
    (1, 1, 64, 0, 64, 4, {}), (130, 300, 128, 0, 128, 8, {"PRODUCER": 1}), (200, 260, 64, 1, 64, 8, {"PRODUCER": 1}),
    (256, 320, 64, 1, 64, 8, {"PINGPONG": 1}), (130, 300, 128, 0, 128, 8, {"PINGPONG": 1, "PRODUCER": 1, "Q_REGS": 1}),
    (100, 333, 64, 1, 128, 12, {"PRODUCER": 1}), (300, 260, 128, 1, 128, 8, {"PRODUCER": 1, "Q_REGS": 1, "TILES": 2}),
    (300, 333, 64, 0, 64, 8, {"TILES": 3}), (130, 300, 128, 0, 128, 8, {"PINGPONG": 1, "PRODUCER": 1, "Q_REGS": 1, "DEFER": 2}),
    (300, 260, 128, 1, 128, 8, {"PRODUCER": 1, "Q_REGS": 1, "TILES": 2, "DEFER": 2}), (100, 333, 64, 1, 128, 12, {"PRODUCER": 1, "DEFER": 2}),
    (200, 200, 64, 1, 64, 4, {"DEFER": 2}), (1, 1, 64, 0, 64, 4, {"DEFER": 2}), (300, 600, 128, 0, 128, 8, {"PRODUCER": 1, "Q_REGS": 1, "TILES": 3, "DEFER": 2}),
    (300, 700, 64, 0, 128, 8, {"PRODUCER": 1, "Q_REGS": 1, "TILES": 3, "DEFER": 2}),
    (300, 333, 64, 0, 64, 8, {"OVERLAP": 1, "PRODUCER": 1, "Q_REGS": 1, "PERSISTENT": 1}),
    (200, 200, 64, 1, 64, 8, {"OVERLAP": 1, "PRODUCER": 1, "Q_REGS": 1, "TILES": 2}),
    (130, 300, 128, 1, 64, 8, {"OVERLAP": 1, "PRODUCER": 1, "Q_REGS": 1}), (1, 1, 64, 0, 64, 4, {"OVERLAP": 1}),
    (256, 320, 128, 0, 64, 8, {"OVERLAP": 1, "PRODUCER": 1, "STAGES": 3}),
    (300, 333, 64, 1, 128, 8, {"PRODUCER": 1, "Q_REGS": 1, "DEFER": 2, "TMA_STORE": 1, "PERSISTENT": 1}),
    (200, 260, 128, 0, 64, 8, {"OVERLAP": 1, "PRODUCER": 1, "Q_REGS": 1, "TMA_STORE": 1, "TILES": 2}),
    (300, 333, 64, 1, 128, 8, {"PRODUCER": 1, "Q_REGS": 1, "DEFER": 2, "SKIP_RESCALE": 1, "PERSISTENT": 1}),
    (200, 460, 64, 0, 64, 8, {"OVERLAP": 1, "PRODUCER": 1, "Q_REGS": 1, "SKIP_RESCALE": 1, "TILES": 2}),
    (300, 333, 64, 1, 128, 8, {"OVERLAP": 1, "PRODUCER": 2, "TMA_STORE": 1, "PERSISTENT": 1}),
    (200, 460, 64, 0, 128, 8, {"OVERLAP": 1, "PRODUCER": 2, "TILES": 2}),
    (400, 260, 64, 0, 128, 8, {"PRODUCER": 1, "DEFER": 2, "TILES": 3}),
    (300, 200, 128, 0, 64, 8, {"OVERLAP": 1, "PRODUCER": 1, "TILES": 2}),
    (300, 333, 64, 1, 128, 8, {"PRODUCER": 1, "Q_REGS": 1, "DEFER": 2, "ROWSUM_MMA": 1, "TILES": 2}),
    (200, 460, 64, 0, 64, 8, {"PRODUCER": 1, "Q_REGS": 1, "ROWSUM_MMA": 1, "PERSISTENT": 1}),
    (300, 333, 64, 0, 128, 8, {"PRODUCER": 1, "Q_REGS": 1, "DEFER": 3, "ROWSUM_MMA": 1, "TILES": 2}),
    (300, 333, 64, 1, 128, 4, {"PRODUCER": 2, "Q_REGS": 1, "DEFER": 2, "BLOCKS": 2, "TILES": 3})])
def test_simulation_agrees(nq: int, nk: int, d: int, causal: int, keys: int, warps: int, extra: dict) -> None:
    """More key blocks than stages (and one), causal, ragged lengths, with a producer warpgroup, ping-pong, the
    queries in registers, three consumer warpgroups, several query blocks per block, step 0 peeled (DEFER=2), O
    stored by TMA (4-D tensor maps, boxes one head's matrix deep), O's rescale skipped where no maximum moved:
    the PTX simulated with the warps in shuffled order agrees with the interpreter, which agrees with float64.
    ROWSUM_MMA: the row sums by P·1 beside P·V, both deferred (sums of the bf16 P: the LSE to ~5e-5)."""
    args = _inputs(nq, nk, d)
    constants = {"D": d, "CAUSAL": causal, "KEYS": keys, "WARPS": warps, "LSE": 1, "DEFER": 1, **sm90_constants(extra)}
    grid = (sm90_blocks(1, 2, nq, warps, extra.get("TILES", 1)),)
    interp, sim = run_both(attention_sm90, args, grid, constants, target="sm_90a", order="shuffled")
    ref, ref_lse = attention_ref(*args[:3], causal=bool(causal), scale=d**-0.5, lse=True)
    assert rel_err(interp[3], ref) < 2e-2 and rel_err(sim[3], interp[3]) < 2e-3
    assert rel_err(sim[4], ref_lse) < 1e-4


def test_the_loop_issues_scores_then_the_previous_pv() -> None:
    """The IR after the pass: in the loop Q·Kᵀ, then P·V on the previous stage (both deferred), wait 1 (the
    scores), the softmax, wait 0 before the stage release; the loop carries P in bf16; the last P·V after it."""
    module = build_module([attention_sm90], "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "DEFER": 1})
    run_passes(module, parse_pipeline(PREFIX + ",defer-wgmma"), Dumps(None), PassTimer(False))
    loop = next(op for op in module.walk() if isinstance(op, scf.ForOp)
                and any(isinstance(o, t.WgmmaOp) for o in op.body.block.ops))  # the key loop (in the tile loop)
    body = list(loop.body.block.ops)
    marks = [op.name.removeprefix("tile.") + (f" {op.pending.value.data}" if isinstance(op, t.WgmmaWaitOp) else "")
             for op in body if isinstance(op, t.WgmmaOp | t.WgmmaWaitOp) or op.name == "tile.ring_read"
             or any(o.name == "tile.stage_release" for o in op.walk())]
    assert marks == ["ring_read", "wgmma_ABt", "ring_read", "wgmma_AB", "wgmma_wait 1", "wgmma_wait 0", "scf.if"], marks
    assert all(defer_wgmma.DEFERRED in op.attributes for op in body if isinstance(op, t.WgmmaOp))
    assert str(loop.body.block.args[-1].type) == "!tile.rt<16x64xbf16>"
    after = list(loop.parent_block().ops)[list(loop.parent_block().ops).index(loop) + 1:]
    assert any(isinstance(o, t.WgmmaOp) for op in after for o in op.walk())
    # the softmax (its exp2) runs between the two waits, the conversion of P after the second
    waits = [body.index(op) for op in body if isinstance(op, t.WgmmaWaitOp)]
    exp2 = [body.index(op) for op in body if op.name == "tile.exp2"]
    convert = [body.index(op) for op in body if op.name == "tile.convert"]
    assert waits[0] < min(exp2) and max(exp2) < waits[1] < min(convert)


def _mutated_waits(monkeypatch: pytest.MonkeyPatch, which: int) -> None:
    """The pass's wait `which` (1: for the scores, 0: for P·V) leaves one more group running."""
    real = t.WgmmaWaitOp
    monkeypatch.setattr(defer_wgmma.t, "WgmmaWaitOp", lambda n: real(n + 1 if n == which else n))


def test_a_wait_that_misses_the_scores_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutated pass: the softmax waits for all but two groups (not for S). It reads S while the simulated tensor
    cores still hold it (NaN): the output is wrong."""
    _mutated_waits(monkeypatch, 1)
    args = _inputs(128, 320, 64)
    module = lower_kernel(attention_sm90, "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "LSE": 1, "DEFER": 1},
                          aligns=ALIGNS)
    simulate(module, "attention_sm90", args, (2,), order="shuffled")
    assert not np.isfinite(args[3].astype(np.float32)).all()


def test_a_wait_that_counts_one_deferred_wgmma_of_two_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutated pass with ROWSUM_MMA (P·V and P·1 deferred): the softmax's wait leaves three groups running, as if
    one wgmma were deferred too many. S is read while the simulated tensor cores still hold it: the output is wrong."""
    _mutated_waits(monkeypatch, 2)
    args = _inputs(128, 320, 64)
    module = lower_kernel(attention_sm90, "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "LSE": 1, "DEFER": 1,
                                                     "ROWSUM_MMA": 1}, aligns=ALIGNS)
    simulate(module, "attention_sm90", args, (2,), order="shuffled")
    assert not np.isfinite(args[3].astype(np.float32)).all()


def test_a_release_before_pv_is_done_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutated pass: the stage is released (and refilled) while P·V may still read it: the simulator reports the
    TMA write into shared memory a wgmma not yet waited for reads."""
    _mutated_waits(monkeypatch, 0)
    args = _inputs(128, 64 * 6, 64)
    module = lower_kernel(attention_sm90, "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "LSE": 1, "DEFER": 1},
                          aligns=ALIGNS)
    with pytest.raises(SimulationError, match="wgmma"):
        simulate(module, "attention_sm90", args, (2,), order="shuffled")


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("constants", [{"D": 128, "KEYS": 128, "PRODUCER": 1}, {"D": 128, "KEYS": 128, "CAUSAL": 1},
                                       {"D": 64, "KEYS": 64}, {"D": 128, "KEYS": 128, "PINGPONG": 1},
                                       {"D": 64, "KEYS": 64, "OVERLAP": 1, "PRODUCER": 1, "Q_REGS": 1},
                                       {"D": 128, "KEYS": 64, "OVERLAP": 1, "PRODUCER": 1, "Q_REGS": 1},
                                       {"D": 128, "KEYS": 64, "OVERLAP": 1, "PRODUCER": 1, "CAUSAL": 1}])
def test_deferred_attention_assembles_cleanly(constants: dict) -> None:
    compiled = compile_for_launch(attention_sm90, "sm_90a", {**constants, "WARPS": 8, "LSE": 1, "DEFER": 1}, ALIGNS)
    (report,) = ptxas.assemble(compiled.ptx, "sm_90a").values()
    assert report.spill_stores == 0 and report.spill_loads == 0 and report.stack_bytes == 0, report.log
    assert not report.notes and not any(c in report.log for c in ("C7508", "C7509", "C7511", "C7515")), report.log


def _order(constants: dict) -> str:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import sass_order

    compiled = compile_for_launch(attention_sm90, "sm_90a", constants, ALIGNS)
    return sass_order.run_length(sass_order.key_instructions(ptxas.disassemble(compiled.ptx, "sm_90a")))


@pytest.mark.skipif(ptxas.find_ptxas() is None or ptxas.find_nvdisasm() is None, reason="ptxas/nvdisasm not installed")
def test_the_wait_for_pv_stays_after_the_softmax(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the SASS, the wait for P·V comes after the step's exp2s (the softmax runs while P·V does). Lowered as a
    plain wait, ptxas moves it up to the top of its block, ahead of them: the branch around it is what keeps it."""
    constants = {"D": 128, "KEYS": 128, "WARPS": 8, "DEFER": 1}
    assert re.search(r"HGMMA×16 DEPBAR EX2×6\d DEPBAR", _order(constants)), _order(constants)
    from tkc.backend import ptx
    from tkc.backend import lowering

    monkeypatch.setitem(lowering._HANDLERS, t.WgmmaWaitOp,
                        lambda lw, op: lw.emit(ptx.WgmmaSyncOp("wait", op.pending.value.data)) and None)
    assert not re.search(r"HGMMA×16 DEPBAR EX2×6\d DEPBAR", _order(constants)), _order(constants)


def test_a_peeled_loop_with_overlap_is_one_clear_error() -> None:
    with pytest.raises(TkcError, match="overlap=1 goes with defer=1 only"):
        lower_kernel(attention_sm90, "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "DEFER": 2, "OVERLAP": 1})


OVERLAPPED = {"D": 64, "KEYS": 64, "WARPS": 8, "DEFER": 1, "OVERLAP": 1, "PRODUCER": 1, "Q_REGS": 1}


def test_with_overlap_both_wgmmas_run_under_the_softmax() -> None:
    """defer=1 with overlap=1 (FlashAttention-3's pipelining within a warpgroup): the step issues P_{j-1}·V_{j-1},
    then S_{j+1} = Q·K_{j+1}ᵀ, works on S_j (carried from the step before, already complete) with nothing to wait
    for, and waits for both at its end (before the stage release and before S_{j+1} is carried on)."""
    module = build_module([attention_sm90], "sm_90a", OVERLAPPED)
    run_passes(module, parse_pipeline("canonicalize,cse,overlap-wgmma,insert-tma-pipeline,defer-wgmma"), Dumps(None),
               PassTimer(False))
    loop = next(op for op in module.walk() if isinstance(op, scf.ForOp)
                and sum(isinstance(o, t.WgmmaOp) for o in op.body.block.ops) == 2)
    body = list(loop.body.block.ops)
    marks = [op.name.removeprefix("tile.") + (f" {op.pending.value.data}" if isinstance(op, t.WgmmaWaitOp) else "")
             for op in body if isinstance(op, t.WgmmaOp | t.WgmmaWaitOp)]
    assert marks == ["wgmma_AB", "wgmma_ABt", "wgmma_wait 0"], marks
    exp2 = [body.index(op) for op in body if op.name == "tile.exp2"]
    wait = next(body.index(op) for op in body if isinstance(op, t.WgmmaWaitOp))
    assert max(i for i, op in enumerate(body) if isinstance(op, t.WgmmaOp)) < min(exp2) and max(exp2) < wait


def test_with_overlap_a_wait_that_lets_s_run_past_the_step_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutated pass: the step's end waits for all but one group, so S_{j+1} is carried on (copied) while the
    simulated tensor cores still hold it (NaN): the output is wrong."""
    _mutated_waits(monkeypatch, 0)
    args = _inputs(128, 64 * 6, 64)
    module = lower_kernel(attention_sm90, "sm_90a", {**OVERLAPPED, "LSE": 1}, aligns=ALIGNS)
    simulate(module, "attention_sm90", args, (2,), order="shuffled")
    assert not np.isfinite(args[3].astype(np.float32)).all()


def test_the_first_step_runs_before_the_loop_without_pv() -> None:
    """peel-deferred-step: step 0's Q·Kᵀ (no P·V: its P is zero) runs before the key loop, waited for alone; the
    loop starts at step 1, its step index still counted from 0; one P·V per later step and one after the loop."""
    from tkc.passes.peel_deferred_step import PEELED

    module = build_module([attention_sm90], "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "DEFER": 2})
    run_passes(module, parse_pipeline(PREFIX + ",defer-wgmma,peel-deferred-step"), Dumps(None), PassTimer(False))
    peeled = next(op for op in module.walk() if PEELED in op.attributes)
    marks = [op.name.removeprefix("tile.") + (f" {op.pending.value.data}" if isinstance(op, t.WgmmaWaitOp) else "")
             for op in peeled.true_region.walk() if isinstance(op, t.WgmmaOp | t.WgmmaWaitOp)]
    assert marks == ["wgmma_ABt", "wgmma_wait 0", "wgmma_wait 0"], marks
    loop = peeled.next_op.next_op
    assert isinstance(loop, scf.ForOp) and loop.lb.owner.rhs is loop.step
    assert sum(isinstance(op, t.WgmmaOp) for op in loop.body.block.ops) == 2


@given(nq=st.integers(1, 200), nk=st.integers(1, 400), causal=st.integers(0, 1), seed=st.integers(0, 2**31))
@settings(max_examples=5, deadline=None)
def test_peeling_changes_no_bit(nq: int, nk: int, causal: int, seed: int) -> None:
    """The interpreter before and after peel-deferred-step: the same bits (O + 0·V = O), one key block or many."""
    args = _inputs(nq, nk, 64, seed)
    constants = {"D": 64, "KEYS": 64, "WARPS": 4, "CAUSAL": causal, "LSE": 1, "DEFER": 2}
    before, after, _ = before_and_after(attention_sm90, "peel-deferred-step", args, (2 * -(-nq // 64),), constants,
                                        target="sm_90a", prefix=PREFIX + ",defer-wgmma")
    assert np.array_equal(before[3].astype(np.float32), after[3].astype(np.float32), equal_nan=True)
    assert np.array_equal(before[4], after[4], equal_nan=True)


def test_a_peeled_step_that_does_not_wait_for_its_scores_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutated pass: the peeled step keeps the loop's `wait 1`, which lets its only wgmma (S_0) run on: the softmax
    reads scores the simulated tensor cores still hold (NaN), and the output is wrong."""
    from tkc.passes import peel_deferred_step

    monkeypatch.setattr(peel_deferred_step, "_wait_for_all", lambda wait: type(wait)(1))
    args = _inputs(128, 320, 64)
    module = lower_kernel(attention_sm90, "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "LSE": 1, "DEFER": 2},
                          aligns=ALIGNS)
    simulate(module, "attention_sm90", args, (2,), order="shuffled")
    assert not np.isfinite(args[3].astype(np.float32)).all()


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not installed")
def test_the_last_pv_accumulates_in_place() -> None:
    """The P·V after the loop (`if ran { O + P·V } else { O }`) writes O's own registers, as the loop's P·V does: no
    copy of the 64 accumulator registers on the way (ptxas had kept 64 IMAD.MOV per tile for it)."""
    constants = {"D": 128, "KEYS": 128, "WARPS": 8, "DEFER": 1, "PRODUCER": 1, "Q_REGS": 1}
    ptx = compile_for_launch(attention_sm90, "sm_90a", constants, ALIGNS).ptx
    accumulators = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16 (\{[^}]*\})", ptx)
    loop_pv, last_pv = accumulators[8], accumulators[-1]  # after the loop's 8 Q·Kᵀ wgmmas; the drain's last one
    assert last_pv == loop_pv
    (report,) = ptxas.assemble(ptx, "sm_90a").values()
    assert report.spill_stores == 0 and not report.notes


@pytest.mark.skipif(ptxas.find_ptxas() is None or ptxas.find_nvdisasm() is None, reason="ptxas/nvdisasm not installed")
def test_with_overlap_the_softmax_runs_between_both_wgmmas_and_the_wait() -> None:
    """In the SASS of defer=1 with overlap=1 (D=64, 64-key steps): the step's 8 HGMMAs (P·V, then the next Q·Kᵀ),
    the softmax's exp2s, then the wait."""
    order = _order({**OVERLAPPED, "LSE": 0})
    assert re.search(r"HGMMA×8 EX2×3\d DEPBAR", order), order


@given(nq=st.integers(1, 200), nk=st.integers(1, 400), causal=st.integers(0, 1), seed=st.integers(0, 2**31))
@settings(max_examples=6, deadline=None)
def test_unrolling_the_overlapped_loop_changes_no_bit(nq: int, nk: int, causal: int, seed: int) -> None:
    """unroll-overlapped-loop (two steps an iteration, an odd last step after the loop): the interpreter gives the
    same bits before and after it, for even and odd numbers of key blocks."""
    args = _inputs(nq, nk, 64, seed)
    constants = {**OVERLAPPED, "CAUSAL": causal, "LSE": 1}
    before, after, _ = before_and_after(attention_sm90, "unroll-overlapped-loop", args, (2 * -(-nq // 128),),
                                        constants, target="sm_90a",
                                        prefix="canonicalize,cse,overlap-wgmma,insert-tma-pipeline,defer-wgmma")
    assert np.array_equal(before[3].astype(np.float32), after[3].astype(np.float32), equal_nan=True)
    assert np.array_equal(before[4], after[4], equal_nan=True)


def test_the_overlapped_loop_runs_two_steps_an_iteration() -> None:
    """After unroll-overlapped-loop: the key loop steps by two with both steps' wgmmas in it (S_{j+1} of the first
    feeds the second's softmax: no copy between them), and one more step in an if after it."""
    module = build_module([attention_sm90], "sm_90a", OVERLAPPED)
    run_passes(module, parse_pipeline("canonicalize,cse,overlap-wgmma,insert-tma-pipeline,defer-wgmma,"
                                      "unroll-overlapped-loop"), Dumps(None), PassTimer(False))
    loop = next(op for op in module.walk() if isinstance(op, scf.ForOp)
                and sum(isinstance(o, t.WgmmaOp) for o in op.body.block.ops) == 4)
    names = [op.name.removeprefix("tile.") for op in loop.body.block.ops if isinstance(op, t.WgmmaOp | t.WgmmaWaitOp)]
    assert names == ["wgmma_AB", "wgmma_ABt", "wgmma_wait", "wgmma_AB", "wgmma_ABt", "wgmma_wait"], names
    odd = loop.next_op
    while not isinstance(odd, scf.IfOp):
        odd = odd.next_op
    assert sum(isinstance(o, t.WgmmaOp) for o in odd.true_region.walk()) == 2
    assert [r.type for r in odd.results] == [r.type for r in loop.results]


def test_a_tma_store_before_row_0_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutated lowering: the TMA stores of warps whose query rows all lie before row 0 (causal, Nq not a multiple
    of the query blocks) are not skipped. The simulator stops at the first (the H200 raised an illegal
    instruction there)."""
    from tkc.backend import lower_tma

    monkeypatch.setattr(lower_tma, "_skip_boxes_before_row0", lambda lw, guard, first_row, rows: guard)
    constants = {"D": 64, "CAUSAL": 1, "KEYS": 128, "WARPS": 8, "LSE": 1, "DEFER": 2, "PRODUCER": 1, "Q_REGS": 1,
                 "TMA_STORE": 1}
    module = lower_kernel(attention_sm90, "sm_90a", constants, aligns=ALIGNS)
    with pytest.raises(TkcError, match="wholly before row 0"):
        simulate(module, "attention_sm90", _inputs(100, 100, 64), (1,), order="shuffled")


def test_row_sums_by_the_tensor_cores_run_under_the_softmax() -> None:
    """ROWSUM_MMA with defer=1: P·V and P·1 of the step before both issued behind Q·Kᵀ and left running under the
    softmax (one wait for Q·Kᵀ alone, then the exp2, one wait 0); ptxas serializes none of them, no spills."""
    if ptxas.find_ptxas() is None:
        pytest.skip("ptxas not installed")
    constants = {"D": 64, "KEYS": 128, "WARPS": 8, "DEFER": 1, "PRODUCER": 1, "Q_REGS": 1, "ROWSUM_MMA": 1}
    compiled = compile_for_launch(attention_sm90, "sm_90a", constants, ALIGNS)
    (report,) = ptxas.assemble(compiled.ptx, "sm_90a").values()
    assert report.spill_stores == 0 and not report.notes, report.log
    order = _order(constants)
    assert "HGMMA×20 DEPBAR EX2×66 DEPBAR×2" in order, order


@pytest.mark.parametrize("nq, nk, d, causal, keys, warps, extra", [
    (300, 333, 64, 0, 128, 8, {"PRODUCER": 1, "Q_REGS": 1, "DEFER": 2, "LATE_SUMS": 1, "PERSISTENT": 1}),
    (300, 333, 64, 1, 128, 8, {"PRODUCER": 1, "Q_REGS": 1, "DEFER": 2, "LATE_SUMS": 1, "PERSISTENT": 1}),
    (130, 300, 128, 1, 64, 4, {}), (1, 1, 64, 0, 64, 4, {"DEFER": 2})])
def test_late_pv_simulation_agrees(nq: int, nk: int, d: int, causal: int, keys: int, warps: int, extra: dict) -> None:
    """late_pv=1: P·V issued after the row max of S_j (S_j waited for alone before it): the PTX simulation, which
    poisons a wgmma's accumulator until a wait covers it, agrees with the interpreter (persistent blocks, step 0
    peeled, causal, one key)."""
    args = _inputs(nq, nk, d)
    constants = {"D": d, "CAUSAL": causal, "KEYS": keys, "WARPS": warps, "LSE": 1, "DEFER": 1, "LATE_PV": 1,
                 **sm90_constants(extra)}
    grid = (min(2, sm90_blocks(1, 2, nq, warps)),) if extra.get("PERSISTENT") else (sm90_blocks(1, 2, nq, warps),)
    interp, sim = run_both(attention_sm90, args, grid, constants, target="sm_90a", order="shuffled")
    ref, ref_lse = attention_ref(*args[:3], causal=bool(causal), scale=d**-0.5, lse=True)
    assert rel_err(interp[3], ref) < 2e-2 and rel_err(sim[3], interp[3]) < 2e-3
    assert rel_err(sim[4], ref_lse) < 1e-4


def test_late_pv_issues_pv_after_the_row_max() -> None:
    """The IR with late_pv=1: Q·Kᵀ, wait 0 (the scores alone), the row max, then P·V on the previous stage, the
    wait for it before the stage release."""
    module = build_module([attention_sm90], "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "DEFER": 1, "LATE_PV": 1})
    run_passes(module, parse_pipeline(PREFIX + ",defer-wgmma"), Dumps(None), PassTimer(False))
    loop = next(op for op in module.walk() if isinstance(op, scf.ForOp)
                and any(isinstance(o, t.WgmmaOp) for o in op.body.block.ops))
    marks = [op.name.removeprefix("tile.") + (f" {op.pending.value.data}" if isinstance(op, t.WgmmaWaitOp) else "")
             for op in loop.body.block.ops if isinstance(op, t.WgmmaOp | t.WgmmaWaitOp) or op.name == "tile.row_max"]
    assert marks == ["wgmma_ABt", "wgmma_wait 0", "row_max", "wgmma_AB", "wgmma_wait 0"], marks


def test_late_pv_refuses_overlap() -> None:
    with pytest.raises(TkcError, match="late_pv=1 goes with defer=1 or 2 only"):
        compile_for_launch(attention_sm90, "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "DEFER": 1, "OVERLAP": 1,
                                                      "LATE_PV": 1}, ALIGNS)


def test_late_pv_with_a_wait_that_misses_the_scores_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutated pass (late_pv=1): the wait after Q·Kᵀ leaves one group running (S itself, the only one then). The
    softmax reads S while the simulated tensor cores still hold it (NaN): the output is wrong."""
    real, made = t.WgmmaWaitOp, []

    def first_wait_short(n: int) -> t.WgmmaWaitOp:
        made.append(n)
        return real(1 if len(made) == 1 else n)

    monkeypatch.setattr(defer_wgmma.t, "WgmmaWaitOp", first_wait_short)
    args = _inputs(128, 320, 64)
    module = lower_kernel(attention_sm90, "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "LSE": 1, "DEFER": 1,
                                                     "LATE_PV": 1}, aligns=ALIGNS)
    simulate(module, "attention_sm90", args, (2,), order="shuffled")
    assert made[0] == 0 and not np.isfinite(args[3].astype(np.float32)).all()


@given(n=st.integers(1, 160), causal=st.integers(0, 1), seed=st.integers(0, 2**31))
@settings(max_examples=3, deadline=None)
def test_dkdv_interpreter_agrees_before_and_after(n: int, causal: int, seed: int) -> None:
    """The dK/dV kernel's trailing wgmmas deferred (dV with A = P, dK with A = dS, B views of the dO and Q stages;
    the leads Sᵀ and dPᵀ): the interpreter gives the same dK and dV before and after the pass, at D = 256 in halves
    and at D = 64."""
    from tkc.kernels.attention_bwd import attention_bwd_dkdv_sm90, dkdv_blocks

    rng = np.random.default_rng(seed)
    for d, constants in ((256, {"WARPS": 8, "HALVES": 1, "QUERIES": 32, "STAGES": 3}),
                         (64, {"WARPS": 4, "QUERIES": 64, "STAGES": 3})):
        q, k, v, do = (random_bf16(rng, 1, 1, n, d) for _ in range(4))
        lse, delta = (rng.standard_normal((1, 1, n)).astype(np.float32) for _ in range(2))
        args = [q, k, v, do, lse, delta, poisoned(1, 1, n, d), poisoned(1, 1, n, d), 0.1]
        cfg = {**constants, "DEFER": 1, "CAUSAL": causal, "D": d, "RAGGED": int(n % constants["QUERIES"] > 0)}
        before, after, _ = before_and_after(attention_bwd_dkdv_sm90, "defer-wgmma", args, (dkdv_blocks(n, d, cfg), 1, 1),
                                            cfg, target="sm_90a", prefix=PREFIX)
        for i in (6, 7):
            assert np.array_equal(before[i].astype(np.float32), after[i].astype(np.float32), equal_nan=True)
