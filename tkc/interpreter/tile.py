"""Numpy semantics of every tile op, on lane arrays (see lanes.py). This is the oracle later passes are tested
against, so it follows the op definitions literally: bf16/f16 results are rounded after every op, loads past
the end of a tensor read zeros, stores past the end are dropped, empty shared tiles hold NaN."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from xdsl.dialects import func
from xdsl.interpreter import Interpreter, InterpreterFunctions, PythonValues, impl, register_impls
from xdsl.ir import Attribute, Operation

from tkc.errors import TkcError
from tkc.interpreter.control import lane_state
from tkc.interpreter.lanes import LANE_AXES, GlobalTensor, block_uniform, expand_to, round_to
from tkc.ir import ops as t
from tkc.ir.types import GlobalType, RegTileType, SharedTileType, SharedVecType


def _lift(x: np.ndarray, ndim: int) -> np.ndarray:
    """A lane scalar (B|1, W|1) with axes added to broadcast against an array of `ndim` dimensions."""
    x = np.asarray(x)
    return x.reshape(x.shape + (1,) * (ndim - x.ndim))


def _elem(type_: Attribute) -> Attribute:
    return type_.element_type  # type: ignore[attr-defined]


def _tile_shape(type_: Attribute) -> tuple[int, ...]:
    return type_.shape  # type: ignore[attr-defined]


_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp": np.exp,
    "exp2": np.exp2,
    "log": np.log,
    "log2": np.log2,
    "abs": np.abs,
    "relu": lambda x: np.maximum(x, 0),
    "neg": np.negative,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "tanh": np.tanh,
    "copy": lambda x: x,
}
_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "max": np.maximum,
    "min": np.minimum,
}
_REDUCE: dict[str, tuple[Callable[..., np.ndarray], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "max": (np.max, np.maximum),
    "min": (np.min, np.minimum),
    "sum": (np.sum, np.add),
    "prod": (np.prod, np.multiply),
}


def _element_indices(
    coords: list[np.ndarray], tile: tuple[int, ...], shape: tuple[int, ...], units: Sequence[int] | None = None
) -> tuple[list[np.ndarray], np.ndarray]:
    """Element indices of a tile at tile coordinates `coords` in a tensor of `shape`, broadcast to
    (B, W, *tile), and which of them are in bounds. `units`: what one step of each tile coordinate moves (default:
    the tile's extent; `t.index_units`)."""
    k = len(tile)
    trailing = (1,) * k
    idx = [np.asarray(c, dtype=np.int64).reshape(np.shape(c) + trailing) for c in coords[:-k]]
    for d, (c, n, unit) in enumerate(zip(coords[-k:], tile, units or tile)):
        along = np.arange(n, dtype=np.int64).reshape([n if i == d else 1 for i in range(k)])
        idx.append(np.asarray(c, dtype=np.int64).reshape(np.shape(c) + trailing) * unit + along)
    idx = list(np.broadcast_arrays(*idx))
    valid = np.ones(idx[0].shape, dtype=bool)
    for i, size in zip(idx, shape):
        valid &= (i >= 0) & (i < size)
    return idx, valid


def _gathered_indices(coords: list[np.ndarray], tile: tuple[int, ...], shape: tuple[int, ...],
                      rows: np.ndarray, end: Any = None) -> tuple[list[np.ndarray], np.ndarray]:
    """As _element_indices for a load whose row coordinate r counts into the index tensor `rows` (rows_at): the
    tile's row i is the tensor's row rows[r + i], in bounds where r + i lies in `rows` (and before `end`) and its
    value in the tensor's rows."""
    idx, valid = _element_indices(coords, tile, (*shape[:-2], rows.shape[0], shape[-1]), [1, tile[-1]])
    valid = _before_end(valid, idx, end)
    at = np.clip(idx[-2], 0, max(rows.shape[0] - 1, 0))
    gathered = rows[at] if rows.size else np.zeros_like(at)
    idx[-2] = gathered.astype(np.int64)
    return idx, valid & (idx[-2] >= 0) & (idx[-2] < shape[-2])


def _before_end(valid: np.ndarray, idx: list[np.ndarray], end: Any, row_axis: int = -2) -> np.ndarray:
    """`valid` where the row coordinate idx[row_axis] (a tensor's row, or a place in rows_at's index; a register
    vector's: its last, -1) lies before `end` (rows(r, end), rows_at(I, r, end); None: no end)."""
    if end is None:
        return valid
    row, end = idx[row_axis], np.asarray(end, dtype=np.int64)
    return valid & (row < end.reshape(end.shape + (1,) * (row.ndim - end.ndim)))


def _row_extras(op: Operation, coords: list) -> tuple[list, Any, Any]:
    """A global load's / store's index values without its trailing extras, its rows_at index tensor and its rows' end
    (None where it has none)."""
    coords = list(coords)
    end = coords.pop() if op.rows_end is not None else None  # type: ignore[attr-defined]
    rows = coords.pop() if op.row_index is not None else None  # type: ignore[attr-defined]
    return coords, rows, end


def _subtile_indices(
    coords: list[np.ndarray], tile: tuple[int, ...], outer: tuple[int, ...], active: np.ndarray, what: str
) -> list[np.ndarray]:
    """Element indices of a sub-tile of a shared tile or vector. Only active lanes must be in range (an inactive
    lane may hold any index, e.g. a loop variable past its own trip count); the others are clipped."""
    idx, valid = _element_indices(coords, tile, outer)
    if not (valid | ~expand_to(active, valid)).all():
        raise TkcError(f"{what}: sub-tile index out of range")
    return [np.clip(i, 0, n - 1) for i, n in zip(idx, outer)]


def _cluster_of(op: Operation) -> int:
    """The cluster size of the kernel holding `op`."""
    fn = op.parent_op()
    while fn is not None and not isinstance(fn, func.FuncOp):
        fn = fn.parent_op()
    return t.cluster_size(fn)  # type: ignore[arg-type]


def _with_blocks(idx: list[np.ndarray], nblocks: int, source_blocks: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Index arrays broadcast to `nblocks` blocks, and the matching index into the block axis of a shared value
    that holds `source_blocks` blocks (1 when it is the same for every block)."""
    shape = (max(nblocks, idx[0].shape[0]),) + idx[0].shape[1:]
    idx = [np.broadcast_to(i, shape) for i in idx]
    if source_blocks > 1:
        blocks = np.arange(shape[0]).reshape((shape[0],) + (1,) * (len(shape) - 1))
    else:
        blocks = np.zeros((1,) * len(shape), dtype=np.int64)
    return np.broadcast_to(blocks, shape), idx


def _global_writes(state: Any, op: Operation, value: Any, dest: Any, coords: list,
                   every_lane: bool = False) -> tuple[tuple, np.ndarray]:
    """The elements of `dest` a store (or atomic add) of `value` at `coords` writes, and what it writes there; with
    `every_lane`, one write per lane (block, warp), those of lanes holding the same value included."""
    vtype = op.value.type
    coords, rows, end = _row_extras(op, coords)
    if rows is not None:  # rows_at: the tile's rows from the index tensor
        idx, valid = _gathered_indices(coords, _tile_shape(vtype), dest.data.shape, rows.data, end)
    else:
        idx, valid = _element_indices(coords, _tile_shape(vtype), dest.data.shape,
                                      t.index_units(op, _tile_shape(vtype)))
        valid = _before_end(valid, idx, end, -len(_tile_shape(vtype)))
    active = expand_to(state.active(), valid)
    # the value, the index and the mask may each vary over different lanes (a per-warp value stored at one
    # index by one warp): broadcast all three to the lanes of any of them
    shape = np.broadcast_shapes(valid.shape, np.shape(value), active.shape)
    if every_lane:
        shape = (state.blocks, state.warps) + shape[LANE_AXES:]
    idx = [np.broadcast_to(i, shape) for i in idx]
    value = np.broadcast_to(round_to(value, dest.element_type), shape)
    write = np.broadcast_to(valid, shape) & np.broadcast_to(active, shape)
    return tuple(i[write] for i in idx), value[write]


class TileFunctions(InterpreterFunctions):
    # Indices ---------------------------------------------------------------------------------------------------

    @impl(t.BlockIdxOp)
    def run_block_idx(self, interpreter: Interpreter, op: t.BlockIdxOp, args: PythonValues) -> PythonValues:
        return (lane_state(interpreter).block_index(op.dim.value.data),)

    @impl(t.NumBlocksOp)
    def run_num_blocks(self, interpreter: Interpreter, op: t.NumBlocksOp, args: PythonValues) -> PythonValues:
        return (np.full((1, 1), lane_state(interpreter).grid[op.dim.value.data], dtype=np.int64),)

    @impl(t.WarpIdOp)
    def run_warp_id(self, interpreter: Interpreter, op: t.WarpIdOp, args: PythonValues) -> PythonValues:
        return (lane_state(interpreter).warp_index(),)

    @impl(t.WarpgroupIdOp)
    def run_warpgroup_id(self, interpreter: Interpreter, op: t.WarpgroupIdOp, args: PythonValues) -> PythonValues:
        return (lane_state(interpreter).warp_index() // 4,)

    @impl(t.ClusterRankOp)
    def run_cluster_rank(self, interpreter: Interpreter, op: t.ClusterRankOp, args: PythonValues) -> PythonValues:
        return (lane_state(interpreter).block_index(0) % _cluster_of(op),)

    @impl(t.DimOp)
    def run_dim(self, interpreter: Interpreter, op: t.DimOp, args: PythonValues) -> PythonValues:
        tensor: GlobalTensor = args[0]
        return (np.full((1, 1), tensor.data.shape[op.index.value.data], dtype=np.int64),)

    # Fills -----------------------------------------------------------------------------------------------------

    @impl(t.FillOp)
    def run_fill(self, interpreter: Interpreter, op: t.FillOp, args: PythonValues) -> PythonValues:
        rtype = op.result.type
        if isinstance(rtype, SharedTileType | SharedVecType):
            lane_state(interpreter).require_block_uniform("a shared fill")
        value = np.full((1, 1, *_tile_shape(rtype)), op.fill_value, dtype=np.float32)
        return (round_to(value, _elem(rtype)),)

    @impl(t.EmptyOp)
    def run_empty(self, interpreter: Interpreter, op: t.EmptyOp, args: PythonValues) -> PythonValues:
        lane_state(interpreter).require_block_uniform("an empty shared tile")
        return (np.full((1, 1, *_tile_shape(op.result.type)), np.nan, dtype=np.float32),)

    # Elementwise -----------------------------------------------------------------------------------------------

    def _unary(self, interpreter: Interpreter, op: t.UnaryOp, args: PythonValues) -> PythonValues:
        with np.errstate(all="ignore"):
            value = _UNARY[op.name.split(".")[1]](args[0])
        return (round_to(value, _elem(op.result.type)),)

    def _binary(self, interpreter: Interpreter, op: t.BinaryOp, args: PythonValues) -> PythonValues:
        ndim = LANE_AXES + len(_tile_shape(op.result.type))
        lhs, rhs = (_lift(a, ndim) for a in args)
        with np.errstate(all="ignore"):
            value = _BINARY[op.fn](lhs.astype(np.float32), rhs.astype(np.float32))
        return (round_to(value, _elem(op.result.type)),)

    def _broadcast_binary(self, interpreter: Interpreter, op: t.BroadcastBinaryOp, args: PythonValues) -> PythonValues:
        tile, vec = args
        vec = vec[..., :, None] if op.axis == "row" else vec[..., None, :]
        with np.errstate(all="ignore"):
            value = _BINARY[op.fn](tile, vec)
        return (round_to(value, _elem(op.result.type)),)

    @impl(t.BroadcastRowOp)
    def run_broadcast_row(self, interpreter: Interpreter, op: t.BroadcastRowOp, args: PythonValues) -> PythonValues:
        (vec,) = args
        rows, cols = _tile_shape(op.result.type)
        return (np.broadcast_to(vec[..., :, None], vec.shape[:-1] + (rows, cols)).copy(),)

    @impl(t.BroadcastColOp)
    def run_broadcast_col(self, interpreter: Interpreter, op: t.BroadcastColOp, args: PythonValues) -> PythonValues:
        (vec,) = args
        rows, cols = _tile_shape(op.result.type)
        return (np.broadcast_to(vec[..., None, :], vec.shape[:-1] + (rows, cols)).copy(),)

    # Reductions ------------------------------------------------------------------------------------------------

    def _reduce(self, interpreter: Interpreter, op: t.ReduceOp, args: PythonValues) -> PythonValues:
        reduce, combine = _REDUCE[op.fn]
        tile = args[0]
        with np.errstate(all="ignore"):
            value = reduce(tile, axis=-1 if op.axis == "row" else -2).astype(np.float32)
            if len(args) > 1:
                value = combine(args[1], value)
        return (round_to(value, _elem(op.result.type)),)

    def _vector_reduce(self, interpreter: Interpreter, op: t.VectorReduceOp, args: PythonValues) -> PythonValues:
        reduce, _ = _REDUCE[op.fn]
        with np.errstate(all="ignore"):
            return (reduce(args[0], axis=-1).astype(np.float32),)

    @impl(t.FinishRowSumOp)
    def run_finish_row_sum(self, interpreter: Interpreter, op: t.FinishRowSumOp, args: PythonValues) -> PythonValues:
        return (args[0],)  # a partial row_sum here is the row's whole sum: the lanes' parts are the lowering's

    # Conversions, layout, masking ------------------------------------------------------------------------------

    @impl(t.ConvertOp)
    def run_convert(self, interpreter: Interpreter, op: t.ConvertOp, args: PythonValues) -> PythonValues:
        return (round_to(args[0], _elem(op.result.type)),)

    @impl(t.RelayoutOp)
    def run_relayout(self, interpreter: Interpreter, op: t.RelayoutOp, args: PythonValues) -> PythonValues:
        return (args[0],)

    @impl(t.TransposeOp)
    def run_transpose(self, interpreter: Interpreter, op: t.TransposeOp, args: PythonValues) -> PythonValues:
        return (np.swapaxes(args[0], -1, -2).copy(),)

    @impl(t.RotatePairsOp)
    def run_rotate_pairs(self, interpreter: Interpreter, op: t.RotatePairsOp, args: PythonValues) -> PythonValues:
        pairs = args[0].reshape(*args[0].shape[:-1], -1, 2)
        return (np.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(args[0].shape),)

    def _triangle(self, interpreter: Interpreter, op: t.TriangleOp, args: PythonValues) -> PythonValues:
        tile, diagonal = args
        rows, cols = tile.shape[-2:]
        i = np.arange(rows).reshape(rows, 1)
        j = np.arange(cols).reshape(1, cols)
        d = _lift(diagonal, tile.ndim)
        if isinstance(op, t.KeepColsOp):
            keep = j < d
        elif isinstance(op, t.KeepRowsOp):
            keep = i < d
        else:
            keep = (j <= i + d) if isinstance(op, t.TrilOp) else (j >= i + d)
        return (round_to(np.where(keep, tile, np.float32(op.fill_value)), _elem(op.result.type)),)

    # Matrix multiply -------------------------------------------------------------------------------------------

    def _mma(self, interpreter: Interpreter, op: t.MmaOp, args: PythonValues) -> PythonValues:
        a, b, c = args
        if op.transpose_a:
            a = np.swapaxes(a, -1, -2)
        if op.transpose_b:
            b = np.swapaxes(b, -1, -2)
        return ((np.matmul(a.astype(np.float32), b.astype(np.float32)) + c).astype(np.float32),)

    def _wgmma(self, interpreter: Interpreter, op: t.WgmmaOp, args: PythonValues) -> PythonValues:
        # a (B|1, 1, 64, K), (.., K, 64) transposed, or a warp's rows (B|1, W|1, 16, K); b (B|1, 1, K, N) or (.., N, K)
        a, b, c = args
        if op.transpose_a:
            a = np.swapaxes(a, -1, -2)
        if op.transpose_b:
            b = np.swapaxes(b, -1, -2)
        product = np.matmul(a.astype(np.float32), b.astype(np.float32))
        if isinstance(op.a.type, RegTileType):  # each warp's own 16 rows
            return ((product + c).astype(np.float32),)
        state = lane_state(interpreter)
        rows = (state.warp_index() % 4)[..., None] * 16 + np.arange(16)  # (1, W, 16): this warp's rows
        lanes = np.broadcast_shapes(product.shape[:2], rows.shape[:2], c.shape[:2])
        product = np.broadcast_to(product, (*lanes, *product.shape[2:]))
        mine = np.take_along_axis(product, np.broadcast_to(rows, (*lanes, 16))[..., None], axis=2)
        return ((mine + c).astype(np.float32),)

    # Memory ----------------------------------------------------------------------------------------------------

    @impl(t.LoadOp)
    def run_load(self, interpreter: Interpreter, op: t.LoadOp, args: PythonValues) -> PythonValues:
        state = lane_state(interpreter)
        source, *coords = args
        coords, gathered, end = _row_extras(op, coords)  # rows_at's index tensor, rows(r, end)'s end
        stype, rtype = op.source.type, op.result.type
        tile = _tile_shape(rtype)
        if isinstance(stype, GlobalType):
            if isinstance(rtype, SharedTileType | SharedVecType):
                state.require_block_uniform("a load into shared memory")
                coords = [block_uniform(c, "the index of a load into shared memory") for c in coords]
                end = None if end is None else block_uniform(end, "the end of a load into shared memory")
            read = t.source_shape(op, tile)  # each column read fills repeat_cols adjacent ones
            if gathered is None:
                idx, valid = _element_indices(coords, read, source.data.shape, t.index_units(op, tile))
                valid = _before_end(valid, idx, end, -len(tile))
            else:
                idx, valid = _gathered_indices(coords, read, source.data.shape, gathered.data, end)
            clipped = [np.clip(i, 0, max(n - 1, 0)) for i, n in zip(idx, source.data.shape)]
            if source.data.size == 0:
                value = np.zeros(valid.shape, dtype=np.float32)
            else:
                value = np.where(valid, source.data[tuple(clipped)], np.float32(0))
            return (round_to(np.repeat(value, t.repeat_cols(op), axis=-1), _elem(rtype)),)
        # shared → registers: a sub-tile of the block's shared value
        idx = _subtile_indices(coords, tile, _tile_shape(stype), state.active(), "load")
        blocks, idx = _with_blocks(idx, source.shape[0], source.shape[0])
        return (round_to(source[(blocks, 0, *idx)], _elem(rtype)),)

    @impl(t.ClusterLoadOp)
    def run_cluster_load(self, interpreter: Interpreter, op: t.ClusterLoadOp, args: PythonValues) -> PythonValues:
        """A sub-tile of another block's shared value: the interpreter runs the grid in lockstep, so block b's
        peer of rank r holds its value of the same SSA value at this point (cluster_sync made it so on the GPU)."""
        state = lane_state(interpreter)
        source, *coords, rank = args
        cluster = _cluster_of(op)
        active = state.active()
        if np.any(((rank < 0) | (rank >= cluster)) & active):
            raise TkcError(f"load(..., rank=r): r outside the cluster of {cluster} blocks")
        tile = _tile_shape(op.result.type)
        idx = _subtile_indices(coords, tile, _tile_shape(op.source.type), active, "load")
        blocks = np.arange(state.blocks).reshape(-1, 1)
        peer = blocks - state.block_index(0) % cluster + rank  # (B, W|1): the block this lane reads
        lanes = np.broadcast_shapes(idx[0].shape[:LANE_AXES], peer.shape)
        idx = [np.broadcast_to(i, lanes + i.shape[LANE_AXES:]) for i in idx]
        peer = np.broadcast_to(peer.reshape(peer.shape + (1,) * (idx[0].ndim - LANE_AXES)), idx[0].shape)
        source = np.broadcast_to(source, (state.blocks,) + source.shape[1:])
        return (round_to(source[(peer, 0, *idx)], _elem(op.result.type)),)

    @impl(t.ClusterSyncOp)
    def run_cluster_sync(self, interpreter: Interpreter, op: t.ClusterSyncOp, args: PythonValues) -> PythonValues:
        lane_state(interpreter).require_block_uniform("a cluster_sync")
        return ()

    @impl(t.StoreOp)
    def run_store(self, interpreter: Interpreter, op: t.StoreOp, args: PythonValues) -> PythonValues:
        state = lane_state(interpreter)
        value, dest, *coords = args
        if isinstance(op.value.type, SharedTileType | SharedVecType):
            state.require_block_uniform("a store from shared memory")
            coords = [block_uniform(c, "the index of a store from shared memory") for c in coords]
        targets, values = _global_writes(state, op, value, dest, coords)
        _check_store_race(dest, targets, values)
        dest.data[targets] = values
        dest.written = True
        return ()

    @impl(t.AtomicAddOp)
    def run_atomic_add(self, interpreter: Interpreter, op: t.AtomicAddOp, args: PythonValues) -> PythonValues:
        value, dest, *coords = args
        targets, values = _global_writes(lane_state(interpreter), op, value, dest, coords, every_lane=True)
        np.add.at(dest.data, targets, values)  # every lane's addend, those into one element included (any order)
        dest.written = True
        return ()

    @impl(t.InsertOp)
    def run_insert(self, interpreter: Interpreter, op: t.InsertOp, args: PythonValues) -> PythonValues:
        state = lane_state(interpreter)
        state.require_block_uniform("a store into shared memory")
        value, dest, *coords = args
        outer = _tile_shape(op.dest.type)
        idx = _subtile_indices(coords, _tile_shape(op.value.type), outer, state.active(), "store")
        # broadcast the index, the value and the mask to the lanes of any of them (and to the blocks of dest)
        lanes = np.broadcast_shapes(idx[0].shape[:LANE_AXES], value.shape[:LANE_AXES], state.active().shape,
                                    (dest.shape[0], 1))
        nblocks = lanes[0]
        result = np.array(np.broadcast_to(dest, (nblocks,) + dest.shape[1:]), dtype=np.float32)
        idx = [np.broadcast_to(i, lanes + i.shape[LANE_AXES:]) for i in idx]
        blocks, idx = _with_blocks(idx, nblocks, nblocks)
        value = np.broadcast_to(round_to(value, _elem(op.dest.type)), idx[0].shape)
        active = np.broadcast_to(expand_to(state.active(), idx[0]), idx[0].shape)
        flat = np.ravel_multi_index((blocks[active], *(i[active] for i in idx)), (nblocks, *result.shape[2:]))
        values = value[active]
        _check_race(flat, values, "a store into a shared tile")
        result[(blocks[active], 0, *(i[active] for i in idx))] = values
        return (result,)

    @impl(t.TurnWaitOp)
    def run_turn_wait(self, interpreter: Interpreter, op: t.TurnWaitOp, args: PythonValues) -> PythonValues:
        return ()  # scheduling only: which warpgroup's wgmmas go first changes no value

    @impl(t.WgmmaWaitOp)
    def run_wgmma_wait(self, interpreter: Interpreter, op: t.WgmmaWaitOp, args: PythonValues) -> PythonValues:
        return ()  # the interpreter's wgmmas are done when issued

    @impl(t.TurnPassOp)
    def run_turn_pass(self, interpreter: Interpreter, op: t.TurnPassOp, args: PythonValues) -> PythonValues:
        return ()

    @impl(t.ReadOp)
    def run_read(self, interpreter: Interpreter, op: t.ReadOp, args: PythonValues) -> PythonValues:
        """Each lane's element of the int32 tensor (0 where its index lies outside the tensor)."""
        tensor, *indices = args
        shape = np.broadcast_shapes((1, 1), *(np.shape(i) for i in indices))
        idx = [np.broadcast_to(np.asarray(i, dtype=np.int64), shape) for i in indices]
        inside = np.ones(shape, dtype=bool)
        for i, n in zip(idx, tensor.data.shape):
            inside &= (i >= 0) & (i < n)
        if tensor.data.size == 0:
            return (np.zeros(shape, dtype=np.int64),)
        clipped = tuple(np.clip(i, 0, n - 1) for i, n in zip(idx, tensor.data.shape))
        return (np.where(inside, tensor.data[clipped], 0).astype(np.int64),)

    @impl(t.ArriveLastOp)
    def run_arrive_last(self, interpreter: Interpreter, op: t.ArriveLastOp, args: PythonValues) -> PythonValues:
        """The grid's blocks run together here: they arrive in the order of their index (each block's earlier global
        stores are all done by then), the last of `arrivals` at a counter gets True and sets it back to 0."""
        state = lane_state(interpreter)
        state.require_block_uniform("arrive_last")
        counter, index, arrivals = args
        index = np.broadcast_to(block_uniform(np.asarray(index), "arrive_last's index")[:, 0], (state.blocks,))
        arrivals = np.broadcast_to(block_uniform(np.asarray(arrivals), "arrive_last's arrivals")[:, 0], (state.blocks,))
        active, last = state.active_blocks(), np.zeros((state.blocks, 1), dtype=bool)
        for block in np.flatnonzero(active):
            at = int(index[block])
            if not 0 <= at < counter.data.shape[0]:
                raise TkcError(f"arrive_last: index {at} is past the counter's {counter.data.shape[0]} elements")
            counter.data[at] += 1
            if counter.data[at] == arrivals[block]:
                last[block, 0] = True
                counter.data[at] = 0
        counter.written = True
        return (last,)

    @impl(t.BarrierOp)
    def run_barrier(self, interpreter: Interpreter, op: t.BarrierOp, args: PythonValues) -> PythonValues:
        lane_state(interpreter).require_block_uniform("a barrier")
        return ()


def _check_race(flat: np.ndarray, values: np.ndarray, what: str) -> None:
    """Two lanes writing different values to one element is a race on the GPU: report it."""
    if flat.size < 2:
        return
    order = np.argsort(flat, kind="stable")
    f, v = flat[order], values[order]
    same = f[1:] == f[:-1]
    if same.any():
        differ = same & ~((v[1:] == v[:-1]) | (np.isnan(v[1:]) & np.isnan(v[:-1])))
        if differ.any():
            raise TkcError(f"{what}: different warps write different values to the same element")


def _check_store_race(dest: GlobalTensor, targets: tuple[np.ndarray, ...], values: np.ndarray) -> None:
    if targets and targets[0].size > 1:
        _check_race(np.ravel_multi_index(targets, dest.data.shape), values, f"a store into `{dest.name}`")


def _install(op_types: list[type], method: Callable[..., PythonValues], prefix: str) -> None:
    for op_type in op_types:
        setattr(TileFunctions, f"{prefix}_{op_type.__name__}", impl(op_type)(method))


_install(list(t.UNARY_OPS.values()), TileFunctions._unary, "run")
_install(list(t.BINARY_OPS.values()), TileFunctions._binary, "run")
_install(list(t.BROADCAST_BINARY_OPS.values()), TileFunctions._broadcast_binary, "run")
_install(list(t.REDUCE_OPS.values()), TileFunctions._reduce, "run")
_install(list(t.VECTOR_REDUCE_OPS.values()), TileFunctions._vector_reduce, "run")
_install([t.TrilOp, t.TriuOp, t.KeepColsOp, t.KeepRowsOp], TileFunctions._triangle, "run")
_install(list(t.MMA_OPS.values()), TileFunctions._mma, "run")
_install(list(t.WGMMA_OPS.values()), TileFunctions._wgmma, "run")
register_impls(TileFunctions)
