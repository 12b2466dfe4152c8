"""insert-tma-pipeline (sm_90a) and its static checker: the ring is correct when the loop runs 0, 1, fewer times
than there are stages, or many times, in the tile interpreter (data lands at the step's wait) and in the PTX
simulation (TMA boxes land when the mbarrier phase completes); mutated protocols are rejected by the checker,
the interpreter or the simulator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st_
from reference import random_bf16, rel_err
from xdsl.dialects import arith, scf

from kernels.pipelined_sum import column_block_sum, paged_block_sum
from tkc.backend import ptx
from tkc.backend.simulator import simulate
from tkc.compiler import Dumps, PassTimer, default_pipeline, lower_kernel, parse_pipeline, run_passes, specialize_alignment, tensor_alignment
from tkc.errors import TkcError
from tkc.frontend.kernel import build_module
from tkc.ir import tma_ops as m
from tkc.kernels import gemm_kernel, gemm_sm90_kernel
from tkc.passes import insert_tma_pipeline
from tkc.passes.verify_tma_pipeline import verify_tma_pipeline

from .helpers import interpret_module

PREFIX = "canonicalize,cse"


def _module(kernel, constants=None, pipeline="insert-tma-pipeline"):
    module = build_module([kernel], "sm_90a", constants)
    specialize_alignment(module, {})
    run_passes(module, parse_pipeline(PREFIX), Dumps(), PassTimer())
    before = module.clone()
    run_passes(module, parse_pipeline(pipeline), Dumps(), PassTimer())
    return before, module


def _expected(x: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((64, 64), dtype=np.float64)
    for j in range(n):
        out += x[64 * j:64 * (j + 1)].astype(np.float64)
    return out


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("trips", [0, 1, 2, 3, 6])
def test_tma_ring_any_trip_count(stages: int, trips: int) -> None:
    rng = np.random.default_rng(stages * 10 + trips)
    x = random_bf16(rng, 64 * 6, 64)
    out = np.full((64, 64), np.nan, dtype=np.float32)
    before, after = _module(column_block_sum, pipeline=f"insert-tma-pipeline{{stages={stages}}},verify-tma-pipeline")
    assert any(isinstance(op, m.TmaLoadOp) for op in after.walk())
    ref = interpret_module(before, "column_block_sum", [x, out, trips], (1,))
    got = interpret_module(after, "column_block_sum", [x, out, trips], (1,))
    np.testing.assert_allclose(ref[1], _expected(x, trips), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], ref[1])


@settings(max_examples=12, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate])
@given(stages=st_.integers(2, 4), trips=st_.integers(0, 9), seed=st_.integers(0, 2**16))
def test_tma_ring_reads_a_page_table_ahead(stages: int, trips: int, seed: int) -> None:
    """A TMA load whose block a page table read in the loop names (Pages[j], never written by the kernel): the
    ring's refills read the table again for their step; before and after the pass, in the interpreter, on random
    tables (pages in any order, repeated too)."""
    rng = np.random.default_rng(seed)
    x = random_bf16(rng, 64 * 7, 64)
    pages = rng.integers(0, 7, 10).astype(np.int32)
    out = np.full((64, 64), np.nan, dtype=np.float32)
    before, after = _module(paged_block_sum, pipeline=f"insert-tma-pipeline{{stages={stages}}},verify-tma-pipeline")
    assert any(isinstance(op, m.TmaLoadOp) for op in after.walk())
    ref = interpret_module(before, "paged_block_sum", [x, pages, out, trips], (1,))
    got = interpret_module(after, "paged_block_sum", [x, pages, out, trips], (1,))
    want = sum((x[64 * p:64 * (p + 1)].astype(np.float64) for p in pages[:trips]), np.zeros((64, 64)))
    np.testing.assert_allclose(ref[2], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[2], ref[2])


@pytest.mark.parametrize("stages, trips, order", [(2, 0, "ascending"), (3, 1, "shuffled"), (3, 2, "descending"),
                                                  (4, 6, "shuffled")])
def test_tma_ring_simulated(stages: int, trips: int, order: str) -> None:
    """ldmatrix readers of TMA-filled swizzled stages; every thread releases, warp 0 refills."""
    rng = np.random.default_rng(stages + trips)
    x = random_bf16(rng, 64 * 6, 64)
    out = np.full((64, 64), np.nan, dtype=np.float32)
    module = lower_kernel(column_block_sum, "sm_90a", pipeline=default_pipeline("sm_90a", stages))
    assert any(isinstance(op, ptx.TmaLoadOp) for op in module.walk())
    simulate(module, "column_block_sum", [x, out, trips], (1,), order=order)
    np.testing.assert_allclose(out, _expected(x, trips), rtol=1e-5, atol=1e-5)


@settings(max_examples=10, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate])
@given(m_=st_.integers(1, 200), n=st_.integers(1, 200), k8=st_.integers(0, 40), trans_b=st_.sampled_from([0, 1]),
       stages=st_.integers(2, 4), wgmma=st_.booleans(), seed=st_.integers(0, 2**16))
def test_tma_pass_preserves_gemm(m_: int, n: int, k8: int, trans_b: int, stages: int, wgmma: bool, seed: int) -> None:
    """Before and after the pass, in the interpreter: the mma.sync GEMM and the wgmma GEMM at random shapes whose
    rows are 16-byte aligned (K a multiple of 8), K = 0 included (the loop does not run)."""
    k = 8 * k8
    rng = np.random.default_rng(seed)
    a = random_bf16(rng, m_, k)
    b = random_bf16(rng, n, k) if trans_b else random_bf16(rng, k, n)
    c = np.full((m_, n), np.nan, dtype=a.dtype)
    if wgmma:
        kernel, consts = gemm_sm90_kernel, {"BN": 64, "BK": 32, "WARPS": 4, "STAGES": stages, "TRANS_B": trans_b}
        grid = (-(-m_ // 64) * -(-n // 64),)
    else:
        kernel, consts = gemm_kernel, {"BM": 64, "BN": 64, "BK": 32, "STAGES": stages, "TRANS_B": trans_b}
        grid = (-(-m_ // 64) * -(-n // 64),)
    before, after = _module(kernel, consts, "insert-tma-pipeline,verify-tma-pipeline")
    assert any(isinstance(op, m.TmaLoadOp) for op in after.walk())
    ref = interpret_module(before, kernel.name, [a, b, c], grid)
    got = interpret_module(after, kernel.name, [a, b, c], grid)
    np.testing.assert_array_equal(got[2].astype(np.float32), ref[2].astype(np.float32))


def test_unaligned_tensors_keep_cp_async() -> None:
    module = build_module([gemm_kernel], "sm_90a", {})
    specialize_alignment(module, {"A": 2})
    run_passes(module, parse_pipeline(PREFIX + ",insert-tma-pipeline"), Dumps(), PassTimer())
    assert not any(isinstance(op, m.TmaLoadOp) for op in module.walk())


def test_sm80_has_no_tma() -> None:
    module = build_module([gemm_kernel], "sm_80", {})
    specialize_alignment(module, {})
    run_passes(module, parse_pipeline(PREFIX + ",insert-tma-pipeline"), Dumps(), PassTimer())
    assert not any(isinstance(op, m.TmaLoadOp) for op in module.walk())


# --------------------------------------------------------------------------------------------------------------
# The checker rejects mutated protocols


def _pipelined(kernel=gemm_sm90_kernel, consts=None):
    _, module = _module(kernel, {"BN": 64, "BK": 32, "WARPS": 4, "STAGES": 3} if consts is None else consts)
    verify_tma_pipeline(module)  # as the pass wrote it
    return module


def _ops(module, cls):
    return [op for op in module.walk() if isinstance(op, cls)]


def test_checker_wrong_byte_count() -> None:
    module = _pipelined()
    from xdsl.dialects.builtin import IntegerAttr

    _ops(module, m.StageExpectOp)[0].nbytes = IntegerAttr(1000, 64)
    with pytest.raises(TkcError, match="announces 1000 bytes"):
        verify_tma_pipeline(module)


def test_checker_missing_acquire() -> None:
    module = _pipelined()
    acquire = _ops(module, m.StageAcquireOp)[0]
    acquire.detach()
    acquire.erase()
    with pytest.raises(TkcError, match="before its stage is acquired"):
        verify_tma_pipeline(module)


def test_checker_refill_too_far_ahead() -> None:
    """Refilling step k + stages (the stage step k is reading) instead of k + stages - 1."""
    module = _pipelined()
    expect = next(op for op in _ops(module, m.StageExpectOp)  # the refill inside the pipelined loop
                  if any(isinstance(o, m.StageWaitOp) for o in op.parent_op().parent_block().ops))
    from xdsl.dialects.builtin import IntegerAttr, i32

    ahead = arith.ConstantOp(IntegerAttr(3, i32))
    expect.step.owner.parent_block().insert_op_before(ahead, expect.step.owner)
    expect.step.owner.operands[1] = ahead.result
    with pytest.raises(TkcError, match="steps 0..2 must be filled before it|would deadlock"):
        verify_tma_pipeline(module)


def test_checker_missing_prologue_fill() -> None:
    module = _pipelined()
    first_fill = next(op for op in _ops(module, scf.IfOp) if any(isinstance(o, m.StageExpectOp) for o in op.walk())
                      and not any(isinstance(o, m.StageWaitOp) for o in op.parent_block().ops))
    first_fill.detach()
    first_fill.erase(safe_erase=False)
    with pytest.raises(TkcError, match="must be filled before it"):
        verify_tma_pipeline(module)


def test_checker_release_before_last_read() -> None:
    module = _pipelined(column_block_sum, {})
    release = _ops(module, m.StageReleaseOp)[0]
    wait = _ops(module, m.StageWaitOp)[0]
    release.detach()
    wait.parent_block().insert_op_after(release, wait)
    with pytest.raises(TkcError, match="released before the last read"):
        verify_tma_pipeline(module)


def test_checker_arrival_count() -> None:
    module = _pipelined()
    bars = _ops(module, m.StageBarriersOp)[0]
    from xdsl.rewriter import Rewriter

    Rewriter.replace_value_with_new_type(bars.result, m.StageBarriersType(3, 32))
    with pytest.raises(TkcError, match="released by 32 threads but the block has 128"):
        verify_tma_pipeline(module)


def test_interpreter_catches_wrong_byte_count() -> None:
    """Without the checker, the interpreter still refuses a phase whose bytes never arrive."""
    module = _pipelined(column_block_sum, {})
    from xdsl.dialects.builtin import IntegerAttr

    for op in _ops(module, m.StageExpectOp):
        op.nbytes = IntegerAttr(op.nbytes.value.data + 16, 64)
    x = random_bf16(np.random.default_rng(0), 128, 64)
    with pytest.raises(TkcError, match="announced 8208 bytes but its TMA loads bring 8192"):
        interpret_module(module, "column_block_sum", [x, np.zeros((64, 64), np.float32), 2], (1,))


def test_simulator_catches_refill_under_running_wgmma(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutation: release each step as soon as its wgmma is issued while the lowering leaves that wgmma
    running (the pass would release it one step later): the TMA refill writes bytes the wgmma still reads."""
    monkeypatch.setattr(insert_tma_pipeline, "_release_lags", lambda loop: False)
    rng = np.random.default_rng(5)
    a, b = random_bf16(rng, 64, 256), random_bf16(rng, 256, 64)
    c = np.full((64, 64), np.nan, dtype=a.dtype)
    module = lower_kernel(gemm_sm90_kernel, "sm_90a", {"BN": 64, "BK": 32, "STAGES": 2})
    with pytest.raises(TkcError, match="TMA load writes shared memory that a wgmma .* still reads"):
        simulate(module, "gemm_sm90_kernel", [a, b, c], (1,))


