"""specialize-warps: a producer warpgroup of its own for a TMA-pipelined loop. The tile interpreter gives the same
answers before and after (the producer's loop runs first there, its loads landing at the consumers' waits); the
PTX simulation runs producer and consumers as the warps they are (mbarrier waits yield) for 0, 1, fewer than
`stages` and many steps; consumer-only barriers are named barriers; mutations hang or are rejected."""

from __future__ import annotations

import numpy as np
import pytest
from reference import random_bf16
from xdsl.dialects import scf

from kernels.producer_sum import producer_sum
from tkc.backend import ptxas
from tkc.backend.ptx_printer import emit_ptx
from tkc.backend.simulator import simulate
from tkc.compiler import Dumps, PassTimer, compile_for_launch, default_pipeline, parse_pipeline, run_passes, specialize_alignment
from tkc.errors import TkcError
from tkc.frontend.kernel import build_module
from tkc.ir import tma_ops as m
from tkc.kernels import attention_sm90, gemm_sm90_kernel
from tkc.passes.specialize_warps import CONSUMER_WARPS, ROLE_ATTR
from tkc.passes.verify_tma_pipeline import verify_tma_pipeline

from .helpers import interpret_module

pytestmark = pytest.mark.filterwarnings("ignore:.*bank conflict")
SPLIT = "canonicalize,cse,insert-tma-pipeline,specialize-warps"


def _expected(x: np.ndarray, n: int) -> np.ndarray:
    total = np.zeros((64, 64), dtype=np.float64)
    for j in range(n):
        total += x[64 * j:64 * (j + 1)].astype(np.float64)
    return np.concatenate([total[48:], total[32:48], total[16:32], total[:16]])  # warp w stores warp 3-w's rows


def _split(stages: int, kernel=producer_sum, constants=None):
    module = build_module([kernel], "sm_90a", constants if constants is not None else {"STAGES": stages})
    specialize_alignment(module, {})
    run_passes(module, parse_pipeline(SPLIT), Dumps(), PassTimer())
    return module


def _rest(module) -> None:
    """The passes after specialize-warps, down to the ptx dialect (without the checker)."""
    rest = default_pipeline("sm_90a").split("verify-tma-pipeline,", 1)[1]
    run_passes(module, parse_pipeline(rest), Dumps(), PassTimer())


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("trips", [0, 1, 2, 3, 6])
def test_split_preserves_semantics(stages: int, trips: int) -> None:
    x = random_bf16(np.random.default_rng(stages + 7 * trips), 64 * 6, 64)
    out = np.full((64, 64), np.nan, dtype=np.float32)
    module = _split(stages)
    verify_tma_pipeline(module)
    got = interpret_module(module, "producer_sum", [x, out, trips], (1,))
    np.testing.assert_allclose(got[1], _expected(x, trips), rtol=1e-5, atol=1e-5)


def test_split_structure() -> None:
    module = _split(3)
    fn = next(iter(module.ops))
    assert fn.attributes["tkc.warps"].value.data == 8 and fn.attributes[CONSUMER_WARPS].value.data == 4
    (split,) = [op for op in fn.walk() if isinstance(op, scf.IfOp) and ROLE_ATTR in op.attributes]
    producer = list(split.true_region.walk())
    consumer = list(split.false_region.walk())
    assert any(isinstance(op, m.StageAcquireOp) for op in producer) and any(isinstance(op, m.TmaLoadOp) for op in producer)
    assert not any(isinstance(op, m.StageWaitOp | m.StageReleaseOp) for op in producer)
    assert not any(isinstance(op, m.StageAcquireOp | m.StageExpectOp | m.TmaLoadOp) for op in consumer)
    assert any(isinstance(op, m.StageWaitOp) for op in consumer)
    # nothing is filled before the loops any more
    assert not [op for op in fn.body.block.ops if isinstance(op, scf.IfOp) and ROLE_ATTR not in op.attributes
                and any(isinstance(o, m.StageExpectOp) for o in op.walk())]


@pytest.mark.parametrize("stages, trips, order", [(2, 0, "ascending"), (2, 5, "shuffled"), (3, 1, "descending"),
                                                  (3, 2, "shuffled"), (4, 6, "ascending")])
def test_specialized_simulated(stages: int, trips: int, order: str) -> None:
    x = random_bf16(np.random.default_rng(stages * trips + 1), 64 * 6, 64)
    out = np.full((64, 64), np.nan, dtype=np.float32)
    module = _split(stages)
    _rest(module)
    simulate(module, "producer_sum", [x, out, trips], (1,), order=order)
    np.testing.assert_allclose(out, _expected(x, trips), rtol=1e-5, atol=1e-5)


def test_consumer_barrier_is_named() -> None:
    module = _split(3)
    _rest(module)
    text = emit_ptx(module, "sm_90a")
    assert "bar.sync 1, 128;" in text  # the consumers' swap through shared memory, without the producer
    assert "setmaxnreg" not in text  # one consumer warpgroup keeps the registers it has


