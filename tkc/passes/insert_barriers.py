"""insert-barriers: put a `tile.barrier` wherever one warp may touch shared memory another warp is using.

Shared tiles are values in tile IR, but on the GPU each lives in a buffer that every warp writes a part of and
reads a part of. A buffer written since the last barrier must not be read (read after write), and one read since
the last barrier must not be written (write after read). An asynchronous copy writes its buffer when a
`wait_group` lands it, but may overwrite it as soon as it starts. The pass walks the program with the set of
buffers written and read since the last barrier, iterating loop bodies to a fixed point, and inserts a barrier
right before the first op that would conflict; a conflict with what precedes a loop gets its barrier in front of
the loop (warps may run a loop a different number of times, and a barrier some of them skip hangs the block), and
one with what precedes an `if` in front of the `if`. A tile made in a loop with two buffers (`tile.empty
{tkc.buffers = 2}`, taken in turn by the steps) is another buffer in the next step: what one step did to it
conflicts only with what the step after next does, so a barrier a step (read after write) serves it.

    %s = tile.load %A[%i, %c0] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
    %r = tile.load %s[%w, %c0] : !tile.st<64x64xbf16> -> !tile.rt<16x64xbf16>
becomes
    %s = tile.load %A[%i, %c0] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
    tile.barrier
    %r = tile.load %s[%w, %c0] : !tile.st<64x64xbf16> -> !tile.rt<16x64xbf16>
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xdsl.context import Context
from xdsl.dialects import scf
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from tkc.errors import SourceLoc, TkcError
from tkc.ir import async_ops as a
from tkc.ir import ops as t
from tkc.ir.types import SharedTileType, SharedVecType
from tkc.passes import register
from tkc.passes.util import double_buffered, innermost_for


def is_shared(value: SSAValue) -> bool:
    return isinstance(value.type, SharedTileType | SharedVecType | a.RingType)


def is_view(op: Operation) -> bool:
    """A load of a shared tile from a shared tile: a view of some of its rows, no memory of its own."""
    return isinstance(op, t.LoadOp) and is_shared(op.source) and isinstance(op.result.type, SharedTileType)


def buffer_of(value: SSAValue) -> Operation:
    """The op that allocates the buffer holding a shared value (an allocating op or a ring)."""
    seen: set[SSAValue] = set()
    while True:
        if value in seen:
            raise TkcError("cyclic shared value")
        seen.add(value)
        owner = value.owner
        if isinstance(owner, Block):
            loop = owner.parent_op()
            if isinstance(loop, scf.ForOp):
                value = loop.iter_args[value.index - 1]  # type: ignore[attr-defined]
                continue
            raise TkcError("a shared tile enters a region it cannot come from")
        if isinstance(owner, t.InsertOp):
            value = owner.dest
        elif isinstance(owner, a.RingReadOp):
            value = owner.ring
        elif is_view(owner):
            value = owner.source  # type: ignore[attr-defined]
        elif isinstance(owner, scf.ForOp):
            value = owner.iter_args[value.index]  # type: ignore[attr-defined]
        elif isinstance(owner, scf.IfOp):
            yield_op = owner.true_region.block.last_op
            value = yield_op.operands[value.index]  # type: ignore[union-attr, attr-defined]
        else:
            return owner


@dataclass(frozen=True)
class OtherBuffer:
    """The buffer of a double-buffered tile (`tile.empty {tkc.buffers = 2}`) that the current step does not use."""

    alloc: Operation


@dataclass
class SyncState:
    written: set[Operation] = field(default_factory=set)  # written (or landed) since the last barrier
    read: set[Operation] = field(default_factory=set)  # read since the last barrier
    in_flight: set[Operation] = field(default_factory=set)  # targets of copies not yet waited for

    def next_step(self, double: set[Operation]) -> SyncState:
        """The state at a loop's back edge as the next step sees it: a double-buffered tile's buffer of this step
        is the next step's other buffer, and its other buffer the next step's own."""
        def swap(buffers: set[Any]) -> set[Any]:
            return {OtherBuffer(b) if b in double else b.alloc if isinstance(b, OtherBuffer) and b.alloc in double
                    else b for b in buffers}

        return SyncState(swap(self.written), swap(self.read), swap(self.in_flight))

    def copy(self) -> SyncState:
        return SyncState(set(self.written), set(self.read), set(self.in_flight))

    def union(self, other: SyncState) -> SyncState:
        return SyncState(self.written | other.written, self.read | other.read, self.in_flight | other.in_flight)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SyncState) and (self.written, self.read, self.in_flight) == (
            other.written, other.read, other.in_flight)

    def barrier(self) -> None:
        self.written.clear()
        self.read.clear()


def _accesses(op: Operation) -> tuple[list[Operation], list[Operation], list[Operation]]:
    """(buffers read, buffers written now, buffers an async copy starts writing)."""
    reads: list[Operation] = []
    writes: list[Operation] = []
    starts: list[Operation] = []
    if is_view(op):
        pass  # an alias: the ops that use it read it
    elif isinstance(op, t.LoadOp):
        if is_shared(op.source):
            reads.append(buffer_of(op.source))
        elif is_shared(op.result):
            writes.append(op)
    elif isinstance(op, t.WgmmaOp):
        reads += [buffer_of(op.a), buffer_of(op.b)]
    elif isinstance(op, t.StoreOp) and is_shared(op.value):
        reads.append(buffer_of(op.value))
    elif isinstance(op, t.InsertOp):
        writes.append(buffer_of(op.dest))
    elif isinstance(op, t.FillOp) and is_shared(op.result):
        writes.append(op)
    elif isinstance(op, a.CopyAsyncOp):
        starts.append(buffer_of(op.ring))
    return reads, writes, starts


class BarrierInserter:
    def __init__(self, insert: bool):
        self.insert = insert

    def need_barrier(self, op: Operation, state: SyncState) -> None:
        if self.insert:
            barrier = t.BarrierOp()
            barrier.location = op.location
            Rewriter.insert_op(barrier, InsertPoint.before(op))
        state.barrier()

    def walk_block(self, block: Block, state: SyncState) -> SyncState:
        for op in list(block.ops):
            state = self.walk_op(op, state)
        return state

    def walk_op(self, op: Operation, state: SyncState) -> SyncState:
        if isinstance(op, t.BarrierOp):
            state.barrier()
            return state
        if isinstance(op, a.WaitGroupOp):
            state.written |= state.in_flight  # conservatively: everything in flight may land here
            return state
        if isinstance(op, scf.ForOp):
            return self.walk_loop(op, state)
        if isinstance(op, scf.IfOp):
            # A conflict with what came before goes in front of the `if`, not inside it: the barrier then also
            # serves the code after it when the branch is not taken (a pipeline's last, copy-less iterations).
            reads, writes = _region_accesses(op)
            if (state.written & reads) or ((state.read | state.written) & writes):
                self.need_barrier(op, state)
            then_state = self.walk_block(op.true_region.block, state.copy())
            else_state = self.walk_block(op.false_region.block, state.copy()) if op.false_region.blocks else state
            return then_state.union(else_state)
        reads, writes, starts = _accesses(op)
        if any(b in state.written for b in reads) or any(b in state.read or b in state.written for b in writes + starts):
            self.need_barrier(op, state)
        state.read.update(reads)
        state.written.update(writes)
        state.in_flight.update(starts)
        return state

    def walk_loop(self, loop: scf.ForOp, state: SyncState) -> SyncState:
        # A conflict with what came before the loop is settled by one barrier in front of it, not inside: warps
        # may run a loop a different number of times, and a barrier they do not all reach hangs the block.
        reads, writes = _region_accesses(loop)
        if (state.written & reads) or ((state.read | state.written) & writes):
            self.need_barrier(loop, state)
        entry = state.copy()
        # a double-buffered tile made in this loop: what a step did to it was to the other buffer of the next step
        double = {op for op in loop.walk() if double_buffered(op) and innermost_for(op) is loop}
        for _ in range(8):
            end = BarrierInserter(insert=False).walk_block(loop.body.block, entry.copy()).next_step(double)
            widened = entry.union(end)
            if widened == entry:
                break
            entry = widened
        else:
            raise TkcError("insert-barriers did not converge", SourceLoc.from_attr(loop.location))
        end = self.walk_block(loop.body.block, entry.copy())
        return entry.union(end)


def _region_accesses(parent: scf.ForOp | scf.IfOp) -> tuple[set[Operation], set[Operation]]:
    """Buffers a loop's body or an if's branches (nested regions included) may read, and may write or start
    copies into."""
    reads: set[Operation] = set()
    writes: set[Operation] = set()
    for op in parent.walk():
        if op is parent:
            continue
        r, w, s_ = _accesses(op)
        reads.update(r)
        writes.update(w)
        writes.update(s_)
    return reads, writes


def insert_barriers(module: ModuleOp) -> None:
    for fn in module.ops:
        body = fn.regions[0].block if fn.regions else None
        if body is not None:
            BarrierInserter(insert=True).walk_block(body, SyncState())


@register("insert-barriers", "insert the block barriers that shared memory reads and writes need")
class InsertBarriers(ModulePass):
    name = "insert-barriers"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        insert_barriers(op)

