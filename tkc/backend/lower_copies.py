"""Block-wide copies of a tile between global and shared memory → `ptx` ops: every thread of the block moves its
16-byte (or narrower) chunks, global → shared by cp.async (zero-filled past the tensor's edge; element by element
where the tensor is not 4-byte aligned) and shared → global by ld.shared + st.global; and the rings of pipelined
loops (insert_async_pipeline.py): a ring's stages, cp.async into a stage, commit and wait groups.

A thread's chunks sit at fixed steps from its first one, so its offset into a tile is computed once at the kernel's
entry and each chunk costs one add (ChunkPlan).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.ir import SSAValue

from tkc.backend import ptx
from tkc.backend.addressing import (InRows, add_address, add_i32, bundle_of, gathered_row_pointers, global_coords,
                                    in_bounds, lead_pointer, mad64, mul_imm, offset_of, row_limit, shared_base,
                                    shared_offset)
from tkc.backend.index import TID, Const, Expr, share_bases
from tkc.backend.lowering import GlobalRef, Imm, KernelLowering, RingRef, SharedRef, handles
from tkc.errors import TkcError
from tkc.ir import async_ops as a
from tkc.ir.types import element_bytes


@dataclass(frozen=True)
class ChunkPlan:
    """How a block's threads split a collective copy of a tile into chunks: `chunk` bytes each, `per_row` a row,
    `iters` a thread. A row of at most as many chunks as threads: thread t takes column t % per_row of row
    t // per_row + j·rows_per_pass in its j-th chunk, `rows_per_pass` = threads // per_row rows at once (a row of
    12 chunks over 128 threads: 10 rows a pass, 8 threads idle); a longer row: column t + threads·(j % passes)
    of row j // passes. Either way chunk j of every thread sits at one step from its first (its address one add),
    and `limits[j]` says which threads have a chunk j (tid < limits[j])."""

    chunk: int
    per_row: int
    rows: int
    threads: int

    @property
    def rows_per_pass(self) -> int:
        return self.threads // self.per_row

    @property
    def passes(self) -> int:  # passes over one row, for rows longer than the threads
        return -(-self.per_row // self.threads)

    @property
    def iters(self) -> int:
        if self.per_row <= self.threads:
            return -(-self.rows // self.rows_per_pass)
        return self.rows * self.passes

    @property
    def limits(self) -> list[int]:
        if self.per_row <= self.threads:
            return [min(self.rows_per_pass, self.rows - j * self.rows_per_pass) * self.per_row
                    for j in range(self.iters)]
        return [min(self.threads, self.per_row - self.threads * (j % self.passes)) for j in range(self.iters)]

    def position(self, j: int) -> tuple[Expr, Expr]:
        """(row, column in chunks) of chunk j of thread TID."""
        if self.per_row <= self.threads:
            return TID // self.per_row + j * self.rows_per_pass, TID % self.per_row
        return Const(j // self.passes), TID + self.threads * (j % self.passes)


def _chunk_plan(lw: KernelLowering, shape: tuple[int, ...], e: int, align: int) -> ChunkPlan:
    """The chunks of a collective copy of a tile of `shape` (elements of `e` bytes, rows `align`-aligned)."""
    row_bytes = shape[-1] * e
    chunk = min(16, align, row_bytes)
    while row_bytes % chunk:
        chunk //= 2
    return ChunkPlan(chunk, row_bytes // chunk, shape[0] if len(shape) == 2 else 1, lw.copy_threads)


def _collective_exprs(plan: ChunkPlan, shape: tuple[int, ...], e: int):
    """Row and column (in elements, within the tile) of each chunk j of thread tid."""
    rows_exprs, cols_exprs = [], []
    for j in range(plan.iters):
        row, col = plan.position(j)
        rows_exprs.append(row if len(shape) == 2 else Const(0))
        cols_exprs.append(col * (plan.chunk // e))
    return rows_exprs, cols_exprs


def _static_steps(exprs: list[Expr], threads: int) -> list[int] | None:
    """expr_j(tid) = expr_0(tid) + step_j for every thread? Then the steps, else None."""
    tid = {"tid": np.arange(threads)}
    first = np.broadcast_to(exprs[0].eval(tid), (threads,))
    steps = []
    for e in exprs:
        diff = np.broadcast_to(e.eval(tid), (threads,)) - first
        if not (diff == diff[0]).all():
            return None
        steps.append(int(diff[0]))
    return steps


def _chunk_addresses(lw: KernelLowering, g: GlobalRef, coords: list[Any], shape: tuple[int, ...],
                     plan: ChunkPlan, gathered: GlobalRef | None = None) -> tuple[SSAValue, SSAValue]:
    """Global byte addresses (b64 bundle) of each thread's chunks of a tile, and whether each is inside the
    tensor. Chunk j of a thread sits at a fixed step from the thread's first chunk, the same step for every
    thread; so the thread's offset into a tile is computed once at kernel entry, and per tile the corner
    pointer plus each step is block-uniform (ptxas keeps it in uniform registers): one add per chunk.
    `gathered` (rows_at): the index tensor whose elements give the tile's rows (_gathered_chunk_addresses)."""
    e = element_bytes(g.type.element_type)
    k = len(shape)
    rank = g.type.rank
    lead, tile_coords = coords[:-k], coords[-k:]
    iters = plan.iters
    rows_e, cols_e = _collective_exprs(plan, shape, e)
    steps = [_static_steps(cols_e, lw.copy_threads)] + ([_static_steps(rows_e, lw.copy_threads)] if k == 2 else [])
    if any(s is None for s in steps):
        raise TkcError(f"internal: a copy of {shape} in {plan.chunk}-byte chunks over {lw.copy_threads} threads has "
                       "no regular pattern")
    if gathered is not None:
        return _gathered_chunk_addresses(lw, g, gathered, coords, shape, (rows_e[0], cols_e[0]),
                                         (steps[1], steps[0]))  # type: ignore[arg-type]
    axes = [(cols_e[0], rank - 1, shape[-1], tile_coords[-1], steps[0])]
    if k == 2:
        axes.append((rows_e[0], rank - 2, shape[0], tile_coords[0], steps[1]))

    def thread_offset() -> SSAValue:
        offset = None
        for first, dim, *_ in axes:
            wide = lw.op("cvt.s64.s32", "b64", lw.reg(lw.expr(first)), n=1)
            offset = (lw.op("mul.lo.s64", "b64", wide, g.strides[dim], n=1) if offset is None
                      else lw.op("mad.lo.s64", "b64", wide, g.strides[dim], offset, n=1))
        return offset  # type: ignore[return-value]

    offset = lw.at_entry(f"chunk offset {id(g)} {shape} {plan.chunk}", thread_offset)
    ptr, ok = lead_pointer(lw, g, lead)
    for first, dim, extent, coord, step in axes:
        origin = mul_imm(lw, coord, extent)
        ptr = mad64(lw, origin, g.strides[dim], ptr)
        # first + step + origin < size for each chunk  ⇔  origin ≥ 0 (a tile lies wholly before 0 or not at all)
        # and first < size − origin − step: the room left is uniform, one compare per distinct step.
        distinct = sorted(set(step))
        size = row_limit(lw, g.dims[dim], coord.end) if isinstance(coord, InRows) else g.dims[dim]  # rows(r, end)
        room = lw.op("sub.s32", "b32", size, lw.reg(origin), n=1)
        rooms = lw.op("sub.s32", "b32", room, ptx.PerInstr(distinct), n=len(distinct))
        inside = lw.op("setp.lt.s32", "pred", lw.reg(lw.expr(first)), rooms, n=len(distinct))
        if isinstance(coord, InRows):  # a tile at any row may start before row 0: first + step ≥ −origin
            before = lw.op("sub.s32", "b32", Imm(0), lw.reg(origin), n=1)
            lows = lw.op("sub.s32", "b32", before, ptx.PerInstr(distinct), n=len(distinct))
            inside = lw.op("and.pred", "pred", inside,
                           lw.op("setp.ge.s32", "pred", lw.reg(lw.expr(first)), lows, n=len(distinct)), n=len(distinct))
        elif not isinstance(origin, Imm):
            inside = lw.op("and.pred", "pred", inside, lw.op("setp.ge.s32", "pred", origin, Imm(0), n=1), n=len(distinct))
        inside = lw.op("mov.pred", "pred", (inside, np.array([distinct.index(x) for x in step])), n=iters)
        ok = inside if ok is None else lw.op("and.pred", "pred", inside, ok, n=iters)
    by_step: dict[tuple[int, ...], Any] = {}
    corners = []
    for j in range(iters):
        key = tuple(step[j] for *_, step in axes)
        if key not in by_step:
            corner = ptr
            for (_, dim, *_), d in zip(axes, key):
                corner = mad64(lw, Imm(d), g.strides[dim], corner)
            by_step[key] = corner
        corners.append(by_step[key])
    addrs = lw.op("add.s64", "b64", bundle_of(lw, corners, "b64"), offset, n=iters)
    return addrs, ok  # type: ignore[return-value]