def test_consumer_without_release_hangs_in_simulation() -> None:
    """The mutation: consumers never release; the producer waits forever for the stage of step `stages`."""
    module = _split(2)
    for op in [op for op in module.walk() if isinstance(op, m.StageReleaseOp)]:
        op.detach()
        op.erase()
    with pytest.raises(TkcError, match="release one step per iteration"):
        verify_tma_pipeline(module)
    _rest(module)
    x = random_bf16(np.random.default_rng(0), 64 * 6, 64)
    with pytest.raises(TkcError, match="hang on the GPU"):
        simulate(module, "producer_sum", [x, np.zeros((64, 64), np.float32), 5], (1,))


def test_checker_producer_runs_other_steps() -> None:
    module = _split(3)
    split = next(op for op in module.walk() if isinstance(op, scf.IfOp) and ROLE_ATTR in op.attributes)
    producer_loop = next(op for op in split.true_region.walk() if isinstance(op, scf.ForOp))
    consumer_loop = next(op for op in split.false_region.walk() if isinstance(op, scf.ForOp))
    producer_loop.operands[1] = consumer_loop.lb  # runs no steps
    with pytest.raises(TkcError, match="run different steps"):
        verify_tma_pipeline(module)


def test_specialized_gemm_gets_registers() -> None:
    """Two consumer warpgroups: producer 40 and consumers 232 registers (168 at entry), which ptxas honours."""
    if ptxas.find_ptxas() is None:
        pytest.skip("ptxas not installed")
    compiled = compile_for_launch(gemm_sm90_kernel, "sm_90a",
                                  {"BN": 256, "BK": 64, "WARPS": 8, "STAGES": 4, "PRODUCER": 1}, {})
    assert compiled.threads == 384
    assert "setmaxnreg.dec.sync.aligned.u32 40;" in compiled.ptx and "setmaxnreg.inc.sync.aligned.u32 232;" in compiled.ptx
    (report,) = ptxas.assemble(compiled.ptx, "sm_90a").values()
    assert report.registers == 168 and report.spill_stores == 0 and not report.notes, report.log


def test_a_lean_producer_leaves_the_consumers_more_registers() -> None:
    """producer=2: the producer warpgroup keeps 24 registers, the two consumer warpgroups get 240 (FlashAttention-3's
    two-stage pipelining at D=64 with 128-key steps fits without spills only so)."""
    if ptxas.find_ptxas() is None:
        pytest.skip("ptxas not installed")
    constants = {"D": 64, "KEYS": 128, "WARPS": 8, "DEFER": 1, "OVERLAP": 1, "PRODUCER": 2}
    compiled = compile_for_launch(attention_sm90, "sm_90a", constants, {p.name: 16 for p in attention_sm90.runtime_params if p.kind == "tensor"})
    assert "setmaxnreg.dec.sync.aligned.u32 24;" in compiled.ptx and "setmaxnreg.inc.sync.aligned.u32 240;" in compiled.ptx
    (report,) = ptxas.assemble(compiled.ptx, "sm_90a").values()
    assert report.spill_stores == 0 and not report.notes, report.log


def test_two_blocks_an_sm_split_their_registers() -> None:
    """blocks_per_sm=2 with one consumer warpgroup and a lean producer: 128 registers a thread at entry (two blocks
    of 256 threads fill the register file), then 24 for the producer and 232 for the consumers, which ptxas
    honours (.minnctapersm 2); without blocks_per_sm a lone consumer warpgroup keeps what it has."""
    if ptxas.find_ptxas() is None:
        pytest.skip("ptxas not installed")
    constants = {"D": 64, "KEYS": 128, "WARPS": 4, "DEFER": 2, "PRODUCER": 2, "Q_REGS": 1, "BLOCKS": 2}
    aligns = {p.name: 16 for p in attention_sm90.runtime_params if p.kind == "tensor"}
    compiled = compile_for_launch(attention_sm90, "sm_90a", constants, aligns)
    assert compiled.threads == 256 and ".minnctapersm 2" in compiled.ptx
    assert "setmaxnreg.dec.sync.aligned.u32 24;" in compiled.ptx and "setmaxnreg.inc.sync.aligned.u32 232;" in compiled.ptx
    (report,) = ptxas.assemble(compiled.ptx, "sm_90a").values()
    assert report.registers <= 128 and report.spill_stores == 0 and not report.notes, report.log
    alone = compile_for_launch(attention_sm90, "sm_90a", {**constants, "BLOCKS": 0}, aligns)
    assert "setmaxnreg" not in alone.ptx and ".minnctapersm" not in alone.ptx


def test_producer_needs_a_tma_loop() -> None:
    module = build_module([producer_sum], "sm_90a", {})
    specialize_alignment(module, {"X": 2})  # rows not 16-byte aligned: no TMA ring to specialize
    with pytest.raises(TkcError, match="needs one TMA-pipelined loop"):
        run_passes(module, parse_pipeline(SPLIT), Dumps(), PassTimer())



