"""stagger-warpgroups (`stagger=N`): warpgroup 1 waits once, before the tile loop, for a turn warpgroup 0 passes
after N key steps of its first tile (or after the loop where that tile has fewer). The PTX simulation (warps in
shuffled order, hangs detected) agrees with the interpreter with step 0 peeled, the tile loop rotated, tiles of
one step, persistent blocks; without the pass after the loop a one-step tile hangs (caught); configurations that
would hang are refused at compile time."""

from __future__ import annotations

import numpy as np
import pytest
from reference import attention_ref, poisoned, random_bf16, rel_err
from xdsl.dialects import scf

from backend.test_simulate import run_both
from tkc.backend import ptxas
from tkc.backend.simulator import SimulationError
from tkc.compiler import Dumps, PassTimer, compile_for_launch, parse_pipeline, run_passes
from tkc.errors import TkcError
from tkc.frontend.kernel import build_module
from tkc.ir import ops as t
from tkc.kernels import attention_sm90
from tkc.passes import stagger_warpgroups

PREFIX = "canonicalize,cse,insert-tma-pipeline,defer-wgmma,specialize-warps,peel-deferred-step"
SHORT = {"KEYS": 128, "WARPS": 8, "DEFER": 2, "PRODUCER": 2, "Q_REGS": 1}  # attention()'s short D=64 one


def _inputs(nq: int, nk: int) -> list:
    rng = np.random.default_rng(nq + nk)
    q, k, v = random_bf16(rng, 1, 2, nq, 64), random_bf16(rng, 1, 2, nk, 64), random_bf16(rng, 1, 2, nk, 64)
    return [q, k, v, poisoned(1, 2, nq, 64), poisoned(1, 2, nq, dtype=np.float32), 0.125]


def test_one_wait_before_the_tile_loop_and_a_pass_in_the_first_tile() -> None:
    module = build_module([attention_sm90], "sm_90a", {"D": 64, **SHORT, "STAGGER": 2})
    run_passes(module, parse_pipeline(PREFIX + ",stagger-warpgroups"), Dumps(), PassTimer())
    waits = [op for op in module.walk() if isinstance(op, t.TurnWaitOp)]
    passes = [op for op in module.walk() if isinstance(op, t.TurnPassOp)]
    assert len(waits) == 1 and len(passes) == 2
    (wait,) = waits
    tile_loop = wait.parent_op().next_op
    assert isinstance(tile_loop, scf.ForOp)  # the guarded wait sits right before the tile loop
    key_loop = next(op for op in tile_loop.walk() if isinstance(op, scf.ForOp) and op is not tile_loop)
    in_loop, after_loop = passes
    assert in_loop.parent_op().parent_op() is key_loop  # scf.if in the key loop's body
    assert after_loop.parent_op().prev_op is not None and after_loop.parent_op() not in list(key_loop.walk())


CONFIGS = [
    (300, 333, 1, {**SHORT, "STAGGER": 2, "STAGES": 4}, 3),
    (300, 700, 0, {**SHORT, "STAGGER": 1}, 2),  # persistent: several tiles a block
    (200, 460, 0, {"KEYS": 64, "WARPS": 8, "PRODUCER": 1, "Q_REGS": 1, "DEFER": 3, "STAGGER": 2, "STAGES": 4}, 2),
    (257, 300, 1, {"KEYS": 64, "WARPS": 8, "PRODUCER": 1, "STAGGER": 2, "STAGES": 3}, 5),
    (100, 64, 0, {"KEYS": 64, "WARPS": 8, "PRODUCER": 1, "Q_REGS": 1, "DEFER": 2, "STAGGER": 3, "STAGES": 4}, 3),
    (130, 300, 0, {"KEYS": 128, "WARPS": 8, "PRODUCER": 1, "DEFER": 1, "STAGGER": 1}, 4),
    (300, 333, 1, {**SHORT, "STAGGER": 1, "TMA_STORE": 1, "LATE_SUMS": 1}, 3),  # O through TMA, l's parts late
    (256, 320, 0, {"KEYS": 64, "WARPS": 8, "PRODUCER": 1, "DEFER": 1, "OVERLAP": 1, "STAGGER": 1}, 2),
]


@pytest.mark.parametrize("nq, nk, causal, extra, grid", CONFIGS)
def test_simulation_agrees(nq: int, nk: int, causal: int, extra: dict, grid: int) -> None:
    args = _inputs(nq, nk)
    constants = {"D": 64, "CAUSAL": causal, "LSE": 1, **extra}
    interp, sim = run_both(attention_sm90, args, (grid,), constants, target="sm_90a", order="shuffled")
    ref, ref_lse = attention_ref(*args[:3], causal=bool(causal), scale=0.125, lse=True)
    assert rel_err(interp[3], ref) < 2e-2 and rel_err(sim[3], interp[3]) < 2e-3
    assert rel_err(sim[4], ref_lse) < 1e-4


def test_a_one_step_tile_without_the_pass_after_the_loop_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutated pass: no pass after the key loop. Keys of one block with step 0 peeled leave the loop no step, so
    warpgroup 0 never passes and warpgroup 1 waits forever: the simulator reports the hang."""
    monkeypatch.setattr(stagger_warpgroups, "_pass_after_loop", lambda loop, first_tile: None)
    nq, nk, causal, extra, grid = CONFIGS[4]
    with pytest.raises(SimulationError, match="hang"):
        run_both(attention_sm90, _inputs(nq, nk), (grid,), {"D": 64, "CAUSAL": causal, "LSE": 1, **extra},
                 target="sm_90a")


@pytest.mark.parametrize("extra, message", [
    ({"KEYS": 64, "WARPS": 8, "STAGGER": 2, "STAGES": 4}, "needs a producer warpgroup"),
    ({**SHORT, "STAGGER": 3}, "more than 3 stages"),
    ({**SHORT, "STAGGER": 1, "PINGPONG": 1}, "choose one"),
    ({**SHORT, "WARPS": 12, "STAGGER": 1}, "needs warps=8"),
])
def test_configurations_that_would_hang_are_refused(extra: dict, message: str) -> None:
    with pytest.raises(TkcError, match=message):
        compile_for_launch(attention_sm90, "sm_90a", {"D": 64, **extra},
                           {p.name: 16 for p in attention_sm90.runtime_params if p.kind == "tensor"})


@pytest.mark.parametrize("stagger, stages", [(1, 3), (2, 4)])
def test_the_short_configuration_assembles_cleanly(stagger: int, stages: int) -> None:
    if ptxas.find_ptxas() is None:
        pytest.skip("ptxas not installed")
    for causal in (0, 1):
        constants = {"D": 64, "CAUSAL": causal, "LSE": 1, **SHORT, "STAGGER": stagger, "STAGES": stages}
        compiled = compile_for_launch(attention_sm90, "sm_90a", constants,
                                      {p.name: 16 for p in attention_sm90.runtime_params if p.kind == "tensor"})
        (report,) = ptxas.assemble(compiled.ptx, "sm_90a").values()
        assert report.spill_stores == 0 and report.stack_bytes == 0 and not report.notes, report.log
