"""specialize-warps: give a kernel's TMA-pipelined loop a producer warpgroup of its own (kernels with `producer=1`).

After `insert-tma-pipeline` every warp both computes and (warp 0) refills the ring. Here the block grows by one
warpgroup, the producer, placed after the kernel's warps so that their `warp_id()` stays what it was. An if on
`warpgroup_id()` (marked `tkc.warp_role`) splits the block: the producer runs a loop of its own over the same
steps, acquiring, announcing and loading each (the first `stages` acquires pass at once); the kernel's warps,
the consumers, run the original loop without its refills, then the rest of the kernel. The producer never waits
for the consumers except through the ring's empty barriers, so it runs up to `stages` steps ahead. A pipelined
loop inside a tile loop gets a pruned copy of the tile loop around the producer's loop; when the tile loop has a
ring of its own (attention's queries, on its loop over query blocks), that copy loads tile t's tiles before tile
t's steps, so they land while the consumers finish tile t - 1. The lowering then moves registers from the
producer to the consumers (`setmaxnreg`) and gives consumer-only barriers a thread count.

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
from tkc.passes.insert_tma_pipeline import step_index

ROLE_ATTR = "tkc.warp_role"  # on the if that splits the block into producer (then) and consumers (else)
CONSUMER_WARPS = "tkc.consumer_warps"  # on a specialized kernel: its own warps (tkc.warps counts the producer too)
PRODUCER_WARPS = 4


def _holds(op: Operation, cls: type) -> bool:
    return any(isinstance(o, cls) for o in op.walk())


def _erase(op: Operation) -> None:
    op.detach()
    op.erase(safe_erase=False)


def _fills(block: Block) -> list[Operation]:
    """The ifs of a block that fill ring steps (the steps before a pipelined loop)."""
    return [op for op in block.ops if isinstance(op, scf.IfOp) and _holds(op, m.StageExpectOp)]


def _refill_as_this_step(loop: scf.ForOp, refill: scf.IfOp, step: SSAValue, iv: SSAValue,
                         at: Builder) -> list[Operation]:
    """Insert at `at` what `refill` does (acquire, expect, TMA loads for step k + stages - 1 at loop index
    iv + (stages - 1)·step), but for ring step `step` at loop index `iv`: a producer's fill of the step it is at."""
    body = loop.body.block
    expect = next(op for op in refill.walk() if isinstance(op, m.StageExpectOp))
    refill_reads = {o for x in refill.walk() for o in x.operands}
    j_next = next((op.result for op in body.ops if isinstance(op, arith.AddiOp) and op.lhs is body.args[0]
                   and op.result in refill_reads), None)
    mapping: dict[SSAValue, SSAValue] = {expect.step: step, **({j_next: iv} if j_next is not None else {})}
    fill = []
    for op in refill.true_region.block.ops:
        if isinstance(op, scf.YieldOp):
            continue
        clone = op.clone(value_mapper=mapping)
        at.insert(clone)
        fill.append(clone)
        for old, new in zip(op.results, clone.results):
            mapping[old] = new
    return fill


def _producer_loop(loop: scf.ForOp, refills: list[scf.IfOp]) -> scf.ForOp:
    """A loop over the same steps as `loop` that does, at step k, what `refills` do for step k + stages - 1 (one
    refill, or one a load with split_ring=1, in the order of the consumers' loop)."""
    body = loop.body.block
    wait = next(op for op in body.ops if isinstance(op, m.StageWaitOp))
    k = step_index(loop)
    producer_body = Block(arg_types=[i32])
    pb = Builder(InsertPoint.at_end(producer_body))
    iv = producer_body.args[0]
    step_k = pb.insert(arith.DivUIOp(pb.insert(arith.SubiOp(iv, loop.lb)).result, loop.step)).result
    step_g = step_k  # the ring's step: k, or k after the steps of earlier tiles (base + k)
    if wait.step is not k:
        base = wait.step.owner.lhs  # type: ignore[union-attr]
        step_g = pb.insert(arith.AddiOp(base, step_k)).result
    for refill in refills:
        _refill_as_this_step(loop, refill, step_g, iv, pb)
    pb.insert(scf.YieldOp())
    producer = scf.ForOp(loop.lb, loop.ub, loop.step, [], Region(producer_body))
    producer.location = loop.location
    return producer


