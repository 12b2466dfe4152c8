"""sm_90a kernels for the Hopper tests, on the CPU (ptxas, simulator) and on the GPU: a hand-built `ptx` kernel of
TMA + mbarrier + wgmma, and DSL kernels that use wgmma through `mma_AB` / `mma_ABt` on shared tiles."""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import BFloat16Type, ModuleOp
from xdsl.ir import Block

import tkc
from tkc.backend import ptx, wgmma
from tkc.backend.ptx import PerInstr, instr, regs
from tkc.ir.types import SharedTileType
from tkc.lang import bf16, block_idx, cdiv, const, f32, gl, load, mma_AB, mma_ABt, mma_AtB, mma_AtBt, rt, st, store, warp_id, zeros

TILE = SharedTileType(BFloat16Type(), 64, 64, 128)
A_AT, B_AT, BAR_AT = 0, 8192, 16384
SHARED_BYTES = BAR_AT + 8 + 1024  # + room to align the base to 1024


def tma_wgmma_kernel() -> ModuleOp:
    """One warpgroup: thread 0 sets up an mbarrier and loads A and B (64×64 bf16, 128-byte swizzle) by TMA; all
    wait for the phase, run four m64n64k16 wgmmas (A·Bᵀ, both K-major) and store the accumulators."""
    body = Block()

    def emit(op):
        body.add_op(op)
        return op.results[0] if op.results else None

    smem = emit(ptx.SpecialOp("smem"))
    base = emit(instr("and.b32", regs("b32", 1), emit(instr("add.u32", regs("b32", 1), smem, 1023)), -1024))
    tid = emit(ptx.SpecialOp("%tid.x"))
    first = emit(instr("setp.eq.u32", regs("pred", 1), tid, 0))
    maps = [emit(ptx.ParamAddrOp(name)) for name in ("tA", "tB")]

    emit(ptx.MbarrierOp("init", base, offset=BAR_AT, count=1, guard=first))
    emit(ptx.FenceOp("mbarrier_init.release.cluster"))
    emit(ptx.BarSyncOp(0))

    emit(ptx.MbarrierOp("arrive_expect_tx", base, offset=BAR_AT, count=2 * 64 * 64 * 2, guard=first))
    coords = emit(instr("mov.b32", regs("b32", 2), PerInstr([0, 0])))
    emit(ptx.TmaLoadOp(base, 0, A_AT, maps[0], coords, [0, 1], base, 0, BAR_AT, guard=first))
    emit(ptx.TmaLoadOp(base, 0, B_AT, maps[1], coords, [0, 1], base, 0, BAR_AT, guard=first))

    parity = emit(instr("mov.b32", regs("b32", 1), 0))
    emit(ptx.LabelOp("WAIT"))
    done = emit(ptx.MbarrierOp("try_wait", base, offset=BAR_AT, parity=parity))
    emit(ptx.BraOp("WAIT", done, negate=True))

    def descriptors(at: int):
        start = emit(instr("add.u32", regs("b32", 1), base, at))
        field = emit(instr("and.b32", regs("b32", 1), emit(instr("shr.u32", regs("b32", 1), start, 4)), 0x3FFF))
        wide = emit(instr("cvt.u64.u32", regs("b64", 1), field))
        template = wgmma.operand_descriptor(TILE, 0, 0, "K")
        first_desc = emit(instr("or.b64", regs("b64", 1), wide, template))
        steps = [wgmma.operand_descriptor(TILE, 0, c, "K") - template for c in range(4)]
        return emit(instr("add.s64", regs("b64", 4), (first_desc, np.zeros(4, dtype=np.int64)), PerInstr(steps)))

    desc_a, desc_b = descriptors(A_AT), descriptors(B_AT)
    acc = emit(ptx.RegsOp("b32", 32))
    emit(ptx.WgmmaSyncOp("fence"))
    for k in range(4):
        body.add_op(ptx.WgmmaOp(64, acc, range(32), desc_a, [k], desc_b, k, scale_d=int(k > 0)))
    emit(ptx.WgmmaSyncOp("commit"))
    emit(ptx.WgmmaSyncOp("wait", 0))

    out = emit(ptx.ParamOp("out", "u64"))
    offset = emit(instr("mul.wide.u32", regs("b64", 1), tid, 128))
    addr = emit(instr("add.s64", regs("b64", 1), out, offset))
    body.add_op(ptx.StoreOp("global", "f32", 1, addr, [0] * 32, [4 * i for i in range(32)], acc, range(32)))
    emit(ptx.RetOp())
    kernel = ptx.KernelOp("tma_wgmma", [("tA", "tensormap"), ("tB", "tensormap"), ("out", "u64")], 128, body)
    module = ModuleOp([kernel])
    module.verify()
    return module


