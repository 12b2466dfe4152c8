"""Checks on a whole kernel that no single op can make."""

from __future__ import annotations

from xdsl.dialects import func, scf
from xdsl.ir import Operation

from tkc.errors import SourceLoc, TkcError
from tkc.ir.ops import EmptyOp, FillOp, InsertOp, LoadOp
from tkc.ir.types import SharedTileType, SharedVecType
from tkc.targets import Target


def shared_allocations(fn: func.FuncOp) -> list[tuple[object, int]]:
    """Ops that create a shared tile or vector (rather than update one or view part of one), with their bytes. Each
    is one buffer: an op inside a loop reuses its buffer on every iteration. Later passes (pipelining) multiply
    buffers."""
    allocs = []
    for op in fn.walk():
        if isinstance(op, LoadOp) and isinstance(op.source.type, SharedTileType):
            continue  # a view of rows or columns of a shared tile: no bytes of its own
        if isinstance(op, LoadOp | FillOp | EmptyOp) and isinstance(op.result.type, SharedTileType | SharedVecType):
            allocs.append((op, op.result.type.nbytes))
    return allocs


def check_shared_memory(fn: func.FuncOp, target: Target) -> None:
    total = 0
    for op, nbytes in shared_allocations(fn):
        total += nbytes
        if total > target.shared_bytes:
            raise TkcError(
                f"shared memory over the {target} budget: this {op.result.type.spec()} ({nbytes // 1024} KB) "  # type: ignore[attr-defined]
                f"brings kernel `{fn.sym_name.data}` to {total / 1024:g} KB; {target} allows "
                f"{target.shared_bytes // 1024} KB per block",
                SourceLoc.from_attr(op.location),  # type: ignore[attr-defined]
            )


def check_shared_versions(fn: func.FuncOp) -> None:
    """A store into a shared tile returns the updated tile, but the GPU updates the buffer in place: the version
    stored into is gone. Reading it after the store (where the interpreter would still see the old contents) is an
    error, not a silently different answer. Storing into it again reuses the buffer (a scratch vector written
    anew each time) and is allowed, as is a loop body's earlier read in the next iteration."""
    order = {op: i for i, op in enumerate(fn.walk())}
    for op in order:
        if not isinstance(op, InsertOp):
            continue
        for use in op.dest.uses:
            user = use.operation
            if not isinstance(user, InsertOp) and order.get(user, -1) > order[op] and not _exclusive(op, user):
                here = SourceLoc.from_attr(op.location)  # type: ignore[attr-defined]
                raise TkcError(
                    f"this uses a shared {op.dest.type.spec()} that a store{f' (line {here.line})' if here else ''} "  # type: ignore[attr-defined]
                    f"has already overwritten: stores into shared tiles happen in place, so use the value the "
                    f"store returned (`s = store(s, ...)`), or make a second tile",
                    SourceLoc.from_attr(user.location) if hasattr(user, "location") else None,  # type: ignore[attr-defined]
                )


def _exclusive(a: Operation, b: Operation) -> bool:
    """Are `a` and `b` in different branches of one `if` (so that never both run)?"""
    regions_of_a = {}
    region = a.parent_region()
    while region is not None:
        regions_of_a[region.parent_op()] = region
        region = region.parent_op().parent_region() if region.parent_op() is not None else None
    region = b.parent_region()
    while region is not None:
        owner = region.parent_op()
        if owner in regions_of_a:  # the innermost op holding both
            return isinstance(owner, scf.IfOp) and regions_of_a[owner] is not region
        region = owner.parent_region() if owner is not None else None
    return False