def _drop_refill(loop: scf.ForOp, refill: scf.IfOp) -> None:
    """Remove the refill from the consumers' loop, and the index arithmetic only it used."""
    body = loop.body.block
    refill.detach()
    refill.erase()
    changed = True
    while changed:
        changed = False
        for op in list(body.ops):
            if op.name.startswith("arith.") and op.results and not any(r.uses for r in op.results):
                _erase(op)
                changed = True


def _prune(top: scf.ForOp, keep: list[Operation]) -> None:
    """Keep of `top`'s body only `keep`, the yield, and what they compute from (the producer's copy of a tile
    loop: its index arithmetic and the step count, none of the consumers' work)."""
    body = top.body.block
    needed: set[Operation] = set()
    pending = [*keep, body.last_op]
    while pending:
        op = pending.pop()
        if op is None or op in needed:
            continue
        needed.add(op)
        for inner in op.walk():
            for operand in inner.operands:
                owner = operand.owner
                if isinstance(owner, Operation) and owner.parent_block() is body:
                    pending.append(owner)
    for op in reversed(list(body.ops)):
        if op not in needed:
            _erase(op)


def _consumers_only_loads(top: Operation, producer: Operation) -> list[Operation]:
    """The global→shared loads before the loop nest (attention's queries), with the ops that read their tiles:
    only the consumers need them, so they move into the consumers' branch and the producer starts its TMA loads
    at once instead of after them (and the block barrier that follows them)."""
    from xdsl.traits import is_side_effect_free

    from tkc.ir.types import GlobalType, SharedTileType

    tiles: set[SSAValue] = set()
    moved: list[Operation] = []
    op = top.parent_block().first_op  # type: ignore[union-attr]
    while op is not top:
        assert op is not None
        load = (isinstance(op, t.LoadOp) and isinstance(op.source.type, GlobalType)
                and isinstance(op.result.type, SharedTileType))
        if load or (is_side_effect_free(op) and not op.regions and any(v in tiles for v in op.operands)):
            tiles.update(op.results)
            moved.append(op)
        op = op.next_op
    producer_reads = {v for o in producer.walk() for v in o.operands}
    return [] if tiles & producer_reads else moved


def _fill_this_step(tile_loop: scf.ForOp, refill: scf.IfOp) -> list[Operation]:
    """In the producer's copy of a pipelined tile loop: the refill turned into the fill of step t at iteration t,
    put where the step's wait was (the refill itself goes)."""
    body = tile_loop.body.block
    wait = next(op for op in body.ops if isinstance(op, m.StageWaitOp))
    fill = _refill_as_this_step(tile_loop, refill, wait.step, body.args[0], Builder(InsertPoint.before(wait)))
    _erase(refill)
    return fill