def _gathered_chunk_addresses(lw: KernelLowering, g: GlobalRef, index: GlobalRef, coords: list[Any],
                              shape: tuple[int, ...], first: tuple[Expr, Expr],
                              steps: tuple[list[int], list[int]]) -> tuple[SSAValue, SSAValue]:
    """As _chunk_addresses for a tile whose row i is row index[r + i] of g (rows_at; r the row coordinate): the
    thread reads the row number of each distinct row its chunks lie in, and each chunk's address is that row's
    pointer plus the chunk's column step (an immediate)."""
    e, rank = element_bytes(g.type.element_type), g.type.rank
    (first_row, first_col), (row_steps, col_steps) = first, steps
    lead, (row_coord, col_coord) = coords[:-2], coords[-2:]
    ptr, ok = lead_pointer(lw, g, lead)
    col0 = add_i32(lw, mul_imm(lw, col_coord, shape[1]), lw.expr(first_col))
    ptr = mad64(lw, col0, g.strides[rank - 1], ptr)
    row0 = add_i32(lw, mul_imm(lw, row_coord, shape[0]), lw.expr(first_row))
    distinct_rows, distinct_cols = sorted(set(row_steps)), sorted(set(col_steps))
    end = row_coord.end if isinstance(row_coord, InRows) else None  # rows_at(I, r, end)
    row_ptrs, rows_ok = gathered_row_pointers(lw, g, index, row0, distinct_rows, ptr, end)
    cols_ok = in_bounds(lw, col0, distinct_cols, g.dims[rank - 1])
    ri = np.array([distinct_rows.index(r) for r in row_steps])
    ci = np.array([distinct_cols.index(c) for c in col_steps])
    iters = len(row_steps)
    inside = lw.op("and.pred", "pred", (rows_ok, ri), (cols_ok, ci), n=iters)
    if ok is not None:
        inside = lw.op("and.pred", "pred", inside, ok, n=iters)
    # a column step is a whole number of chunks: in bytes, as the tensor's rows are contiguous (cp.async chunks)
    addrs = lw.op("add.s64", "b64", (row_ptrs, ri), ptx.PerInstr([c * e for c in col_steps]), n=iters)
    return addrs, inside  # type: ignore[return-value]


