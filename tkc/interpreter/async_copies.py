"""Asynchronous copies in the tile interpreter: data lands in a ring stage only at a covering `wait_group`.

Groups are counted per block (blocks of a grid may run a pipelined loop a different number of times): each
copy remembers which blocks started it and, once committed, its group number in each of them; `wait_group N`
lands, for every active block, the copies of all but its N newest groups. Reading a stage whose copy has not
landed gives its old contents (NaN at first), so a missing wait shows up as a wrong answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from xdsl.interpreter import Interpreter, InterpreterFunctions, PythonValues, impl, register_impls

from tkc.interpreter.control import lane_state
from tkc.interpreter.lanes import block_uniform, round_to
from tkc.ir import async_ops as a
from tkc.ir.ops import index_units


def gather_global(source: object, coords: list[np.ndarray], tile: tuple[int, ...],
                  units: list[int] | None = None, rows: object = None, end: object = None) -> np.ndarray:
    """The tile at tile coordinates `coords` (steps of `units`, default the tile's extent) of a global tensor, zeros
    past its end (as `tile.load` reads it); with `rows` (rows_at's index tensor) the tile's row i is the tensor's row
    rows[r + i], r the row coordinate; with `end` (rows(r, end)), rows from there on read zeros."""
    from tkc.interpreter.tile import _before_end, _element_indices, _gathered_indices

    data = source.data  # type: ignore[attr-defined]
    if rows is not None:
        idx, valid = _gathered_indices(coords, tile, data.shape, rows.data, end)  # type: ignore[attr-defined]
    else:
        idx, valid = _element_indices(coords, tile, data.shape, units)
        valid = _before_end(valid, idx, end)
    if data.size == 0:
        return np.zeros(valid.shape, dtype=np.float32)
    clipped = [np.clip(i, 0, max(n - 1, 0)) for i, n in zip(idx, data.shape)]
    return np.where(valid, data[tuple(clipped)], np.float32(0))


@dataclass
class Ring:
    buffers: np.ndarray  # (blocks, stages, *shape)


@dataclass
class Copy:
    ring: Ring
    stage: np.ndarray  # (blocks,)
    values: np.ndarray  # (blocks, *shape)
    issued: np.ndarray  # (blocks,) bool
    group: np.ndarray  # (blocks,) int, -1 until committed
    landed: np.ndarray  # (blocks,) bool


@dataclass
class AsyncState:
    copies: list[Copy] = field(default_factory=list)
    committed: np.ndarray | None = None  # groups committed so far, per block


def _async_state(interpreter: Interpreter) -> AsyncState:
    return interpreter.get_data(AsyncState, "state", AsyncState)  # type: ignore[no-any-return]


def _active_blocks(interpreter: Interpreter, what: str) -> np.ndarray:
    state = lane_state(interpreter)
    state.require_block_uniform(what)
    return state.active_blocks()


def _per_block(value: np.ndarray, blocks: int, what: str) -> np.ndarray:
    value = block_uniform(np.asarray(value), what)
    return np.broadcast_to(value[:, 0], (blocks,) + value.shape[2:]).copy()


class AsyncFunctions(InterpreterFunctions):
    @impl(a.RingAllocOp)
    def run_ring_alloc(self, interpreter: Interpreter, op: a.RingAllocOp, args: PythonValues) -> PythonValues:
        ring_type = op.result.type
        blocks = lane_state(interpreter).blocks
        shape = (blocks, ring_type.stages.data, *ring_type.buffer.shape)
        return (Ring(np.full(shape, np.nan, dtype=np.float32)),)

    @impl(a.CopyAsyncOp)
    def run_copy_async(self, interpreter: Interpreter, op: a.CopyAsyncOp, args: PythonValues) -> PythonValues:
        source, *indices = args[: 1 + len(op.indices)]
        ring, stage, *extras = args[1 + len(op.indices):]
        end = block_uniform(np.asarray(extras.pop()), "a copy's end") if op.rows_end is not None else None
        rows = extras.pop() if op.row_index is not None else None
        blocks = lane_state(interpreter).blocks
        issued = _active_blocks(interpreter, "an asynchronous copy")
        coords = [block_uniform(np.asarray(i), "the index of an asynchronous copy") for i in indices]
        buffer = op.ring.type.buffer
        values = gather_global(source, coords, buffer.shape, index_units(op, buffer.shape), rows, end)
        values = round_to(np.broadcast_to(values[:, 0], (blocks, *buffer.shape)), buffer.element_type)
        copy = Copy(ring, _per_block(stage, blocks, "a ring stage"), values.copy(), issued,
                    np.full(blocks, -1, dtype=np.int64), np.zeros(blocks, dtype=bool))
        _async_state(interpreter).copies.append(copy)
        return ()

    @impl(a.CommitGroupOp)
    def run_commit(self, interpreter: Interpreter, op: a.CommitGroupOp, args: PythonValues) -> PythonValues:
        state = _async_state(interpreter)
        active = _active_blocks(interpreter, "commit_group")
        if state.committed is None:
            state.committed = np.zeros(active.shape[0], dtype=np.int64)
        for copy in state.copies:
            joins = active & copy.issued & (copy.group < 0)
            copy.group[joins] = state.committed[joins]
        state.committed[active] += 1
        return ()

    @impl(a.WaitGroupOp)
    def run_wait(self, interpreter: Interpreter, op: a.WaitGroupOp, args: PythonValues) -> PythonValues:
        state = _async_state(interpreter)
        active = _active_blocks(interpreter, "wait_group")
        if state.committed is None:
            return ()
        limit = state.committed - op.pending.value.data
        remaining = []
        for copy in state.copies:
            lands = active & (copy.group >= 0) & (copy.group < limit) & ~copy.landed
            blocks = np.nonzero(lands)[0]
            copy.ring.buffers[blocks, copy.stage[blocks]] = copy.values[blocks]
            copy.landed |= lands
            if not (copy.landed | ~copy.issued).all():
                remaining.append(copy)
        state.copies = remaining
        return ()

    @impl(a.RingReadOp)
    def run_ring_read(self, interpreter: Interpreter, op: a.RingReadOp, args: PythonValues) -> PythonValues:
        ring, stage = args
        blocks = ring.buffers.shape[0]
        stage = _per_block(stage, blocks, "a ring stage")
        return (ring.buffers[np.arange(blocks), stage][:, None].copy(),)


register_impls(AsyncFunctions)
