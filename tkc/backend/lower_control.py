"""Control flow and synchronization → `ptx` ops: `scf.for` / `scf.if` become labels and uniform branches (their
carried values registers written at the back edge; a small `if` of loads and stores predicated instead; the roles
of a warp-specialized kernel branches of their own, with setmaxnreg), `func.return` the exit; the block's barriers
(`bar.sync`, named per role), the ping-pong warpgroups' turns and the wgmma waits. Registered with lowering.py's
dispatch.

    scf.for %r = %first to %rows step %blocks { ... }
becomes
    "ptx.label"() <{label = "$LOOP_1"}> : () -> ()
    %p = "ptx.op"(%r, %rows) <{opcode = "setp.ge.s32", ...}> : (...) -> !ptx.regs<pred, 1>
    "ptx.bra"(%p) <{target = "$END_2", negate = false}> : (!ptx.regs<pred, 1>) -> ()
    ...                              the body; then %r + %blocks written into %r's register (`into`)
    "ptx.bra"() <{target = "$LOOP_1", negate = false}> : () -> ()
    "ptx.label"() <{label = "$END_2"}> : () -> ()
"""

from __future__ import annotations

from typing import Any

import numpy as np
from xdsl.dialects import func, scf
from xdsl.dialects.builtin import IntegerAttr
from xdsl.ir import Operation, SSAValue

from tkc.backend import ptx
from tkc.backend.index import Leaf
from tkc.errors import TkcError
from tkc.ir import async_ops as a
from tkc.ir import ops as t
from tkc.ir.types import RegTileType
from tkc.backend.lowering import GlobalRef, Imm, KernelLowering, RingRef, SharedRef, handles


@handles(t.BarrierOp)
def _lower_barrier(lw: KernelLowering, op: Operation) -> None:
    if lw.async_proxy_reads:
        # wgmma reads shared memory through the async proxy: what threads wrote (st.shared, cp.async) must be
        # fenced toward it before the barrier that publishes it
        lw.emit(ptx.FenceOp("proxy.async.shared::cta"))
    if lw.role_threads is not None and lw.role_threads != lw.threads:
        # one role of a warp-specialized block: a named barrier of its own threads (1: consumers, 2: producer)
        lw.emit(ptx.BarSyncOp(1 if lw.role_threads == 32 * lw.consumer_warps else 2, lw.role_threads))
    else:
        lw.emit(ptx.BarSyncOp(0))


TURN_BARRIER = 3  # warpgroup 0 waits for its turn at named barrier 3, warpgroup 1 at 4 (1 and 2: warp roles)


def _turn_barriers(lw: KernelLowering) -> tuple[Any, Any]:
    """(the barrier this warpgroup waits at for its turn, the one the other warpgroup waits at)."""
    mine = lw.op("add.u32", "b32", lw.op("and.b32", "b32", lw.expr(Leaf("warp") >> 2), Imm(1)), Imm(TURN_BARRIER))
    return mine, lw.op("xor.b32", "b32", mine, Imm(TURN_BARRIER ^ (TURN_BARRIER + 1)))


@handles(t.TurnWaitOp)
def _lower_turn_wait(lw: KernelLowering, op: Operation) -> None:
    barrier = _turn_barriers(lw)[0]
    following = op.next_op
    if isinstance(following, t.WgmmaOp) and isinstance(following.a.type, RegTileType):
        # ptxas sinks the work that computes the wgmma's register operand (attention's softmax) past a bar.sync,
        # into the turn, where nothing hides it (bench/sass_order.py). A barrier number computed from those
        # registers keeps it before the wait; the added term is always 0.
        barrier = lw.op("add.u32", "b32", barrier, _zero_from(lw, lw.reg(lw.value(following.a))))
    lw.emit(ptx.BarSyncOp(barrier, 256))


@handles(t.WgmmaWaitOp)
def _lower_wgmma_wait(lw: KernelLowering, op: t.WgmmaWaitOp) -> None:
    """`wgmma.wait_group N`. One with work between it and the last wgmma (defer-wgmma's wait for P·V, after the
    softmax) starts a basic block of its own: ptxas moves a wgmma wait up to the top of its block, ahead of the
    work it should overlap (bench/sass_order.py shows it). A branch on a warp-uniform value ptxas cannot fold
    (whether this is block 0), with the same wait on both sides, keeps it where it is."""
    pending = op.pending.value.data
    if op.prev_op is None or isinstance(op.prev_op, t.WgmmaOp | t.TurnPassOp):
        lw.emit(ptx.WgmmaSyncOp("wait", pending))
        return
    first_block = lw.at_entry("first_block", lambda: lw.op("setp.eq.u32", "pred", lw.emit(
        ptx.SpecialOp("%ctaid.x")).results[0], Imm(0)))
    other, waited = lw.label("WAIT"), lw.label("WAITED")
    lw.emit(ptx.BraOp(other, first_block))
    lw.emit(ptx.WgmmaSyncOp("wait", pending))
    lw.emit(ptx.BraOp(waited))
    lw.emit(ptx.LabelOp(other))
    lw.emit(ptx.WgmmaSyncOp("wait", pending))
    lw.emit(ptx.LabelOp(waited))