def _inside_tile(lw: KernelLowering, plan: ChunkPlan) -> SSAValue | None:
    """Which of this thread's chunks to copy: those that exist (when a tile's chunks do not divide evenly among
    the threads), and none where an if-converted branch is not taken (lw.guard)."""
    inside, iters = None, plan.iters
    if any(limit < lw.copy_threads for limit in plan.limits):
        inside = lw.op("setp.lt.u32", "pred", lw.reg(lw.expr(TID)), ptx.PerInstr(plan.limits), n=iters)
    if lw.guard is not None:
        inside = lw.op("mov.pred", "pred", lw.guard, n=iters) if inside is None else \
            lw.op("and.pred", "pred", inside, lw.guard, n=iters)
    return inside  # type: ignore[return-value]


def copy_global_to_shared(lw: KernelLowering, g: GlobalRef, coords: list[Any], dst: SharedRef,
                          gathered: GlobalRef | None = None) -> None:
    """Every thread of the block copies its chunks of the tile; out-of-bounds chunks are zero-filled. `gathered`
    (rows_at): the index tensor naming the tensor's rows that the tile's rows are."""
    shape = dst.type.shape
    e = element_bytes(g.type.element_type)
    plan = _chunk_plan(lw, shape, e, g.align)
    chunk, iters = plan.chunk, plan.iters
    if chunk < 4:
        _copy_global_to_shared_sync(lw, g, coords, dst, gathered)
        return
    rows_e, cols_e = _collective_exprs(plan, shape, e)
    exprs = [shared_offset(dst.type, shape, r, c) for r, c in zip(rows_e, cols_e)]
    shared = share_bases(exprs, {"tid": np.arange(lw.copy_threads)})
    dst_bases = bundle_of(lw, [add_address(lw, dst.addr, lw.expr(b)) for b in shared.bases], "b32")
    srcs, ok = _chunk_addresses(lw, g, coords, shape, plan, gathered)
    srcs = lw.op("selp.b64", "b64", srcs, g.ptr, ok, n=iters)  # a chunk that reads nothing points at the tensor
    sizes = lw.op("selp.b32", "b32", Imm(chunk), Imm(0), ok, n=iters)
    guard = _inside_tile(lw, plan)
    lw.emit(ptx.CpAsyncOp(chunk, dst_bases, shared.base, shared.offset, srcs, np.arange(iters),
                          np.zeros(iters, dtype=np.int64), sizes, np.arange(iters), guard,
                          np.arange(iters) if guard is not None else None))


