"""pingpong-warpgroups: two warpgroups take turns at the tensor cores through two named barriers. The turns change
no value (the interpreter ignores them); the PTX simulation runs the warpgroups as the warps they are, with
`bar.sync`/`bar.arrive` on barriers whose number each warpgroup computes, and agrees with the interpreter; turns
that do not balance hang or leave arrivals behind, and the simulator says so; misuse is a clear error."""

from __future__ import annotations

import numpy as np
import pytest
from reference import attention_ref, poisoned, random_bf16, rel_err

from backend.test_simulate import run_both
from tkc.backend import ptx, ptxas
from tkc.backend.simulator import SimulationError, simulate
from tkc.compiler import compile_for_launch, lower_kernel
from tkc.errors import TkcError
from tkc.ir import ops as t
import tkc
from tkc.kernels import attention_sm90
from tkc.lang import f32, gl, rt, store, warp_id, zeros
from tkc.passes import pingpong_warpgroups
from xdsl.dialects import scf


def _attention(nq: int, nk: int, d: int, causal: int, keys: int = 64, order: str = "shuffled", producer: int = 0):
    rng = np.random.default_rng(nq + nk + d + causal)
    q = random_bf16(rng, 1, 2, nq, d)
    k, v = random_bf16(rng, 1, 2, nk, d), random_bf16(rng, 1, 2, nk, d)
    args = [q, k, v, poisoned(1, 2, nq, d), poisoned(1, 2, nq, dtype=np.float32), d**-0.5]
    constants = {"D": d, "CAUSAL": causal, "KEYS": keys, "WARPS": 8, "LSE": 1, "PINGPONG": 1, "PRODUCER": producer}
    return args, constants, (2 * -(-nq // 128),)


@pytest.mark.parametrize("nq, nk, d, causal, keys, producer", [
    (256, 320, 64, 0, 64, 0), (200, 200, 64, 1, 64, 0), (128, 520, 128, 0, 128, 0), (1, 1, 64, 0, 64, 0),
    (200, 520, 64, 1, 64, 1)])
def test_attention_takes_turns_and_agrees(nq: int, nk: int, d: int, causal: int, keys: int, producer: int) -> None:
    """attention_sm90 with pingpong=1: more key blocks than stages (and one), causal, ragged lengths, with a
    producer warpgroup (which then refills the ring); simulated with the warps in shuffled order against the
    interpreter, which agrees with float64."""
    args, constants, grid = _attention(nq, nk, d, causal, keys, producer=producer)
    module = lower_kernel(attention_sm90, "sm_90a", constants)
    bars = [op for op in module.walk() if isinstance(op, ptx.BarSyncOp) and op.barrier_reg is not None]
    assert {op.arrives for op in bars} == {False, True} and {op.threads.data for op in bars} == {256}
    interp, sim = run_both(attention_sm90, args, grid, constants, target="sm_90a", order="shuffled")
    ref, ref_lse = attention_ref(*args[:3], causal=bool(causal), scale=d**-0.5, lse=True)
    assert rel_err(interp[3], ref) < 2e-2 and rel_err(sim[3], interp[3]) < 2e-3
    assert rel_err(sim[4], ref_lse) < 1e-4


def test_turns_sit_around_the_wgmmas() -> None:
    """The IR after the pass: a wait before and a pass after each wgmma, the first wait and the last pass only at
    the first and last step, warpgroup 1's pass before the loop and warpgroup 0's wait after it."""
    from tkc.compiler import Dumps, PassTimer, parse_pipeline, run_passes
    from tkc.frontend.kernel import build_module

    module = build_module([attention_sm90], "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "PINGPONG": 1})
    run_passes(module, parse_pipeline("canonicalize,cse,pingpong-warpgroups"), Dumps(None), PassTimer(False))
    order = [op.name.removeprefix("tile.") for op in module.walk()
             if isinstance(op, t.TurnWaitOp | t.TurnPassOp | t.WgmmaOp | scf.ForOp)]
    assert order[:2] == ["scf.for", "turn_pass"]  # (the tile loop)
    assert order[1:] == ["turn_pass", "scf.for", "turn_wait", "wgmma_ABt", "turn_pass", "turn_wait", "wgmma_AB",
                     "turn_pass", "turn_wait"], order


@pytest.mark.parametrize("mutation, message", [
    ("no pass before the loop", "hang"),
    ("no wait after the loop", "nobody waited for"),
    ("a pass after the last wgmma at every step", "(hang|once more|nobody waited)"),
])
def test_unbalanced_turns_are_caught(monkeypatch: pytest.MonkeyPatch, mutation: str, message: str) -> None:
    """Mutated passes: without warpgroup 1's first pass warpgroup 0 waits forever; without warpgroup 0's last wait
    an arrival is left at a barrier; passing the turn after the last wgmma at every step (not only the last)
    passes more turns than are taken."""
    original_on, original_guarded = pingpong_warpgroups._on_warpgroup, pingpong_warpgroups._guarded
    if mutation == "no pass before the loop":
        monkeypatch.setattr(pingpong_warpgroups, "_on_warpgroup", lambda i, op: [] if i == 1 else original_on(i, op))
    elif mutation == "no wait after the loop":
        monkeypatch.setattr(pingpong_warpgroups, "_on_warpgroup", lambda i, op: [] if i == 0 else original_on(i, op))
    else:
        monkeypatch.setattr(pingpong_warpgroups, "_guarded", lambda cond, op: [cond, op] if isinstance(
            op, t.TurnPassOp) and not isinstance(cond.operands[0].owner, t.WarpgroupIdOp) else original_guarded(cond, op))
    args, constants, grid = _attention(256, 256, 64, 0)
    module = lower_kernel(attention_sm90, "sm_90a", constants)
    with pytest.raises(SimulationError, match=message):
        simulate(module, "attention_sm90", args, grid, order="shuffled")


def test_misuse_is_a_clear_error() -> None:
    with pytest.raises(TkcError, match="needs warps=8"):
        lower_kernel(attention_sm90, "sm_90a", {"D": 64, "WARPS": 4, "PINGPONG": 1})
    with pytest.raises(TkcError, match="stages >= 3"):
        lower_kernel(attention_sm90, "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "PINGPONG": 1, "STAGES": 2})
    # with a producer too, unless P·V runs on into the next step (the simulator finds the hang: every warp waits)
    with pytest.raises(TkcError, match="producer warpgroup and P·V waited for in its own step"):
        lower_kernel(attention_sm90, "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "PINGPONG": 1, "STAGES": 2,
                                                "PRODUCER": 1})
    lower_kernel(attention_sm90, "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "PINGPONG": 1, "STAGES": 2,
                                            "PRODUCER": 1, "DEFER": 1})
    with pytest.raises(TkcError, match="no loop with wgmmas"):
        lower_kernel(no_wgmma, "sm_90a", {})
    with pytest.raises(TkcError, match="overlap=1: the kernel has no loop with wgmmas"):
        lower_kernel(no_wgmma_overlap, "sm_90a", {})


@tkc.kernel(warps=8, pingpong=1, min_target="sm_90a")
def no_wgmma(X: gl[f32, 2]):
    store(X, zeros(rt[f32, 16, 16]), (warp_id(), 0))


@tkc.kernel(warps=4, overlap=1, min_target="sm_90a")
def no_wgmma_overlap(X: gl[f32, 2]):
    store(X, zeros(rt[f32, 16, 16]), (warp_id(), 0))


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("d, keys", [(64, 64), (128, 128)])
def test_pingpong_attention_assembles_cleanly(d: int, keys: int) -> None:
    compiled = compile_for_launch(attention_sm90, "sm_90a", {"D": d, "KEYS": keys, "WARPS": 8, "PINGPONG": 1, "LSE": 1},
                                  {"Q": 16, "K": 16, "V": 16, "O": 16, "L": 4})
    (report,) = ptxas.assemble(compiled.ptx, "sm_90a").values()
    assert report.spill_stores == 0 and report.spill_loads == 0 and report.stack_bytes == 0, report.log
    assert not report.notes and not any(c in report.log for c in ("C7508", "C7509", "C7511", "C7515")), report.log


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("d, keys", [(64, 64), (128, 128)])
def test_softmax_stays_outside_the_turn(tmp_path, d: int, keys: int) -> None:
    """In the SASS of attention_sm90 with pingpong=1, none of P's exp2 between the turn wait and the P·V wgmmas it
    guards (the rescale of O, computed every step, may bring its row's correction, at most 2). Without the barrier
    number computed from P's registers, ptxas sank 64 of the 66 exp2 past the bar.sync, into the turn, and
    ping-pong measured slower on the H200 (399 vs 466 TFLOP/s at D = 128)."""
    import importlib.util
    import subprocess
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("sass_order", Path(__file__).parents[2] / "bench" / "sass_order.py")
    sass_order = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sass_order)
    key_instructions = sass_order.key_instructions

    compiled = compile_for_launch(attention_sm90, "sm_90a", {"D": d, "KEYS": keys, "WARPS": 8, "PINGPONG": 1},
                                  {"Q": 16, "K": 16, "V": 16, "O": 16, "L": 4})
    tool = ptxas.find_ptxas()
    (tmp_path / "k.ptx").write_text(compiled.ptx)
    subprocess.run([tool, "-arch=sm_90a", str(tmp_path / "k.ptx"), "-o", str(tmp_path / "k.cubin")], check=True)
    sass = subprocess.run([str(Path(tool).with_name("nvdisasm")), str(tmp_path / "k.cubin")], capture_output=True,
                          text=True, check=True).stdout
    seq = key_instructions(sass)
    pv = max(i for i, name in enumerate(seq) if name == "HGMMA" and i > 0 and seq[i - 1] != "HGMMA"
             and "EX2" in seq[:i])  # the first wgmma of the P·V group, after the softmax
    turn = max(i for i in range(pv) if seq[i] == "TURN")
    assert seq[turn:pv].count("EX2") <= 2, " ".join(seq)


@pytest.mark.parametrize("nq, nk, d, causal, keys, warps, stages, pingpong", [
    (256, 320, 64, 0, 64, 8, 3, 0), (200, 200, 64, 1, 64, 4, 3, 0), (128, 520, 128, 0, 128, 8, 2, 0),
    (1, 1, 64, 0, 64, 4, 3, 0), (256, 320, 64, 1, 64, 8, 3, 1), (130, 300, 128, 0, 64, 8, 3, 1)])
def test_overlap_issues_the_next_scores_early_and_agrees(nq: int, nk: int, d: int, causal: int, keys: int, warps: int,
                                                         stages: int, pingpong: int) -> None:
    """attention_sm90 with overlap=1 (overlap-wgmma: S_{j+1} = Q·K_{j+1}ᵀ issued before step j's softmax, left
    running until P·V's wait), alone and with ping-pong: simulated with shuffled warps against the interpreter."""
    rng = np.random.default_rng(nq + nk + d)
    q = random_bf16(rng, 1, 2, nq, d)
    k, v = random_bf16(rng, 1, 2, nk, d), random_bf16(rng, 1, 2, nk, d)
    args = [q, k, v, poisoned(1, 2, nq, d), poisoned(1, 2, nq, dtype=np.float32), d**-0.5]
    constants = {"D": d, "CAUSAL": causal, "KEYS": keys, "WARPS": warps, "LSE": 1, "OVERLAP": 1, "STAGES": stages,
                 "PINGPONG": pingpong}
    interp, sim = run_both(attention_sm90, args, (2 * -(-nq // (16 * warps)),), constants, target="sm_90a",
                           order="shuffled")
    ref, ref_lse = attention_ref(q, k, v, causal=bool(causal), scale=d**-0.5, lse=True)
    assert rel_err(interp[3], ref) < 2e-2 and rel_err(sim[3], interp[3]) < 2e-3
    assert rel_err(sim[4], ref_lse) < 1e-4


def test_a_wgmma_read_before_its_wait_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutated lowering: any wgmma followed by another in its block is left running (not only one whose result
    goes to the next step). attention's S is then read by the softmax before P·V's wait, where the simulator's
    registers still hold NaN: the output is wrong."""
    from tkc.backend import lower_compute

    def later_wgmma(op) -> bool:
        nxt = op.next_op
        while nxt is not None and not isinstance(nxt, t.WgmmaOp):
            nxt = nxt.next_op
        return nxt is not None

    monkeypatch.setattr(lower_compute, "_waited_by_a_later_wgmma", later_wgmma)
    args, constants, grid = _attention(128, 192, 64, 0)
    constants["PINGPONG"] = 0
    module = lower_kernel(attention_sm90, "sm_90a", constants)
    simulate(module, "attention_sm90", args, grid, order="shuffled")
    assert not np.isfinite(args[3].astype(np.float32)).all()


def test_overlap_rotates_the_loop() -> None:
    """The IR after overlap-wgmma: step 0's K load and Q·Kᵀ before the loop; in it, the next step's K load and
    Q·Kᵀ first, then this step's V load and P·V; the loop carries the scores."""
    from tkc.compiler import Dumps, PassTimer, parse_pipeline, run_passes
    from tkc.frontend.kernel import build_module

    module = build_module([attention_sm90], "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "OVERLAP": 1})
    run_passes(module, parse_pipeline("canonicalize,cse,overlap-wgmma"), Dumps(None), PassTimer(False))
    loop = [op for op in module.walk() if isinstance(op, scf.ForOp)][-1]  # the key loop, in the tile loop
    before = [op for op in loop.parent_block().ops][:[*loop.parent_block().ops].index(loop)]
    assert [op.name for op in before if isinstance(op, t.WgmmaOp | t.LoadOp)][-2:] == ["tile.load", "tile.wgmma_ABt"]
    body = [op for op in loop.body.block.ops if isinstance(op, t.WgmmaOp | t.LoadOp)]
    assert [op.name for op in body] == ["tile.load", "tile.wgmma_ABt", "tile.load", "tile.wgmma_AB"]
    assert len(loop.iter_args) == 4 and loop.body.block.args[-1].type == body[1].result.type


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("constants", [{"D": 128, "KEYS": 64, "OVERLAP": 1, "STAGES": 2}, {"D": 64, "KEYS": 64, "OVERLAP": 1},
                                       {"D": 128, "KEYS": 64, "OVERLAP": 1, "PINGPONG": 1}])
def test_overlap_attention_assembles_cleanly(constants: dict) -> None:
    compiled = compile_for_launch(attention_sm90, "sm_90a", {**constants, "WARPS": 8, "LSE": 1},
                                  {"Q": 16, "K": 16, "V": 16, "O": 16, "L": 4})
    (report,) = ptxas.assemble(compiled.ptx, "sm_90a").values()
    assert report.spill_stores == 0 and report.spill_loads == 0 and report.stack_bytes == 0, report.log
    assert not report.notes and not any(c in report.log for c in ("C7508", "C7509", "C7511", "C7515")), report.log


def _loop_ptx(ptx_text: str) -> tuple[str, str]:
    """(the main loop's PTX, what follows it) of a kernel with one loop."""
    body = ptx_text[ptx_text.index("$LOOP"):]
    end = body.index("bra.uni $LOOP")
    return body[:end], body[end:]


@pytest.mark.parametrize("pingpong", [0, 1])
def test_pv_runs_into_the_next_step(pingpong: int) -> None:
    """attention's O += P·V is not waited for in its step: the next step's Q·Kᵀ queues up right behind it and one
    wait covers both (a wait after P·V held the turn, and the tensor cores, for its whole run); the ring releases a
    stage one step late; after the loop, one wait for the last P·V."""
    constants = {"D": 64, "KEYS": 64, "WARPS": 8, "PINGPONG": pingpong}
    compiled = compile_for_launch(attention_sm90, "sm_90a", constants, {"Q": 16, "K": 16, "V": 16, "O": 16, "L": 4})
    loop, after = _loop_ptx(compiled.ptx)
    assert loop.count("wgmma.commit_group") == 2 and loop.count("wgmma.wait_group") == 1
    assert loop.index("wgmma.wait_group") < loop.rindex("wgmma.commit_group")  # the wait is Q·Kᵀ's, not P·V's
    assert "wgmma.wait_group.sync.aligned 0" in after[:after.index("st.global")]


def test_pv_running_on_needs_the_late_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutated pipeline: the ring releases each stage at once though P·V still reads V from it into the next step.
    The refill's TMA then writes shared memory a wgmma not yet waited for reads, and the simulator says so."""
    from tkc.passes import insert_tma_pipeline

    monkeypatch.setattr(insert_tma_pipeline, "_release_lags", lambda loop: False)
    args, constants, grid = _attention(128, 64 * 6, 64, 0)
    constants["PINGPONG"] = 0
    module = lower_kernel(attention_sm90, "sm_90a", constants)
    with pytest.raises(SimulationError, match="wgmma"):
        simulate(module, "attention_sm90", args, grid, order="shuffled")
