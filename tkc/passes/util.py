"""Small helpers shared by passes."""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import FunctionType, ModuleOp
from xdsl.ir import Block, Operation, SSAValue


def sync_function_types(module: ModuleOp) -> None:
    """After a pass retypes block arguments, make each function's type match its entry block again."""
    for op in module.walk():
        if isinstance(op, func.FuncOp) and op.body.blocks:
            inputs = [a.type for a in op.body.block.args]
            if list(op.function_type.inputs.data) != inputs:
                op.function_type = FunctionType.from_lists(inputs, list(op.function_type.outputs.data))


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
    """The loops of a kernel with wgmmas at the top level of their body, for a pass that kernel option `option`
    (e.g. "pingpong=1") asked for; none is one clear error at the kernel."""
    from xdsl.dialects import scf

    from tkc.errors import SourceLoc, TkcError
    from tkc.ir import ops as t

    loops = [op for op in fn.walk() if isinstance(op, scf.ForOp)
             and any(isinstance(o, t.WgmmaOp) for o in op.body.block.ops)]
    if not loops:
        raise TkcError(f"{option}: the kernel has no loop with wgmmas (mma on shared tiles, sm_90a)",
                       SourceLoc.from_attr(fn.location))
    return loops


def carries_only_the_accumulator(op: Operation, loop: Operation) -> bool:
    """Does this wgmma only carry the loop's accumulator from step to step: C is the loop's argument, used by
    nothing else, and the result goes only to the yield that feeds it back (what lets the lowering leave it
    running into the next step)?"""
    from xdsl.dialects import scf
    from xdsl.ir import BlockArgument

    c, body = op.c, loop.body.block  # type: ignore[attr-defined]
    if not (isinstance(c, BlockArgument) and c.owner is body and len(list(c.uses)) == 1):
        return False
    uses = list(op.results[0].uses)
    return (len(uses) == 1 and isinstance(uses[0].operation, scf.YieldOp) and uses[0].operation.parent_block() is body
            and uses[0].index == c.index - 1)
