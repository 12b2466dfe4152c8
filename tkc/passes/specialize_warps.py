"""specialize-warps: give a kernel's TMA-pipelined loop a producer warpgroup of its own (kernels with `producer=1`).

After `insert-tma-pipeline` every warp both computes and (warp 0) refills the ring. Here the block grows by one
warpgroup, the producer, placed after the kernel's warps so that their `warp_id()` stays what it was. An if on
`warpgroup_id()` (marked `tkc.warp_role`) splits the block: the producer runs a loop of its own over the same
steps, acquiring, announcing and loading each (the first `stages` acquires pass at once); the kernel's warps,
the consumers, run the original loop without its refills, then the rest of the kernel. The producer never waits
for the consumers except through the ring's empty barriers, so it runs up to `stages` steps ahead. The lowering
then moves registers from the producer to the consumers (`setmaxnreg`) and gives consumer-only barriers a
thread count.

    scf.if (0 < trips) { tile.stage_expect %bars[0] ... }          // steps filled before the loop
    scf.for %j ... { tile.stage_wait %bars[%k] ... scf.if (%k + 3 < trips) { tile.stage_acquire ... } }
    tile.store ...
becomes
    scf.if (warpgroup_id == 2) {tkc.warp_role} {
      scf.for %j ... { tile.stage_acquire %bars[%k]  tile.stage_expect %bars[%k] ...  tile.tma_load ... }
    } else {
      scf.for %j ... { tile.stage_wait %bars[%k] ... }
      tile.store ...
    }
"""

from __future__ import annotations

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, UnitAttr, i32
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint

from tkc.errors import SourceLoc, TkcError
from tkc.ir import ops as t
from tkc.ir import tma_ops as m
from tkc.passes import register

ROLE_ATTR = "tkc.warp_role"  # on the if that splits the block into producer (then) and consumers (else)
CONSUMER_WARPS = "tkc.consumer_warps"  # on a specialized kernel: its own warps (tkc.warps counts the producer too)
PRODUCER_WARPS = 4


def _holds(op: Operation, cls: type) -> bool:
    return any(isinstance(o, cls) for o in op.walk())


def _step_of(loop: scf.ForOp) -> SSAValue | None:
    iv = loop.body.block.args[0]
    for op in loop.body.block.ops:
        if isinstance(op, arith.DivUIOp) and isinstance(op.lhs.owner, arith.SubiOp) and op.lhs.owner.lhs is iv:
            return op.result
    return None


def specialize(fn: func.FuncOp) -> None:
    body = fn.body.block
    loops = [op for op in body.ops if isinstance(op, scf.ForOp) and _holds(op, m.StageWaitOp)]
    if len(loops) != 1 or any(_holds(op, m.StageWaitOp) for op in body.ops if op not in loops):
        raise TkcError("producer=1 needs exactly one TMA-pipelined loop at the top level of the kernel "
                       f"(found {len(loops)}; loads must be 16-byte aligned 2-D tiles)",
                       SourceLoc.from_attr(fn.location))
    loop = loops[0]
    refill = next((op for op in loop.body.block.ops if isinstance(op, scf.IfOp) and _holds(op, m.StageAcquireOp)), None)
    k = _step_of(loop)
    if refill is None or k is None:
        raise TkcError("internal: specialize-warps expects insert-tma-pipeline's loop", SourceLoc.from_attr(loop.location))
    expect = next(op for op in refill.walk() if isinstance(op, m.StageExpectOp))
    k_next = expect.step
    j_next = next(op.result for op in loop.body.block.ops if isinstance(op, arith.AddiOp)
                  and op.lhs is loop.body.block.args[0] and op.result in {o for x in refill.walk() for o in x.operands})

    # the producer's loop: the refill's ops, for step k of its own index
    producer_body = Block(arg_types=[i32])
    pb = Builder(InsertPoint.at_end(producer_body))
    iv = producer_body.args[0]
    span = pb.insert(arith.SubiOp(iv, loop.lb)).result
    step_k = pb.insert(arith.DivUIOp(span, loop.step)).result
    mapping: dict[SSAValue, SSAValue] = {k_next: step_k, j_next: iv}
    for op in refill.true_region.block.ops:
        if isinstance(op, scf.YieldOp):
            continue
        clone = op.clone(value_mapper=mapping)
        pb.insert(clone)
        for old, new in zip(op.results, clone.results):
            mapping[old] = new
    pb.insert(scf.YieldOp())
    producer_loop = scf.ForOp(loop.lb, loop.ub, loop.step, [], Region(producer_body))
    producer_loop.location = loop.location

    # drop the refills (in the loop and before it), and what only they used
    cond = refill.cond
    refill.detach()
    refill.erase()
    for value in (cond, k_next, j_next):
        owner = value.owner
        if isinstance(owner, Operation) and not value.uses:
            operands = list(owner.operands)
            owner.detach()
            owner.erase()
            for operand in operands:
                if isinstance(operand.owner, arith.ConstantOp) and not operand.uses:
                    operand.owner.detach()
                    operand.owner.erase()
    for op in list(body.ops):
        if isinstance(op, scf.IfOp) and _holds(op, m.StageExpectOp):
            op.detach()
            op.erase()

    # split the block: producer (then) and consumers (else: the loop and everything after it)
    warps = fn.attributes["tkc.warps"].value.data  # type: ignore[attr-defined]
    if warps % 4:
        raise TkcError(f"producer=1 needs whole consumer warpgroups: warps must be a multiple of 4, got {warps}",
                       SourceLoc.from_attr(fn.location))
    before = Builder(InsertPoint.before(loop))
    role = before.insert(arith.CmpiOp(before.insert(t.WarpgroupIdOp()).result,
                                      before.insert(arith.ConstantOp(IntegerAttr(warps // 4, i32))).result, "eq")).result
    consumer = Block()
    tail = []
    ret = loop
    while ret is not None and not isinstance(ret, func.ReturnOp):
        tail.append(ret)
        ret = ret.next_op
    for moved in tail:
        moved.detach()
        consumer.add_op(moved)
    consumer.add_op(scf.YieldOp())
    split = scf.IfOp(role, [], Region(Block([producer_loop, scf.YieldOp()])), Region(consumer))
    split.attributes[ROLE_ATTR] = UnitAttr()
    split.location = loop.location
    assert ret is not None
    Builder(InsertPoint.before(ret)).insert(split)  # before the return
    fn.attributes[CONSUMER_WARPS] = IntegerAttr(warps, 64)
    fn.attributes["tkc.warps"] = IntegerAttr(warps + PRODUCER_WARPS, 64)


def specialize_warps(module: ModuleOp) -> None:
    target = module.attributes.get("tkc.target")
    for fn in module.ops:
        if isinstance(fn, func.FuncOp) and "tkc.producer" in fn.attributes and CONSUMER_WARPS not in fn.attributes:
            if not (isinstance(target, StringAttr) and target.data.startswith("sm_90")):
                raise TkcError("producer=1 (a producer warpgroup with TMA) needs sm_90a", SourceLoc.from_attr(fn.location))
            specialize(fn)


@register("specialize-warps", "split a TMA-pipelined kernel into a producer warpgroup and its consumer warps")
class SpecializeWarps(ModulePass):
    name = "specialize-warps"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        specialize_warps(op)