def _zero_from(lw: KernelLowering, bundle: SSAValue) -> SSAValue:
    """0, computed from every register of `bundle` so that ptxas cannot see it is: the popc of their OR is at most
    32, and 32 >> 6 is 0."""
    folded, count = bundle, bundle.type.n  # type: ignore[attr-defined]
    while count > 1 and count % 2 == 0:  # a tree of ORs while the count halves evenly
        count //= 2
        folded = lw.op("or.b32", "b32", (folded, np.arange(count)), (folded, np.arange(count, 2 * count)), n=count)
    acc = lw.op("mov.b32", "b32", (folded, np.array([0])), n=1)
    for i in range(1, count):  # then a chain over what is left
        acc = lw.op("or.b32", "b32", acc, (folded, np.array([i])), n=1)
    return lw.op("shr.u32", "b32", lw.op("popc.b32", "b32", acc), Imm(6))


@handles(t.TurnPassOp)
def _lower_turn_pass(lw: KernelLowering, op: Operation) -> None:
    if op not in lw.passed_at_commit:
        lower_turn_pass_now(lw)


def lower_turn_pass_now(lw: KernelLowering) -> None:
    lw.emit(ptx.BarSyncOp(_turn_barriers(lw)[1], 256, arrive=True))


PRODUCER_REGISTERS = 40  # per thread, after setmaxnreg.dec: address arithmetic and the TMA issue only
LEAN_PRODUCER_REGISTERS = 24  # setmaxnreg's least