def specialize(fn: func.FuncOp) -> None:
    loops = [op for op in fn.walk() if isinstance(op, scf.ForOp)
             and any(isinstance(o, m.StageWaitOp) for o in op.body.block.ops)]
    # one pipelined loop, or a pipelined tile loop (the queries' ring) right around it (the keys' ring)
    nested = len(loops) == 2 and loops[1].parent_op() is loops[0] and isinstance(loops[0].parent_op(), func.FuncOp)
    if len(loops) != 1 and not nested:
        raise TkcError(f"producer=1 needs one TMA-pipelined loop, or two with one right inside the other (found "
                       f"{len(loops)}; the loads must be 16-byte aligned 2-D tiles)", SourceLoc.from_attr(fn.location))
    loop = loops[-1]
    tile_loop = loops[0] if nested else None
    refills = [op for op in loop.body.block.ops if isinstance(op, scf.IfOp) and _holds(op, m.StageAcquireOp)]
    if not refills or step_index(loop) is None:
        raise TkcError("internal: specialize-warps expects insert-tma-pipeline's loop", SourceLoc.from_attr(loop.location))
    top: Operation = loop
    while not isinstance(top.parent_op(), func.FuncOp):
        top = top.parent_op()  # type: ignore[assignment]
        if not isinstance(top, scf.ForOp):
            raise TkcError("producer=1: the pipelined loop may sit in loops, not in ifs", SourceLoc.from_attr(loop.location))

    tile_refill = None
    if tile_loop is not None:  # the tile loop's own ring: the if that acquires one of its stages
        tile_bars = next(op for op in tile_loop.body.block.ops if isinstance(op, m.StageWaitOp)).bars
        tile_refill = next(op for op in tile_loop.body.block.ops if isinstance(op, scf.IfOp)
                           and any(isinstance(o, m.StageAcquireOp) and o.bars is tile_bars for o in op.walk()))
    producer_loop = _producer_loop(loop, refills)
    for refill in refills:
        _drop_refill(loop, refill)
    for op in _fills(loop.parent_block()):  # type: ignore[arg-type]
        if op is not tile_refill:
            _erase(op)  # the consumers' steps before the loop: the producer fills them now
    if top is loop:
        producer: Operation = producer_loop
    else:
        # the producer walks the same tiles: a copy of the loops around, keeping only what its loads need
        Builder(InsertPoint.after(loop)).insert(producer_loop)
        if tile_refill is not None:  # found again in the copy by its position
            position = list(tile_loop.body.block.ops).index(tile_refill)  # type: ignore[union-attr]
        producer = top.clone()
        producer_loop.detach()
        producer_loop.erase()
        copy = next(op for op in producer.walk() if isinstance(op, scf.ForOp)
                    and any(isinstance(o, m.StageAcquireOp) for o in op.body.block.ops))
        if copy.parent_op() is not producer:
            raise TkcError("producer=1: the pipelined loop may sit in one tile loop, not deeper",
                           SourceLoc.from_attr(loop.location))
        keep: list[Operation] = [copy]
        if tile_refill is not None:
            # tile t's queries: loaded by the producer at the start of its tile t, as many tiles ahead as the
            # keys' ring runs ahead of the consumers; the consumers only wait for them and release them
            keep += _fill_this_step(producer, list(producer.body.block.ops)[position])  # type: ignore[arg-type]
            _drop_refill(tile_loop, tile_refill)  # type: ignore[arg-type]
            for op in _fills(tile_loop.parent_block()):  # type: ignore[arg-type]
                _erase(op)
        _prune(producer, keep)  # type: ignore[arg-type]

    # split the block: producer (then) and consumers (else: the loop nest and everything after it)
    warps = fn.attributes["tkc.warps"].value.data  # type: ignore[attr-defined]
    if warps % 4:
        raise TkcError(f"producer=1 needs whole consumer warpgroups: warps must be a multiple of 4, got {warps}",
                       SourceLoc.from_attr(fn.location))
    before = Builder(InsertPoint.before(top))
    role = before.insert(arith.CmpiOp(before.insert(t.WarpgroupIdOp()).result,
                                      before.insert(arith.ConstantOp(IntegerAttr(warps // 4, i32))).result, "eq")).result
    consumer = Block()
    tail = _consumers_only_loads(top, producer)
    ret = top
    while ret is not None and not isinstance(ret, func.ReturnOp):
        tail.append(ret)
        ret = ret.next_op
    for moved in tail:
        moved.detach()
        consumer.add_op(moved)
    consumer.add_op(scf.YieldOp())
    split = scf.IfOp(role, [], Region(Block([producer, scf.YieldOp()])), Region(consumer))
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