@tkc.kernel(warps=4, stages="STAGES", min_target="sm_90a")
def warpgroup_gemm(A: gl[bf16, 2], B: gl[bf16, 2], C: gl[bf16, 2], BN: const = 64, BK: const = 64,
                   TRANS_B: const = 0, STAGES: const = 3, TRANS_A: const = 0):
    """One warpgroup per 64×BN tile of C: A and B staged in shared memory (pipelined), multiplied by wgmma. With
    TRANS_A, A is given K×M (C = Aᵀ·B: the wgmma reads A's tile transposed)."""
    bm, bn = block_idx()[0], block_idx()[1]
    acc = zeros(rt[f32, 16, BN])
    for k in range(cdiv(A.shape[0] if TRANS_A else A.shape[1], BK)):
        if TRANS_A:
            a = load(A, (k, bm), st[bf16, BK, 64])
            if TRANS_B:
                acc = mma_AtBt(a, load(B, (bn, k), st[bf16, BN, BK]), acc)
            else:
                acc = mma_AtB(a, load(B, (k, bn), st[bf16, BK, BN]), acc)
        else:
            a = load(A, (bm, k), st[bf16, 64, BK])
            if TRANS_B:
                acc = mma_ABt(a, load(B, (bn, k), st[bf16, BN, BK]), acc)
            else:
                acc = mma_AB(a, load(B, (k, bn), st[bf16, BK, BN]), acc)
    store(C, acc.to(bf16), (bm * 4 + warp_id(), bn))


@tkc.kernel(warps=4, min_target="sm_90a")
def register_a_gemm(A: gl[bf16, 2], B: gl[bf16, 2], C: gl[bf16, 2], BN: const = 64, TRANS_B: const = 0,
                    VIA_SHARED: const = 0):
    """wgmma with A in registers: each warp holds its 16 rows of the warpgroup's 64 (read straight from global
    memory, or through shared memory and ldmatrix with VIA_SHARED); B from shared memory."""
    bm, bn = block_idx()[0], block_idx()[1]
    acc = zeros(rt[f32, 16, BN])
    for k in range(cdiv(A.shape[1], 64)):
        if VIA_SHARED:
            a = load(load(A, (bm, k), st[bf16, 64, 64]), (warp_id(), 0), rt[bf16, 16, 64])
        else:
            a = load(A, (bm * 4 + warp_id(), k), rt[bf16, 16, 64])
        if TRANS_B:
            acc = mma_ABt(a, load(B, (bn, k), st[bf16, BN, 64]), acc)
        else:
            acc = mma_AB(a, load(B, (k, bn), st[bf16, 64, BN]), acc)
    store(C, acc.to(bf16), (bm * 4 + warp_id(), bn))


@tkc.kernel(warps=4, min_target="sm_90a")
def two_products(A: gl[bf16, 2], B: gl[bf16, 2], D: gl[bf16, 2], C: gl[f32, 2], READ_BETWEEN: const = 0):
    """C = 2·(A·Bᵀ) + A·Dᵀ for one 64×64 block: two independent wgmmas back to back (as the dK/dV block's Sᵀ and dPᵀ
    parts), the first waited for by the second's wait; READ_BETWEEN=1 doubles the first product between the two,
    which must then wait for it first."""
    a, b, d = load(A, (0, 0), st[bf16, 64, 64]), load(B, (0, 0), st[bf16, 64, 64]), load(D, (0, 0), st[bf16, 64, 64])
    s = mma_ABt(a, b, zeros(rt[f32, 16, 64]))
    if READ_BETWEEN:
        s = s * 2.0
    t = mma_ABt(a, d, zeros(rt[f32, 16, 64]))
    store(C, s * (1.0 if READ_BETWEEN else 2.0) + t, (warp_id(), 0))


@tkc.kernel(warps=4, stages=2, min_target="sm_90a")
def typed_gemm(A: gl["DT", 2], B: gl["DT", 2], C: gl[f32, 2], BK: const = 64, DT: const = bf16):
    """C (f32) = A · Bᵀ on wgmma for A (M×K) and B (N×K) of dtype DT (f16, or fp8 with K in steps of 32): one
    warpgroup a 64×64 tile of C."""
    bm, bn = block_idx()[0], block_idx()[1]
    acc = zeros(rt[f32, 16, 64])
    for k in range(cdiv(A.shape[1], BK)):
        acc = mma_ABt(load(A, (bm, k), st[DT, 64, BK]), load(B, (bn, k), st[DT, 64, BK]), acc)
    store(C, acc, (bm * 4 + warp_id(), bn))


def simulated_attention_sm90_error(constants: dict[str, int], n: int, seed: int, grid: int = 2) -> float:
    """attention_sm90 with `constants` (D and CAUSAL among them) lowered for sm_90a and simulated, its warps in
    shuffled order, on fresh inputs of one batch, two heads and `n` rows, on `grid` blocks (fewer than the tiles:
    each block takes several): ‖O − ref‖ / ‖ref‖ against float64 (a poisoned O left unwritten reads infinite)."""
    from reference import attention_ref, poisoned, random_bf16, rel_err

    from tkc.backend.simulator import simulate
    from tkc.compiler import lower_kernel
    from tkc.kernels import attention_sm90

    d, causal = constants["D"], bool(constants.get("CAUSAL", 0))
    rng = np.random.default_rng(seed)
    q, k, v = (random_bf16(rng, 1, 2, n, d) for _ in range(3))
    args = [q, k, v, poisoned(1, 2, n, d), poisoned(1, 2, n, dtype=np.float32), d**-0.5]
    module = lower_kernel(attention_sm90, "sm_90a", constants, aligns={"Q": 16, "K": 16, "V": 16, "O": 16, "L": 4})
    simulate(module, "attention_sm90", args, (grid,), order="shuffled")
    return rel_err(args[3], attention_ref(q, k, v, causal=causal, scale=d**-0.5))