def _role_registers(lw: KernelLowering) -> tuple[int, int] | None:
    """(producer, consumer) registers per thread for setmaxnreg, from what ptxas gives each thread at entry
    (65536 / threads / blocks per SM, rounded down to 8): the producer's surplus goes to the consumers. None with
    a single consumer warpgroup in a block alone on its SM (it has all the registers it may use already)."""
    per_sm = lw.fn.attributes.get("tkc.blocks_per_sm")
    blocks = per_sm.value.data if isinstance(per_sm, IntegerAttr) else 1
    if lw.threads < 384 and blocks == 1:
        return None
    entry = 65536 // blocks // lw.threads // 8 * 8
    consumers = lw.threads - 128
    # three consumer warpgroups need every register; two may ask for them (producer=2)
    lean = lw.threads > 384 or "tkc.lean_producer" in lw.fn.attributes
    producer = LEAN_PRODUCER_REGISTERS if lean else PRODUCER_REGISTERS
    grown = min(256, entry + (entry - producer) * 128 // consumers) // 8 * 8
    return producer, grown


# ------------------------------------------------------------------------------------------------------------
# Control flow


def _copy_into(lw: KernelLowering, dst: Any, src: Any) -> None:
    """dst (a declared bundle) := src, register for register."""
    if src is dst:
        return
    if isinstance(dst, SSAValue) and isinstance(dst.type, ptx.RegsType):
        cls = dst.type.reg_class
        if cls == "pred":
            lw.op("mov.pred", None, lw.reg(src, "pred") if isinstance(src, Imm) else src, into=dst)
        else:
            lw.op("mov.b32" if cls == "b32" else "mov.b64", None, src, into=dst)
        return
    raise TkcError("internal: cannot copy a value of this kind across a loop or branch")


def _declare_like(lw: KernelLowering, value: Any, type_: Any) -> Any:
    """Registers that a loop or branch writes its results into."""
    if isinstance(value, SharedRef | RingRef | GlobalRef):
        return value  # buffers stay where they are; their addresses do not change
    if isinstance(value, Imm):
        cls = "pred" if value.cls == "pred" else "b32"
        return lw.emit(ptx.RegsOp(cls, 1)).results[0]
    return lw.emit(ptx.RegsOp(value.type.reg_class, value.type.n)).results[0]


def _same_buffer(a_: Any, b_: Any) -> bool:
    return isinstance(a_, SharedRef | RingRef) and isinstance(b_, SharedRef | RingRef) and a_.addr is b_.addr


@handles(scf.ForOp)
def _lower_for(lw: KernelLowering, op: scf.ForOp) -> list[Any]:
    lb, ub, step = (lw.value(v) for v in (op.lb, op.ub, op.step))
    body = op.body.block
    iv = lw.emit(ptx.RegsOp("b32", 1)).results[0]
    _copy_into(lw, iv, lb)
    carried = []
    for init, arg in zip(op.iter_args, body.args[1:]):
        value = lw.value(init)
        regs = _declare_like(lw, value, init.type)
        if regs is not value:
            _copy_into(lw, regs, value)
        carried.append(regs)
    lw.values[body.args[0]] = iv
    for arg, regs in zip(body.args[1:], carried):
        lw.values[arg] = regs
    head, end = lw.label("LOOP"), lw.label("END")
    lw.emit(ptx.LabelOp(head))
    done = lw.op("setp.ge.s32", "pred", iv, ub)
    lw.emit(ptx.BraOp(end, done))
    lw.lower_block(body)
    yield_op = body.last_op
    assert isinstance(yield_op, scf.YieldOp)
    new = [lw.value(v) for v in yield_op.operands]
    # Parallel copy: a yielded value that is itself a carried bundle must be read before it is overwritten.
    staged = []
    for regs, value in zip(carried, new):
        if any(value is other for other in carried) and value is not regs:
            tmp = _declare_like(lw, value, None)
            _copy_into(lw, tmp, value)
            staged.append(tmp)
        else:
            staged.append(value)
    for regs, value in zip(carried, staged):
        if isinstance(regs, SharedRef | RingRef):
            if not _same_buffer(regs, value):
                raise TkcError("a loop-carried shared tile must stay in one buffer")
            continue
        _copy_into(lw, regs, value)
    lw.op("add.s32", None, iv, step, into=iv)
    lw.emit(ptx.BraOp(head))
    lw.emit(ptx.LabelOp(end))
    if op in lw.wgmma_loops:
        lw.emit(ptx.WgmmaSyncOp("wait", 0))  # the last step's wgmma, before anything reads the accumulator
    return carried


def _predicable(op: scf.IfOp) -> bool:
    """An if without results whose branch only computes integers and starts async copies (the pipeline's
    prefetch) or releases a stage: it becomes straight-line code with predicated copies, which ptxas can interleave with the
    tensor-core work around it (a branch would keep the copies' address arithmetic in a block of its own)."""
    from tkc.ir import tma_ops as m

    if op.results or (op.false_region.blocks and len(op.false_region.block.ops) > 1):
        return False
    return all(isinstance(o, a.CopyAsyncOp | m.StageReleaseOp | scf.YieldOp) or o.name.startswith("arith.")
               for o in op.true_region.block.ops)


@handles(scf.IfOp)
def _lower_if(lw: KernelLowering, op: scf.IfOp) -> list[Any]:
    cond = lw.value(op.cond)
    if isinstance(cond, Imm):
        region = op.true_region if cond.value else op.false_region
        if not region.blocks:
            return []
        lw.lower_block(region.block)
        return [lw.value(v) for v in region.block.last_op.operands]  # type: ignore[union-attr]
    if _predicable(op):
        saved = lw.guard
        lw.guard = cond if saved is None else lw.op("and.pred", "pred", saved, cond, n=1)
        try:
            lw.lower_block(op.true_region.block)
        finally:
            lw.guard = saved
        return []
    results: list[Any] = [None] * len(op.results)
    else_label, end = lw.label("ELSE"), lw.label("ENDIF")
    lw.emit(ptx.BraOp(else_label, cond, negate=True))

    role = "tkc.warp_role" in op.attributes  # then: the producer warpgroup, else: the consumer warps
    registers = _role_registers(lw) if role else None

    def branch(region: Any) -> None:
        if not region.blocks:
            return
        producer = region is op.true_region
        saved = lw.role_threads
        if role:
            lw.role_threads = 128 if producer else 32 * lw.consumer_warps
            if registers is not None:
                lw.emit(ptx.SetmaxnregOp(not producer, registers[0] if producer else registers[1]))
        try:
            lw.lower_block(region.block)
        finally:
            lw.role_threads = saved
        for i, v in enumerate(region.block.last_op.operands):
            value = lw.value(v)
            if results[i] is None:
                results[i] = _declare_like(lw, value, v.type)
                # declarations must dominate both branches: move it before the branch
                if isinstance(results[i], SSAValue):
                    decl = results[i].owner
                    lw.body.remove(decl)
                    lw.body.insert(branch_point, decl)
            if isinstance(results[i], SharedRef | RingRef):
                if not _same_buffer(results[i], value):
                    raise TkcError("both branches of an if must yield a shared tile in the same buffer")
                continue
            _copy_into(lw, results[i], value)

    branch_point = len(lw.body) - 1
    branch(op.true_region)
    lw.emit(ptx.BraOp(end))
    lw.emit(ptx.LabelOp(else_label))
    branch(op.false_region)
    lw.emit(ptx.LabelOp(end))
    return results


@handles(func.ReturnOp)
def _lower_return(lw: KernelLowering, op: func.ReturnOp) -> None:
    if lw.tma_stores:
        lw.emit(ptx.BulkGroupOp("wait", 0))  # TMA stores read the block's shared memory until they complete
    if lw.cluster > 1:  # the blocks of a cluster exit together: a peer may still signal this block's barriers
        lw.emit(ptx.ClusterBarrierOp("arrive"))
        lw.emit(ptx.ClusterBarrierOp("wait"))
    lw.emit(ptx.RetOp())