@pytest.mark.parametrize("defer", [0, 1])
def test_a_plain_load_in_the_consumer_role_is_shared_by_the_consumers(defer: int) -> None:
    """A persistent attention whose consumer warps load each tile's queries into shared memory themselves (rows 8-byte
    aligned: no TMA): the copy is spread over the 256 consumer threads (spread over the block's 384, a third of the
    tile was never loaded and two warps' rows came out NaN). Simulated with the producer, against the interpreter,
    across tiles."""
    from backend.test_simulate import run_both
    from kernels.persistent_attention import persistent_attention
    from reference import attention_ref, poisoned, rel_err

    rng = np.random.default_rng(defer)
    q = random_bf16(rng, 1, 2, 256, 68)[..., :64]  # rows 136 bytes apart
    k, v = random_bf16(rng, 1, 2, 320, 64), random_bf16(rng, 1, 2, 320, 64)
    args = [q, k, v, poisoned(1, 2, 256, 64), 0.125]
    interp, sim = run_both(persistent_attention, args, (3,), {"PRODUCER": 1, "DEFER": defer}, target="sm_90a",
                           order="shuffled")
    assert rel_err(interp[3], attention_ref(q, k, v, causal=False, scale=0.125)) < 2e-2
    assert rel_err(sim[3], interp[3]) < 2e-3


def test_loads_only_the_consumers_read_move_into_their_branch() -> None:
    """Queries TMA cannot load (rows 8-byte aligned: a global→shared load in the tile loop, and its warpgroup view)
    move into the consumers' branch: the producer streams K and V at once, not after the queries and a block
    barrier."""
    from kernels.persistent_attention import persistent_attention

    from tkc.ir import ops as t

    module = build_module([persistent_attention], "sm_90a", {"DEFER": 1, "PRODUCER": 1})
    specialize_alignment(module, {"Q": 8})
    run_passes(module, parse_pipeline(SPLIT), Dumps(None), PassTimer(False))
    split = next(op for op in module.walk() if isinstance(op, scf.IfOp) and ROLE_ATTR in op.attributes)
    loads = [op for op in module.walk() if isinstance(op, t.LoadOp) and op.source.type.name == "tile.gl"]
    assert loads and all(op in list(split.false_region.walk()) for op in loads)


@pytest.mark.parametrize("tiles, defer, stages, q_regs", [(2, 0, 2, 0), (3, 1, 3, 0), (2, 1, 2, 0), (3, 1, 3, 1)])
def test_the_producer_fills_a_tile_loop_ring_too(tiles: int, defer: int, stages: int, q_regs: int) -> None:
    """attention_sm90 with `tiles` query blocks per block (a smaller grid): a tile loop with a ring of its own (the queries, tile after
    tile) around the keys' ring. The producer loads tile t's queries at the start of its tile t, then its keys;
    the consumers only wait for and release them. The ring has two stages where the queries are read from shared memory
    to the tile's end (the next tile's load runs during this one), one where they move into registers at the tile's start
    (released then, refilled during it). Simulated in shuffled warp order against the interpreter, which agrees with
    float64."""
    from backend.test_simulate import run_both
    from reference import attention_ref, poisoned, rel_err

    from tkc.kernels import attention_sm90
    from tkc.kernels.attention import sm90_blocks

    rng = np.random.default_rng(tiles)
    nq, nk = 300, 200
    q, k, v = random_bf16(rng, 1, 2, nq, 64), random_bf16(rng, 1, 2, nk, 64), random_bf16(rng, 1, 2, nk, 64)
    constants = {"D": 64, "KEYS": 64, "WARPS": 8, "STAGES": stages, "PRODUCER": 1, "DEFER": defer, "Q_REGS": q_regs,
                 "LSE": 1}
    module = build_module([attention_sm90], "sm_90a", constants)
    run_passes(module, parse_pipeline(SPLIT), Dumps(None), PassTimer(False))
    split = next(op for op in module.walk() if isinstance(op, scf.IfOp) and ROLE_ATTR in op.attributes)
    assert sum(isinstance(op, m.TmaLoadOp) for op in split.true_region.walk()) == 3  # Q, K, V: all the producer's
    assert not any(isinstance(op, m.TmaLoadOp) for op in split.false_region.walk())
    rings = [op.result.type for op in module.walk() if op.name == "tile.ring_alloc"]
    assert sorted(r.stages.data for r in rings) == sorted([1 if q_regs else 2, stages, stages])
    args = [q, k, v, poisoned(1, 2, nq, 64), poisoned(1, 2, nq, dtype=np.float32), 0.125]
    interp, sim = run_both(attention_sm90, args, (sm90_blocks(1, 2, nq, 8, tiles),), constants, target="sm_90a",
                           order="shuffled")
    ref, ref_lse = attention_ref(q, k, v, causal=False, scale=0.125, lse=True)
    assert rel_err(interp[3], ref) < 2e-2
    assert rel_err(sim[3], interp[3]) < 2e-3 and rel_err(sim[4], ref_lse) < 1e-4
