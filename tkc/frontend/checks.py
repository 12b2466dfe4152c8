"""Checks on a whole kernel that no single op can make."""

from __future__ import annotations

from xdsl.dialects import func

from tkc.errors import SourceLoc, TkcError
from tkc.ir.ops import EmptyOp, FillOp, LoadOp
from tkc.ir.types import SharedTileType, SharedVecType
from tkc.targets import Target


def shared_allocations(fn: func.FuncOp) -> list[tuple[object, int]]:
    """Ops that create a shared tile or vector (rather than update one), with their bytes. Each is one buffer: an
    op inside a loop reuses its buffer on every iteration. Later passes (pipelining) multiply buffers."""
    allocs = []
    for op in fn.walk():
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
