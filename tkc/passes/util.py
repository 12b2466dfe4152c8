"""Small helpers shared by passes."""

from __future__ import annotations

from collections.abc import Callable

from xdsl.dialects import func
from xdsl.dialects.builtin import FunctionType, ModuleOp
from xdsl.ir import Block, Operation, SSAValue

from tkc.ir import async_ops as a
from tkc.ir import ops as t
from tkc.ir import tma_ops as m
from tkc.ir.types import SharedTileType, SharedVecType

# Ops after which a shared tile may hold other bytes: writes, copies landing, other warps let in, a ring stage handed
# back to TMA (which may refill it at once: on the H200 attention_bwd_dq's sm_90a build read K and V refilled under
# an mma streaming them past the release, RESULTS "attention backward probe — 2026-12-04").
SHARED_WRITERS = (t.InsertOp, t.BarrierOp, t.ClusterSyncOp, a.CopyAsyncOp, a.WaitGroupOp, m.StageReleaseOp, m.StageAcquireOp,
                  m.TmaLoadOp)


def shared_unchanged_between(first: Operation, last: Operation) -> bool:
    """Is `last` later in `first`'s block with nothing in between that could change a shared tile's bytes: no
    SHARED_WRITERS op, no region, no new shared tile or vector (after allocate-shared it may take a dead one's
    bytes)? Then a shared tile read at `first` may be read again (or for the first time) at `last`."""
    op = first.next_op
    while op is not None and op is not last:
        if op.regions or isinstance(op, SHARED_WRITERS):
            return False
        if isinstance(op, t.LoadOp | t.FillOp) and isinstance(op.results[0].type, SharedTileType | SharedVecType):
            return False
        op = op.next_op
    return op is last


def innermost_for(op: Operation) -> Operation | None:
    """The scf.for closest around `op` within its function, or None."""
    from xdsl.dialects import scf

    parent = op.parent_op()
    while parent is not None and not isinstance(parent, scf.ForOp | func.FuncOp):
        parent = parent.parent_op()
    return parent if isinstance(parent, scf.ForOp) else None


def double_buffered(op: Operation) -> bool:
    """A `tile.empty` with two buffers that its loop's steps take in turn."""
    return isinstance(op, t.EmptyOp) and op.buffers == 2


def sync_function_types(module: ModuleOp) -> None:
    """After a pass retypes block arguments, make each function's type match its entry block again."""
    for op in module.walk():
        if isinstance(op, func.FuncOp) and op.body.blocks:
            inputs = [a.type for a in op.body.block.args]
            if list(op.function_type.inputs.data) != inputs:
                op.function_type = FunctionType.from_lists(inputs, list(op.function_type.outputs.data))


def constant_int(value: SSAValue) -> int | None:
    """The value of an integer `arith.constant`, or None for anything else."""
    from xdsl.dialects import arith
    from xdsl.dialects.builtin import IntegerAttr

    owner = value.owner
    if isinstance(owner, arith.ConstantOp) and isinstance(owner.value, IntegerAttr):
        return int(owner.value.value.data)
    return None


def within(block: Block | None, outer: Block) -> bool:
    """Whether `block` is `outer` or nested inside one of its ops."""
    while block is not None:
        if block is outer:
            return True
        parent = block.parent_op()
        block = parent.parent_block() if parent is not None else None
    return False


def defined_in(value: SSAValue, loop: Operation) -> bool:
    """Whether `value` is computed in the loop's body (or is one of its block arguments)."""
    owner = value.owner
    return within(owner if isinstance(owner, Block) else owner.parent_block(), loop.body.block)  # type: ignore[attr-defined]


def wgmma_loops(fn: Operation, option: str) -> list[Operation]:
    """The innermost loops of a kernel with wgmmas at the top level of their body (not a tile loop around one, which
    may hold a wgmma the inner loop's rotation hoisted), for a pass that kernel option `option` (e.g. "pingpong=1")
    asked for; none is one clear error at the kernel."""
    from xdsl.dialects import scf

    from tkc.errors import SourceLoc, TkcError
    from tkc.ir import ops as t

    def has_wgmmas(loop: Operation) -> bool:
        return any(isinstance(o, t.WgmmaOp) for o in loop.body.block.ops)  # type: ignore[attr-defined]

    loops = [op for op in fn.walk() if isinstance(op, scf.ForOp) and has_wgmmas(op)
             and not any(isinstance(o, scf.ForOp) and o is not op and has_wgmmas(o) for o in op.walk())]
    if not loops:
        raise TkcError(f"{option}: the kernel has no loop with wgmmas (mma on shared tiles, sm_90a)",
                       SourceLoc.from_attr(fn.location))
    return loops


