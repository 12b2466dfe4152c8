"""rotate-tile-loop (defer=3): a tile reads the next tile's queries and starts its S_0 under its own epilogue. The
interpreter gives the same bits before and after the pass; the PTX simulation (a wgmma's accumulator poisoned
until a wait covers it, TMA data landing only at its barrier) agrees with the interpreter with one tile per block
and several, causal or not, D=64 and 128; a rotated S_0 read before its wait, or from the wrong ring step, is
caught; without the queries in registers the option is one clear error."""

from __future__ import annotations

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
from tkc.passes import rotate_tile_loop

from .helpers import before_and_after

PREFIX = "canonicalize,cse,insert-tma-pipeline,defer-wgmma,specialize-warps,peel-deferred-step"
ALIGNS = {"Q": 16, "K": 16, "V": 16, "O": 16, "L": 4}
ROTATING = {"D": 128, "KEYS": 128, "WARPS": 8, "PRODUCER": 1, "Q_REGS": 1, "DEFER": 3}


def _inputs(nq: int, nk: int, d: int, seed: int = 0, heads: int = 2) -> list:
    rng = np.random.default_rng(seed + nq + nk + d)
    q, k, v = (random_bf16(rng, 1, heads, n, d) for n in (nq, nk, nk))
    return [q, k, v, poisoned(1, heads, nq, d), poisoned(1, heads, nq, dtype=np.float32), d**-0.5]


@pytest.mark.parametrize("defer", [3, 4])
@pytest.mark.parametrize("nq, nk, causal, grid, d", [
    (130, 300, 0, {}, 128), (300, 600, 0, {"TILES": 3}, 128), (300, 260, 1, {"TILES": 2}, 128),
    (400, 200, 0, {"TILES": 2}, 128), (17, 113, 1, {"TILES": 2}, 128), (1, 1, 0, {"TILES": 2}, 128),
    (300, 700, 1, {"TILES": 3}, 64), (300, 260, 1, {"TILES": 6}, 128)])
def test_simulation_agrees(nq: int, nk: int, causal: int, grid: dict, d: int, defer: int) -> None:
    """One tile per block (nothing to read ahead), several (the last tile of a block reads none), one block taking
    every tile, ragged lengths, causal (tiles of different lengths): the simulated PTX agrees with the interpreter,
    which agrees with float64."""
    args = _inputs(nq, nk, d)
    constants = {**ROTATING, "D": d, "CAUSAL": causal, "LSE": 1, "DEFER": defer, **sm90_constants(grid)}
    blocks = (sm90_blocks(1, 2, nq, 8, grid.get("TILES", 1)),)
    interp, sim = run_both(attention_sm90, args, blocks, constants, target="sm_90a", order="shuffled")
    ref, ref_lse = attention_ref(*args[:3], causal=bool(causal), scale=d**-0.5, lse=True)
    assert rel_err(interp[3], ref) < 2e-2 and rel_err(sim[3], interp[3]) < 2e-3
    assert rel_err(sim[4], ref_lse) < 1e-4


@given(nq=st.integers(1, 400), nk=st.integers(1, 300), causal=st.integers(0, 1), blocks=st.integers(1, 3),
       defer=st.integers(3, 4), seed=st.integers(0, 2**31))
@settings(max_examples=8, deadline=None)
def test_the_interpreter_agrees_before_and_after(nq: int, nk: int, causal: int, blocks: int, defer: int,
                                                 seed: int) -> None:
    """Bit for bit: S_0 is computed from the same queries and keys, a tile earlier (grids of 1-3 blocks, so that
    blocks take several tiles, the last of them reading none ahead)."""
    args = _inputs(nq, nk, 128, seed)
    constants = {**ROTATING, "CAUSAL": causal, "LSE": 1, "DEFER": defer}
    before, after, _ = before_and_after(attention_sm90, "rotate-tile-loop", args, (blocks,), constants,
                                        target="sm_90a", prefix=PREFIX)
    assert np.array_equal(before[3].astype(np.float32), after[3].astype(np.float32), equal_nan=True)
    assert np.array_equal(before[4], after[4], equal_nan=True)