def _copy_global_to_shared_sync(lw: KernelLowering, g: GlobalRef, coords: list[Any], dst: SharedRef,
                                gathered: GlobalRef | None = None) -> None:
    """The slow path for tensors that are not 4-byte aligned: each thread loads its elements one by one (zeros
    out of bounds) and stores them to shared memory. Synchronous, so the data is there before any wait."""
    shape = dst.type.shape
    e = element_bytes(g.type.element_type)
    plan = _chunk_plan(lw, shape, e, e)
    iters = plan.iters
    rows_e, cols_e = _collective_exprs(plan, shape, e)
    exprs = [shared_offset(dst.type, shape, r, c) for r, c in zip(rows_e, cols_e)]
    shared = share_bases(exprs, {"tid": np.arange(lw.copy_threads)})
    dst_bases = bundle_of(lw, [add_address(lw, dst.addr, lw.expr(b)) for b in shared.bases], "b32")
    srcs, ok = _chunk_addresses(lw, g, coords, shape, plan, gathered)
    kind = f"b{8 * e}"
    inside = _inside_tile(lw, plan)
    if lw.guard is not None:
        ok = lw.op("and.pred", "pred", ok, lw.guard, n=iters)
    data = lw.emit(ptx.LoadOp("global", kind, 1, srcs, np.arange(iters), np.zeros(iters, dtype=np.int64),
                              np.arange(iters), ptx.regs("b32", iters), ok, np.arange(iters))).results[0]
    lw.emit(ptx.StoreOp("shared", kind, 1, dst_bases, shared.base, shared.offset, data, np.arange(iters),
                        inside, np.arange(iters) if inside is not None else None))


