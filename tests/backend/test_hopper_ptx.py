"""The sm_90a instructions of the `ptx` dialect (wgmma, mbarrier, TMA, fences, setmaxnreg, elect): their text,
ptxas accepting a kernel built from them — the shape of the TMA + wgmma kernel that ran on the H200
(shared/docs/hopper-ptx.md §11) — with no spills and none of the wgmma-serialization notes, and the simulator
running it: TMA boxes landing at the mbarrier phase, wgmma through descriptors, premature reads and hangs caught."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hopper_kernels import SHARED_BYTES, tma_wgmma_kernel
from xdsl.dialects.builtin import IntAttr, ModuleOp
from xdsl.ir import Block
from xdsl.utils.exceptions import VerifyException

from tkc.backend import ptx, wgmma
from tkc.backend.ptx_printer import emit_ptx
from tkc.backend.ptxas import assemble, find_ptxas
from tkc.backend.simulator import SimulationError, TensorMap, simulate

def test_hopper_instruction_text() -> None:
    text = emit_ptx(tma_wgmma_kernel(), "sm_90a")
    for line in (
        ".param .align 64 .b8 tA[128]",
        "cvta.param.u64",
        "mbarrier.init.shared::cta.b64 [%r",
        "fence.mbarrier_init.release.cluster;",
        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r",
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r",
        "mbarrier.try_wait.parity.shared::cta.b64 %p",
        "wgmma.fence.sync.aligned;",
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r",
        ", 0, 1, 1, 0, 0;",
        "wgmma.commit_group.sync.aligned;",
        "wgmma.wait_group.sync.aligned 0;",
    ):
        assert line in text, line


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed (pip install nvidia-cuda-nvcc==13.0.88)")
def test_ptxas_accepts_the_tma_wgmma_kernel() -> None:
    report = assemble(emit_ptx(tma_wgmma_kernel(), "sm_90a"), "sm_90a")["tma_wgmma"]
    assert report.spill_stores == 0 and report.stack_bytes == 0, report.log
    assert not {"C7508", "C7511", "C7515"} & set(report.notes), report.log


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed (pip install nvidia-cuda-nvcc==13.0.88)")
def test_setmaxnreg_and_elect_assemble_with_known_entry_registers() -> None:
    body = Block()
    for op in (ptx.ElectOp(), ptx.SetmaxnregOp(False, 40), ptx.SetmaxnregOp(True, 232), ptx.RetOp()):
        body.add_op(op)
    kernel = ptx.KernelOp("roles", [], 384, body, min_blocks=1)
    text = emit_ptx(ModuleOp([kernel]), "sm_90a")
    assert "elect.sync _|%p0, 0xffffffff;" in text and "setmaxnreg.dec.sync.aligned.u32 40;" in text
    report = assemble(text, "sm_90a")["roles"]
    assert "C7508" not in report.notes, report.log


@pytest.mark.parametrize("make, message", [
    (lambda acc, d: ptx.WgmmaOp(64, acc, range(16), d, [0], d), "32 accumulator registers"),
    (lambda acc, d: ptx.WgmmaOp(60, acc, range(30), d, [0], d), "multiple of 8"),
    (lambda acc, d: ptx.SetmaxnregOp(True, 20), "multiple of 8 in 24..256"),
    (lambda acc, d: ptx.WgmmaSyncOp("wait"), "how many groups"),
])
def test_hopper_ops_verify(make, message) -> None:
    body = Block()
    acc = body.add_op(ptx.RegsOp("b32", 32)) or body.last_op.results[0]
    desc = body.add_op(ptx.RegsOp("b64", 1)) or body.last_op.results[0]
    op = make(acc, desc)
    with pytest.raises(VerifyException, match=message):
        op.verify()


def _simulated_product(module: ModuleOp | None = None, order: str = "ascending") -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    a, b = (rng.standard_normal((64, 64)).astype(ml_dtypes.bfloat16) for _ in range(2))
    out = np.full((128, 32), np.nan, dtype=np.float32)
    maps = [TensorMap(a, 64, 64, 128), TensorMap(b, 64, 64, 128)]
    simulate(module or tma_wgmma_kernel(), "tma_wgmma", [*maps, out], (1,), order=order, shared_bytes=SHARED_BYTES)
    rows, cols = wgmma.accumulator_fragment(64)
    d = np.full((64, 64), np.nan, dtype=np.float32)
    d[rows, cols] = out
    return d, a.astype(np.float32) @ b.astype(np.float32).T


def _kernel_ops(module: ModuleOp) -> list:
    return list(module.ops.first.body.block.ops)  # type: ignore[union-attr]


@pytest.mark.parametrize("order", ["ascending", "descending", "shuffled"])
def test_simulated_tma_wgmma_kernel_computes_a_times_b_transposed(order: str) -> None:
    d, ref = _simulated_product(order=order)
    np.testing.assert_allclose(d, ref, rtol=1e-5, atol=1e-4)


def test_reading_accumulators_before_the_wgmma_wait_is_caught() -> None:
    module = tma_wgmma_kernel()
    wait = next(op for op in _kernel_ops(module) if isinstance(op, ptx.WgmmaSyncOp) and op.kind.data == "wait")
    wait.detach()
    wait.erase()
    d, _ = _simulated_product(module)
    assert np.isnan(d).all()


def test_reading_the_tma_destination_before_the_phase_completes_is_caught() -> None:
    module = tma_wgmma_kernel()
    ops = _kernel_ops(module)
    wait = next(op for op in ops if isinstance(op, ptx.MbarrierOp) and op.kind.data == "try_wait")
    branch = ops[ops.index(wait) + 1]
    for op in (branch, wait):  # no waiting at all: the wgmmas read shared memory the boxes have not reached
        op.detach()
        op.erase(safe_erase=False)
    d, _ = _simulated_product(module)
    assert np.isnan(d).all()  # shared memory starts poisoned (NaN) and the boxes land only at the phase


def test_a_wait_for_a_phase_nothing_completes_is_a_hang() -> None:
    module = tma_wgmma_kernel()
    expect = next(op for op in _kernel_ops(module) if isinstance(op, ptx.MbarrierOp) and op.kind.data == "arrive_expect_tx")
    expect.properties["count"] = IntAttr(2 * 64 * 64 * 2 + 16)  # 16 bytes more than the boxes bring
    with pytest.raises(SimulationError, match="every warp waits"):
        _simulated_product(module)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_sm90_kernels_wait_for_their_predecessors_first(target: str) -> None:
    """sm_90 kernels may be launched with programmatic dependent launch (TKC_DEPENDENT_LAUNCH=1): each must release
    the next kernel and wait for the previous one before its first memory access; sm_80 code has neither
    instruction and is launched plainly."""
    from tkc.compiler import compile_for_launch
    from tkc.kernels import layernorm_kernel

    compiled = compile_for_launch(layernorm_kernel, target, {"D": 1024, "WARPS": 2}, {}, None)
    body = [line.strip() for line in compiled.ptx.split("{", 1)[1].splitlines()]
    code = [line for line in body if line and not line.startswith((".reg", "}"))]
    if target == "sm_80":
        assert not any("griddepcontrol" in line for line in code) and not compiled.meta()["dependent_launch"]
        return
    assert code[:2] == ["griddepcontrol.launch_dependents;", "griddepcontrol.wait;"], code[:4]
    assert compiled.meta()["dependent_launch"]