def test_the_next_scores_start_before_the_store() -> None:
    """The tile loop carries the queries and S_0; after the last P·V, the next tile's Q·Kᵀ is issued, then the
    store, then the wait, then the queries' stage is released; the tile's own step 0 issues no wgmma."""
    module = build_module([attention_sm90], "sm_90a", ROTATING)
    run_passes(module, parse_pipeline(PREFIX + ",rotate-tile-loop"), Dumps(None), PassTimer(False))
    loop = next(op for op in module.walk() if isinstance(op, scf.ForOp) and rotate_tile_loop.ROTATE_ATTR in op.attributes)
    assert [str(a.type) for a in loop.body.block.args[2:]] == ["!tile.rt<16x128xbf16>", "!tile.rt<16x128xf32>"]
    rotated = [op for op in loop.body.block.ops if rotate_tile_loop.ROTATED in op.attributes]
    ahead = next(op for op in rotated if [str(r.type) for r in op.results] == ["!tile.rt<16x128xf32>"])
    release = rotated[-1]  # the queries' stage, given back after S_0's wait
    assert [op.name for op in release.true_region.block.ops][-2:] == ["tile.stage_release", "scf.yield"]
    kinds = [op.name for op in ahead.true_region.block.ops if op.name in ("tile.wgmma_ABt", "tile.store", "tile.wgmma_wait")]
    assert kinds == ["tile.wgmma_ABt", "tile.store", "tile.wgmma_wait"]
    step0 = next(op for op in loop.body.block.ops if "tkc.peeled_step" in op.attributes)
    assert not any(isinstance(op, t.WgmmaOp) for op in step0.walk())


def _simulate_mutant(nq: int = 300, nk: int = 600, defer: int = 3) -> None:
    args = _inputs(nq, nk, 128)
    constants = {**ROTATING, "LSE": 1, "DEFER": defer, **sm90_constants({"TILES": 3})}
    module = lower_kernel(attention_sm90, "sm_90a", constants, aligns=ALIGNS)
    simulate(module, "attention_sm90", args, (sm90_blocks(1, 2, nq, 8, 3),), order="shuffled")
    ref = attention_ref(*args[:3], causal=False, scale=128**-0.5)
    assert rel_err(args[3], ref) < 2e-2, "wrong result"