def test_gemm_on_tma_simulated() -> None:
    """The wgmma GEMM as compiled (TMA ring, wgmma one step in flight, late release) at a ragged shape."""
    rng = np.random.default_rng(9)
    m_, n, k = 100, 130, 200
    a, b = random_bf16(rng, m_, k), random_bf16(rng, k, n)
    c = np.full((m_, n), np.nan, dtype=a.dtype)
    aligns = {"C": tensor_alignment(c)}  # C's rows (260 bytes) take 4-byte stores; A and B are taken as aligned
    module = lower_kernel(gemm_sm90_kernel, "sm_90a", {"BN": 64, "BK": 32, "STAGES": 3}, aligns=aligns)
    assert any(isinstance(op, ptx.TmaLoadOp) for op in module.walk())
    simulate(module, "gemm_sm90_kernel", [a, b, c], (2 * 3,), order="shuffled")
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert rel_err(c, ref) < 1e-2


@pytest.mark.parametrize("kernel_name, d, causal, b, h, n", [("attention_fwd", 64, 0, 1, 2, 128),
                                                           ("attention_fwd", 128, 1, 2, 1, 128),
                                                           ("attention_sm90", 64, 1, 2, 2, 128)])
def test_attention_over_stacked_tensor_maps(kernel_name: str, d: int, causal: int, b: int, h: int, n: int) -> None:
    """K and V of (B, H, N, D) through TMA rings: 3-D maps of the (N, D) matrices stacked over B·H, so that a box
    never reads into the next head. Simulated on sm_90a against the interpreter."""
    import tkc.kernels as kernels
    from backend.test_simulate import run_both
    from reference import attention_ref, poisoned

    kernel = getattr(kernels, kernel_name)
    rng = np.random.default_rng(d + causal + b)
    q, k, v = (random_bf16(rng, b, h, n, d) for _ in range(3))
    if kernel_name == "attention_fwd":
        grid, constants = (n // 64, h, b), {"D": d, "CAUSAL": causal}
    else:
        grid, constants = (n // 64 * h * b,), {"D": d, "CAUSAL": causal, "WARPS": 4}
    module = lower_kernel(kernel, "sm_90a", constants)
    assert any(isinstance(op, ptx.TmaLoadOp) for op in module.walk())
    assert any(name.startswith("K_tmapn_") for name, kind in next(
        op for op in module.walk() if isinstance(op, ptx.KernelOp)).param_list)  # all of K's dimensions
    args = [q, k, v, poisoned(b, h, n, d), d**-0.5]
    if kernel_name == "attention_sm90":
        args.insert(4, poisoned(1, 1, 1, dtype=np.float32))  # no LSE asked for: L is not written
    interp, sim = run_both(kernel, args, grid, constants, target="sm_90a", order="shuffled")
    assert rel_err(interp[3], attention_ref(q, k, v, causal=bool(causal), scale=d**-0.5)) < 2e-2
    assert rel_err(sim[3], interp[3]) < 2e-3


@pytest.mark.parametrize("nq, nk, causal, d", [(113, 113, 0, 64), (17, 200, 1, 64), (130, 70, 1, 128), (1, 1, 0, 64)])
def test_hopper_attention_any_length(nq: int, nk: int, causal: int, d: int) -> None:
    """attention_sm90 at lengths that are not multiples of its tiles, Nq ≠ Nk (causal: key j for query i when
    j ≤ i, as torch), two heads: TMA boxes past a head's end read zeros, the last key block is masked."""
    from backend.test_simulate import run_both
    from reference import attention_ref, poisoned

    from tkc.kernels import attention_sm90

    rng = np.random.default_rng(nq + nk + causal)
    q = random_bf16(rng, 1, 2, nq, d)
    k, v = random_bf16(rng, 1, 2, nk, d), random_bf16(rng, 1, 2, nk, d)
    grid = (2 * -(-nq // 64),)
    lse = poisoned(1, 2, nq, dtype=np.float32)
    interp, sim = run_both(attention_sm90, [q, k, v, poisoned(1, 2, nq, d), lse, d**-0.5], grid,
                           {"D": d, "CAUSAL": causal, "WARPS": 4, "LSE": 1}, target="sm_90a", order="shuffled")
    ref, ref_lse = attention_ref(q, k, v, causal=bool(causal), scale=d**-0.5, lse=True)
    assert rel_err(interp[3], ref) < 2e-2
    assert rel_err(sim[3], interp[3]) < 2e-3
    assert rel_err(interp[4], ref_lse) < 1e-4 and rel_err(sim[4], interp[4]) < 1e-5  # the row log-sum-exp


@pytest.mark.parametrize("d, keys, warps, q_regs, stages", [(64, 128, 8, 0, 2), (64, 128, 8, 1, 1), (128, 64, 8, 0, 2),
                                                            (128, 128, 8, 0, 1), (64, 128, 12, 0, 1)])
def test_tile_loop_ring_stages(d: int, keys: int, warps: int, q_regs: int, stages: int) -> None:
    """attention_sm90's tile loop: queries read from shared memory to the tile's end get two stages (the next tile's
    load runs during this one) where they fit beside the key ring, one where it does not (D=128, 128-key steps:
    64 + 192 KB), where the queries move to registers at the tile's start (released then, refilled meanwhile) or
    with three consumer warpgroups (no registers to spare)."""
    from tkc.ir import async_ops as a
    from tkc.kernels import attention_sm90

    constants = {"D": d, "KEYS": keys, "WARPS": warps, "DEFER": 1, "PRODUCER": 1, "Q_REGS": q_regs}
    module = build_module([attention_sm90], "sm_90a", constants)
    specialize_alignment(module, {p.name: 16 for p in attention_sm90.runtime_params if p.kind == "tensor"})
    run_passes(module, parse_pipeline("insert-tma-pipeline"), Dumps(None), PassTimer(False))
    tile_loop = next(op for op in module.walk() if isinstance(op, scf.ForOp))
    rings = {op.result.type.stages.data for op in module.walk() if isinstance(op, a.RingAllocOp)
             and any(isinstance(u.operation, a.RingReadOp) and u.operation.parent_block() is tile_loop.body.block
                     for u in op.result.uses)}
    assert rings == {stages}


@pytest.mark.parametrize("constants", [
    {"D": 128, "KEYS": 64, "DEFER": 2, "PRODUCER": 1, "TMA_STORE": 1, "STAGES": 4, "ROWSUM_MMA": 1},
    {"D": 128, "KEYS": 128, "DEFER": 1, "PRODUCER": 1, "TMA_STORE": 1, "STAGES": 2, "ROWSUM_MMA": 1}])
def test_a_second_tile_stage_is_taken_only_where_it_fits(constants: dict) -> None:
    """The tile loop's second stage counts what else lives in shared memory (TMA stores' staging tiles, the ones
    tile of ROWSUM_MMA): configurations that fit with one stage still compile (they get one)."""
    from tkc.compiler import compile_for_launch
    from tkc.kernels import attention_sm90

    aligns = {p.name: 16 for p in attention_sm90.runtime_params if p.kind == "tensor"}
    compiled = compile_for_launch(attention_sm90, "sm_90a", {"WARPS": 8, "LSE": 1, **constants}, aligns)
    assert compiled.ptx
