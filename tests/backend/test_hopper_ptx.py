"""The sm_90a instructions of the `ptx` dialect (wgmma, mbarrier, TMA, fences, setmaxnreg, elect): their text, and
ptxas accepting a kernel built from them — the shape of the TMA + wgmma kernel that ran on the H200
(shared/docs/hopper-ptx.md §11) — with no spills and none of the wgmma-serialization notes."""

from __future__ import annotations

import pytest
from hopper_kernels import tma_wgmma_kernel
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block
from xdsl.utils.exceptions import VerifyException

from tkc.backend import ptx
from tkc.backend.ptx_printer import emit_ptx
from tkc.backend.ptxas import assemble, find_ptxas

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