def yielded_at(op: Operation, body: Block) -> int | None:
    """Where in `body`'s yield the op's only result goes, when that yield is its one use; else None."""
    from xdsl.dialects import scf

    uses = list(op.results[0].uses)
    if len(uses) == 1 and isinstance(uses[0].operation, scf.YieldOp) and uses[0].operation.parent_block() is body:
        return uses[0].index
    return None


def carries_only_the_accumulator(op: Operation, loop: Operation) -> bool:
    """Does this wgmma only carry the loop's accumulator from step to step: C is the loop's argument, used by
    nothing else, and the result goes only to the yield that feeds it back (what lets the lowering leave it
    running into the next step)?"""
    from xdsl.ir import BlockArgument

    c, body = op.c, loop.body.block  # type: ignore[attr-defined]
    if not (isinstance(c, BlockArgument) and c.owner is body and len(list(c.uses)) == 1):
        return False
    return yielded_at(op, body) == c.index - 1


def waited_by_the_next_step(op: Operation, loop: Operation) -> bool:
    """May this wgmma run on into the loop's next step, until that step's first wgmma is waited for (a wait covers
    every older group)? Attention's O += P·V: its result only goes to the yield, the first wgmma of the body (Q·Kᵀ,
    itself waited for at once) comes before every use of the value it carries and before the A operand is
    computed again. The loop must then release its ring stages one step late (its B may be read until then)."""
    from tkc.ir import ops as t

    body = loop.body.block  # type: ignore[attr-defined]
    index = yielded_at(op, body)
    if op.parent_block() is not body or index is None:
        return False
    order = {o: i for i, o in enumerate(body.ops)}
    first = next(o for o in body.ops if isinstance(o, t.WgmmaOp))
    if first is op or yielded_at(first, body) is not None:
        return False  # no wgmma before it, or the first one is itself left running (overlap-wgmma's early Q·Kᵀ)

    def top(o: Operation) -> Operation:  # the op of the body that holds `o`
        while o.parent_block() is not body:
            o = o.parent_op()  # type: ignore[assignment]
        return o

    carried = body.args[index + 1]
    a_owner = op.a.owner  # type: ignore[attr-defined]
    if defined_in(op.a, loop) and not (isinstance(a_owner, Operation) and order[top(a_owner)] > order[first]):
        return False  # A is computed again (or carried in) before the wait: its registers would change under it
    # the lowering accumulates straight into the carried registers: nothing may read the old value after it
    return all(order[first] < order[top(u.operation)] <= order[op] for u in carried.uses)


def with_one_more_carried(loop: Operation, init: SSAValue) -> Operation:
    """`loop` (an scf.for whose body already has one more block argument and yields one more value) rebuilt with
    `init` as that value's start; uses of the old loop's results go to the new one's, whose last result is new."""
    return with_more_carried(loop, [init])


def with_more_carried(loop: Operation, inits: list[SSAValue]) -> Operation:
    """with_one_more_carried for len(inits) more values (the body's last block arguments and yielded values)."""
    from xdsl.dialects import scf
    from xdsl.rewriter import InsertPoint, Rewriter

    assert isinstance(loop, scf.ForOp)
    region = loop.detach_region(loop.body)
    rebuilt = scf.ForOp(loop.lb, loop.ub, loop.step, [*loop.iter_args, *inits], region)
    rebuilt.attributes |= loop.attributes
    rebuilt.location = loop.location
    Rewriter.insert_op(rebuilt, InsertPoint.before(loop))
    for old, new in zip(loop.results, rebuilt.results):
        old.replace_all_uses_with(new)
    loop.detach()
    loop.erase()
    return rebuilt


def erase_while(block: Block, removable: Callable[[Operation], bool], nested: bool = False) -> None:
    """Erase the block's ops (with `nested`, also those inside its ops) that are `removable`, last first, until
    none is (erasing one can make the ops computing its operands removable)."""
    changed = True
    while changed:
        changed = False
        for op in reversed(list(block.walk() if nested else block.ops)):
            if removable(op):
                op.detach()
                op.erase()
                changed = True


def unused(op: Operation) -> bool:
    """Whether the op has results and nothing uses them."""
    return bool(op.results) and not any(r.uses for r in op.results)


def clone_into(ops: list[Operation], block: Block,
               mapping: dict[SSAValue, SSAValue] | None = None) -> dict[SSAValue, SSAValue]:
    """Clones of the ops, in order, at the end of the block (each reading the clones before it, and `mapping`);
    the mapping from the originals' values to the clones'."""
    mapping = dict(mapping or {})
    for op in ops:
        clone = op.clone(value_mapper=mapping)
        block.add_op(clone)
        mapping.update(zip(op.results, clone.results))
    return mapping