def test_scores_carried_on_before_their_wait_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutated pass: `wait 1` after the epilogue leaves S_0 (the only wgmma running) in flight while the loop copies
    its registers to the next tile: the simulation reads the poisoned accumulator."""
    monkeypatch.setattr(rotate_tile_loop, "_wait_for_scores", lambda: t.WgmmaWaitOp(1))
    with pytest.raises((SimulationError, AssertionError)):
        _simulate_mutant()


@pytest.mark.parametrize("defer", [3, 4])
def test_scores_from_the_wrong_ring_step_are_caught(monkeypatch: pytest.MonkeyPatch, defer: int) -> None:
    """Mutated pass: the next tile's S_0 waits for and reads this tile's ring step 0 (the ring's base not advanced),
    a stage refilled long since: verify-tma-pipeline says so (and without it the simulation fails: a wait that
    never ends, or wrong scores)."""
    from tkc.passes import verify_tma_pipeline

    original = rotate_tile_loop._ahead
    monkeypatch.setattr(rotate_tile_loop, "_ahead",
                        lambda loop, nxt: {k: v for k, v in original(loop, nxt).items() if k is loop.body.block.args[0]})
    with pytest.raises(TkcError, match="ring step other than the next tile's first"):
        _simulate_mutant(defer=defer)
    monkeypatch.setattr(verify_tma_pipeline, "_check_rotated", lambda loop: None)
    with pytest.raises((SimulationError, AssertionError)):
        _simulate_mutant(defer=defer)


def test_a_tile_ring_read_ahead_for_the_wrong_tile_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutated pass: the queries read ahead are the current tile's (its index for the tile ring's wait)."""
    original = rotate_tile_loop._ahead
    monkeypatch.setattr(rotate_tile_loop, "_ahead",
                        lambda loop, nxt: {**original(loop, nxt), loop.body.block.args[0]: loop.body.block.args[0]})
    with pytest.raises(TkcError, match="tile ring other than the next tile's"):
        _simulate_mutant()


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("causal, lse, defer", [(0, 0, 3), (1, 1, 3), (0, 0, 4), (1, 1, 4)])
def test_the_rotated_kernel_assembles_cleanly(causal: int, lse: int, defer: int) -> None:
    """No spills, no stack, and none of ptxas's wgmma serialization notes (S_0's registers cross the loop only
    after their wait)."""
    compiled = compile_for_launch(attention_sm90, "sm_90a", {**ROTATING, "CAUSAL": causal, "LSE": lse, "DEFER": defer},
                                  ALIGNS)
    (report,) = ptxas.assemble(compiled.ptx, "sm_90a").values()
    assert report.spill_stores == 0 and report.spill_loads == 0 and report.stack_bytes == 0, report.log
    assert not report.notes and not any(c in report.log for c in ("C7508", "C7509", "C7511", "C7515")), report.log


def test_rotation_without_queries_in_registers_is_one_clear_error() -> None:
    with pytest.raises(TkcError, match="Q_REGS=1"):
        lower_kernel(attention_sm90, "sm_90a", {**ROTATING, "Q_REGS": 0})


def test_next_scores_read_before_their_wait_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutated pass (defer=4): `wait 2` after S_0′ and the last P·V leaves both running while S_0′'s softmax reads
    it: the simulation reads the poisoned accumulator."""
    monkeypatch.setattr(rotate_tile_loop, "_wait_for_next_scores", lambda: t.WgmmaWaitOp(2))
    with pytest.raises((SimulationError, AssertionError)):
        _simulate_mutant(defer=4)


def test_the_whole_step_ahead_runs_its_softmax_under_the_last_pv() -> None:
    """defer=4: after the key loop, one if issues S_0′, then the last P·V, waits for one group, runs the softmax,
    waits for the other, stores O, and gives back the queries' stage; the tile's own step 0 is gone."""
    module = build_module([attention_sm90], "sm_90a", {**ROTATING, "DEFER": 4})
    run_passes(module, parse_pipeline(PREFIX + ",rotate-tile-loop"), Dumps(None), PassTimer(False))
    loop = next(op for op in module.walk() if isinstance(op, scf.ForOp) and rotate_tile_loop.ROTATE_ATTR in op.attributes)
    assert not any("tkc.peeled_step" in op.attributes for op in loop.body.block.ops)
    fast = [op for op in loop.body.block.ops if rotate_tile_loop.ROTATED in op.attributes][-1]
    kinds = [op.name for op in fast.true_region.block.ops
             if op.name in ("tile.wgmma_ABt", "tile.wgmma_AB", "tile.wgmma_wait", "tile.row_max", "tile.store")]
    assert kinds == ["tile.wgmma_ABt", "tile.wgmma_AB", "tile.wgmma_wait", "tile.row_max", "tile.wgmma_wait",
                     "tile.store"]
    assert [op.pending.value.data for op in fast.true_region.block.ops if isinstance(op, t.WgmmaWaitOp)] == [1, 0]


@pytest.mark.parametrize("defer", [3, 4])
def test_the_configuration_wrong_on_the_h200_survives_fine_interleaving(defer: int) -> None:
    """D=64, 128-key steps, three tiles a block, causal, B·H = 6 (wrong on the H200 with the queries' stage released
    right after their load, before the proxy fence): warps handed over every 1-47 instructions, with the check for
    TMA loads into bytes an ldmatrix may not have read yet."""
    rng = np.random.default_rng(defer)
    q, k, v = (random_bf16(rng, 2, 3, 300, 64) for _ in range(3))
    args = [q, k, v, poisoned(2, 3, 300, 64), poisoned(2, 3, 300, dtype=np.float32), 64**-0.5]
    constants = {**ROTATING, "D": 64, "CAUSAL": 1, "LSE": 1, "DEFER": defer}
    simulate(lower_kernel(attention_sm90, "sm_90a", constants, aligns=ALIGNS), "attention_sm90", args,
             (sm90_blocks(2, 3, 300, 8, 3),), order="sliced", seed=defer)
    assert rel_err(args[3], attention_ref(q, k, v, causal=True, scale=64**-0.5)) < 2e-2