def copy_shared_to_global(lw: KernelLowering, src: SharedRef, g: GlobalRef, coords: list[Any]) -> None:
    shape = src.type.shape
    e = element_bytes(g.type.element_type)
    plan = _chunk_plan(lw, shape, e, max(g.align, e))
    chunk, iters = plan.chunk, plan.iters
    rows_e, cols_e = _collective_exprs(plan, shape, e)
    exprs = [shared_offset(src.type, shape, r, c) for r, c in zip(rows_e, cols_e)]
    shared = share_bases(exprs, {"tid": np.arange(lw.copy_threads)})
    src_bases = bundle_of(lw, [add_address(lw, src.addr, lw.expr(b)) for b in shared.bases], "b32")
    word = min(chunk, 4)
    words = chunk // word
    kind = f"b{8 * word}"
    inside = _inside_tile(lw, plan)  # a thread's chunk j past the tile reads nothing (it may lie past the buffer)
    data = lw.emit(ptx.LoadOp("shared", kind, words, src_bases, shared.base, shared.offset,
                              np.arange(iters) * words, ptx.regs("b32", iters * words), inside,
                              np.arange(iters) if inside is not None else None)).results[0]
    dsts, ok = _chunk_addresses(lw, g, coords, shape, plan)
    if inside is not None:
        ok = lw.op("and.pred", "pred", ok, inside, n=iters)  # type: ignore[assignment]
    lw.emit(ptx.StoreOp("global", kind, words, dsts, np.arange(iters), np.zeros(iters, dtype=np.int64),
                        data, np.arange(iters) * words, ok, np.arange(iters)))


# --------------------------------------------------------------------------------------------------------------
# The rings of pipelined loops


@handles(a.RingAllocOp)
def lower_ring_alloc(lw: KernelLowering, op: a.RingAllocOp) -> list[Any]:
    return [RingRef(shared_base(lw, offset_of(op)), op.result.type)]


def _stage_address(lw: KernelLowering, ring: RingRef, stage: Any) -> SSAValue:
    size = ring.type.buffer.nbytes  # type: ignore[attr-defined]
    if isinstance(stage, Imm):
        return add_address(lw, ring.addr, Imm(int(stage.value) * size))
    return lw.op("mad.lo.s32", "b32", stage, Imm(size), ring.addr, n=1)  # type: ignore[return-value]


def copy_into_stage(lw: KernelLowering, op: Any, stage: Any) -> None:
    """Every thread's cp.async chunks of the tile a copy op (tile.copy_async, tile.stage_copy) names into the given
    stage of its ring (rows gathered by its row_index, cut at its rows_end)."""
    ring: RingRef = lw.value(op.ring)
    dst = SharedRef(_stage_address(lw, ring, stage), ring.type.buffer)
    copy_global_to_shared(lw, lw.value(op.source), global_coords(lw, op), dst,
                          lw.value(op.row_index) if op.row_index is not None else None)


@handles(a.CopyAsyncOp)
def lower_copy_async(lw: KernelLowering, op: a.CopyAsyncOp) -> None:
    copy_into_stage(lw, op, lw.value(op.stage))


@handles(a.CommitGroupOp)
def lower_commit(lw: KernelLowering, op: a.CommitGroupOp) -> None:
    lw.emit(ptx.CpAsyncCommitOp())


@handles(a.WaitGroupOp)
def lower_wait(lw: KernelLowering, op: a.WaitGroupOp) -> None:
    lw.emit(ptx.CpAsyncWaitOp(op.pending.value.data))


@handles(a.RingReadOp)
def lower_ring_read(lw: KernelLowering, op: a.RingReadOp) -> list[Any]:
    ring: RingRef = lw.value(op.ring)
    return [SharedRef(_stage_address(lw, ring, lw.value(op.stage)), ring.type.buffer)]
