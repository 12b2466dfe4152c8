"""Lowering of TMA loads and stage barriers (sm_90a): mbarriers in shared memory, `cp.async.bulk.tensor`.

Stage s's full barrier is at `bars + 8s` (count 1: the producer's `arrive.expect_tx`; 1 + the computing threads
where stage_copy's cp.async chunks join the ring, each thread arriving once its chunks land), its empty barrier at
`bars + 8(S + s)` (count: every thread of the block, each releasing once). Step k uses stage k mod S and waits
for the phase of parity (k div S) & 1 on its full barrier; the producer acquiring step k waits for the empty
barrier's previous phase, parity ((k div S) & 1) ^ 1, which a fresh barrier reports complete. The producer is
thread 0 (its warp spins on the empty barrier), or the first thread of the producer warpgroup in a
warp-specialized kernel. TMA stores (insert-tma-stores) go through a staging tile per warp. A tile's TMA boxes are its column panels (one per swizzle width,
`backend/shared_layout.py`), each from a tensor map passed as a kernel parameter named
`{tensor}_tmap_{rows}x{cols}_sw{swizzle}` (read back by `tma_ops.tensor_map_param`), which the launcher and the simulator build from the tensor.

A ring shared by a cluster of C blocks (`!tile.stage_barriers<S, A, C>`, multicast loads): each block's producer
copies rows [r·R/C, (r+1)·R/C) of a multicast tile (r its rank in the cluster) into the stage of every block
(`.multicast::cluster`; a load shared by a group of the cluster, [size, stride]: rows [i·R/size, (i+1)·R/size)
for the block's place i in its group, into the group's blocks), so a stage is free only when every block has
released it (a group's stage included: the ring's protocol is the cluster's): a warp releases a stage once
all its lanes are done (`bar.warp.sync`), lane r arriving on block r's empty barrier (`mapa` + a remote
`mbarrier.arrive`, of the default .release.cta semantics: `.release.cluster` cost a MEMBAR.ALL.GPU per arrival,
and the stage's readers, wgmmas waited for, need no ordering of their own), whose count is the consumer warps
times C. Cluster barriers follow the barriers' init (no
block may signal a barrier its peer has not initialized) and precede the exit (none may signal a peer that has
exited).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xdsl.ir import Operation, SSAValue

from tkc.backend import ptx
from tkc.backend.index import Leaf
from tkc.backend.addressing import global_coords, mul_imm, offset_of, shared_base
from tkc.errors import TkcError
from tkc.ir import ops as t
from tkc.ir import tma_ops as m
from tkc.ir.types import element_bytes
from tkc.backend.lower_scalars import cluster_rank
from tkc.backend.lowering import Imm, KernelLowering, handles

class BarriersRef:
    def __init__(self, addr: SSAValue, type_: m.StageBarriersType):
        self.addr = addr
        self.type = type_


def _thread0(lw: KernelLowering) -> SSAValue:
    return lw.at_entry("tid==0", lambda: lw.op("setp.eq.u32", "pred", lw.thread_env["tid"], Imm(0), n=1))


def _producer_thread(lw: KernelLowering) -> SSAValue:
    """The thread that issues TMA loads: the first of the producer warpgroup (or of the block)."""
    tid = 32 * lw.producer_warp
    return lw.at_entry(f"tid=={tid}", lambda: lw.op("setp.eq.u32", "pred", lw.thread_env["tid"], Imm(tid), n=1))


def _producer_warp(lw: KernelLowering) -> SSAValue:
    warp = lw.producer_warp
    return lw.at_entry(f"warp=={warp}", lambda: lw.op("setp.eq.u32", "pred", lw.thread_env["warp"], Imm(warp), n=1))


def _guard(lw: KernelLowering, pred: SSAValue) -> SSAValue:
    return pred if lw.guard is None else lw.op("and.pred", "pred", lw.guard, pred, n=1)  # type: ignore[return-value]


def _barrier(lw: KernelLowering, bars: BarriersRef, step: Any, empty: bool) -> tuple[SSAValue, int, Any]:
    """(address register, offset, parity of the phase step k waits for) of step k's full or empty barrier."""
    stages = bars.type.stages.data
    base = 8 * stages if empty else 0
    if isinstance(step, Imm):
        k = int(step.value)
        return bars.addr, base + 8 * (k % stages), Imm((k // stages) & 1)
    env = {"k": step}
    addr = lw.op("add.s32", "b32", bars.addr, lw.expr((Leaf("k") % stages) * 8, env), n=1)
    return addr, base, lw.expr((Leaf("k") // stages) & 1, env)  # type: ignore[return-value]


def _spin(lw: KernelLowering, addr: SSAValue, offset: int, parity: Any) -> None:
    head = lw.label("WAIT")
    lw.emit(ptx.LabelOp(head))
    done = lw.emit(ptx.MbarrierOp("try_wait", addr, offset=offset, parity=lw.reg(parity))).results[0]
    lw.emit(ptx.BraOp(head, done, negate=True))


@handles(m.StageBarriersOp)
def lower_stage_barriers(lw: KernelLowering, op: m.StageBarriersOp) -> list[Any]:
    type_ = op.result.type
    stages, arrivals, cluster = type_.stages.data, type_.arrivals.data, type_.cluster.data
    if arrivals != 32 * lw.consumer_warps:
        raise TkcError(f"internal: stage barriers for {arrivals} releasing threads, but {32 * lw.consumer_warps} "
                       "threads compute")
    if cluster > 1 and cluster != lw.cluster:
        raise TkcError(f"internal: stage barriers for a cluster of {cluster} blocks in a kernel of clusters of "
                       f"{lw.cluster}")
    releases = arrivals if cluster == 1 else arrivals // 32 * cluster  # a cluster's: a warp of each block
    base = shared_base(lw, offset_of(op))
    first = _thread0(lw)
    # a full barrier's arrivals: the producer's arrive.expect_tx, and where stage_copy's cp.async chunks join the
    # ring, every computing thread's arrival once its chunks have landed
    fills = 1 + (arrivals if m.copies_into(op.result) else 0)
    for s in range(stages):
        lw.emit(ptx.MbarrierOp("init", base, offset=8 * s, count=fills, guard=first))
        lw.emit(ptx.MbarrierOp("init", base, offset=8 * (stages + s), count=releases, guard=first))
    lw.emit(ptx.FenceOp("mbarrier_init.release.cluster"))  # the inits, visible to the other threads and to TMA
    if cluster > 1:  # ... and to the other blocks of the cluster, which signal them (the fence released them)
        lw.emit(ptx.ClusterBarrierOp("arrive_relaxed"))
        lw.emit(ptx.ClusterBarrierOp("wait"))
    else:
        lw.emit(ptx.BarSyncOp(0))
    return [BarriersRef(base, type_)]


@handles(m.StageAcquireOp)
def lower_stage_acquire(lw: KernelLowering, op: m.StageAcquireOp) -> None:
    addr, offset, parity = _barrier(lw, lw.value(op.bars), lw.value(op.step), empty=True)
    flipped = Imm(int(parity.value) ^ 1) if isinstance(parity, Imm) else lw.op("xor.b32", "b32", parity, Imm(1), n=1)
    if m.copies_into(op.bars):  # every thread copies into the stage (stage_copy): every thread waits for it
        _spin(lw, addr, offset, flipped)
        return
    skip = lw.label("ACQUIRED")
    lw.emit(ptx.BraOp(skip, _producer_warp(lw), negate=True))  # only the producer's warp waits (warp-uniform)
    _spin(lw, addr, offset, flipped)
    lw.emit(ptx.LabelOp(skip))


@handles(m.StageExpectOp)
def lower_stage_expect(lw: KernelLowering, op: m.StageExpectOp) -> None:
    addr, offset, _ = _barrier(lw, lw.value(op.bars), lw.value(op.step), empty=False)
    lw.emit(ptx.MbarrierOp("arrive_expect_tx", addr, offset=offset, count=op.nbytes.value.data,
                           guard=_guard(lw, _producer_thread(lw))))


@handles(m.TmaLoadOp)
def lower_tma_load(lw: KernelLowering, op: m.TmaLoadOp) -> None:
    tile = op.tile
    swizzle = tile.swizzle
    rows, cols, e = tile.rows.data, tile.cols.data, element_bytes(tile.element_type)
    if not swizzle or (cols * e) % swizzle:
        raise TkcError(f"internal: a TMA load into {tile} needs rows of whole swizzle panels")
    panel_cols, panels = swizzle // e, cols * e // swizzle
    name = op.source.name_hint if isinstance(op.source, SSAValue) else None
    if not name or op.source not in lw.fn.body.block.args:
        raise TkcError("internal: a TMA load reads a kernel argument")
    rank = op.source.type.rank  # type: ignore[attr-defined]
    multicast = t.MULTICAST in op.attributes
    cluster = op.bars.type.cluster.data  # type: ignore[attr-defined]
    size, stride = t.multicast_group(op, cluster) if multicast else (1, 1)
    share = rows // size  # the rows it copies
    tmap = _tensor_map(lw, f"{name}_tmap{'n' if rank > 2 else ''}_{share}x{panel_cols}_sw{swizzle}")
    ring = lw.value(op.ring)
    addr, offset, _ = _barrier(lw, lw.value(op.bars), lw.value(op.step), empty=False)
    step = lw.value(op.step)
    stage_bytes = tile.nbytes
    if isinstance(step, Imm):
        dst, dst_offset = ring.addr, stage_bytes * (int(step.value) % ring.type.stages.data)
    else:
        dst = lw.op("mad.lo.s32", "b32", lw.expr(Leaf("k") % ring.type.stages.data, {"k": step}), Imm(stage_bytes),
                    ring.addr, n=1)
        dst_offset = 0
    coords, where = _box_coordinates(lw, global_coords(lw, op), rows, cols, panel_cols, panels)
    guard = _guard(lw, _producer_thread(lw))
    mask = None
    if multicast:  # this block's 1/size of the rows (boxes of R/size rows), into the same place in its group's blocks
        mine, mask = _multicast_place(lw, size, stride)
        lw.op("mad.lo.s32", None, mine, Imm(share), (coords, np.array([panels])), into=coords, dest=[panels], n=1)
        dst = lw.op("mad.lo.s32", "b32", mine, Imm(share * swizzle), lw.reg(dst), n=1)
    for p in range(panels):
        lw.emit(ptx.TmaLoadOp(dst, 0, dst_offset + p * rows * swizzle, tmap, coords, [p, *where], addr, 0, offset,
                              guard=guard, mask=mask))


def _multicast_place(lw: KernelLowering, size: int, stride: int) -> tuple[Any, Any]:
    """This block's place in the group of `size` blocks `stride` apart that shares a multicast load (the whole
    cluster: its rank), and the group's mask of blocks (b16), both computed once at the kernel's entry. Rank r's
    group: ranks r0 + i·stride, i < size, with i = (r // stride) % size and r0 = r - i·stride."""
    if size == lw.cluster:
        return cluster_rank(lw), lw.at_entry("cluster_mask", lambda: lw.op("mov.b16", "b16", Imm((1 << size) - 1), n=1))

    def place() -> Any:
        return lw.expr(Leaf("r") // stride % size, {"r": cluster_rank(lw)})

    def mask() -> Any:
        first = lw.expr(Leaf("r") - Leaf("r") // stride % size * stride, {"r": cluster_rank(lw)})
        pattern = lw.op("mov.b16", "b16", Imm(sum(1 << (i * stride) for i in range(size))), n=1)
        return lw.op("shl.b16", "b16", pattern, first, n=1)

    return lw.at_entry(f"multicast_place:{size}:{stride}", place), lw.at_entry(f"multicast_mask:{size}:{stride}", mask)


def _box_coordinates(lw: KernelLowering, indices: Any, rows: int, cols: int, panel_cols: int,
                     panels: int) -> tuple[SSAValue, list[int]]:
    """The TMA coordinates of a tile's boxes, innermost first: panel p at column col·cols + p·panel_cols (registers
    0..panels-1), all at row row·rows, then the leading indices (innermost first); and the registers after the
    panel's own that every box uses."""
    *leading, row_index, col_index = indices
    coords = lw.emit(ptx.RegsOp("b32", panels + 1 + len(leading))).results[0]
    lw.op("add.s32", None, lw.reg(mul_imm(lw, col_index, cols)), ptx.PerInstr([p * panel_cols for p in range(panels)]),
          into=coords, dest=list(range(panels)), n=panels)
    lw.op("mov.b32", None, mul_imm(lw, row_index, rows), into=coords, dest=[panels], n=1)
    for n, index in enumerate(reversed(leading)):
        lw.op("mov.b32", None, index, into=coords, dest=[panels + 1 + n], n=1)
    return coords, list(range(panels, panels + 1 + len(leading)))


def _tensor_map(lw: KernelLowering, param: str) -> SSAValue:
    if param not in lw.tensor_maps:
        lw.tensor_maps.append(param)
    return lw.at_entry(f"param:{param}", lambda: lw.emit(ptx.ParamAddrOp(param)).results[0])


@handles(m.StageCopyOp)
def lower_stage_copy(lw: KernelLowering, op: m.StageCopyOp) -> None:
    """Every thread's cp.async chunks of the tile into step k's stage, then its arrival on step k's full barrier
    once they have landed (.noinc: the barrier's count includes every thread's arrival)."""
    from tkc.backend.lower_copies import copy_into_stage

    step = lw.value(op.step)
    stages = op.ring.type.stages.data  # type: ignore[attr-defined]
    copy_into_stage(lw, op, Imm(int(step.value) % stages) if isinstance(step, Imm)
                    else lw.expr(Leaf("k") % stages, {"k": step}))
    addr, offset, _ = _barrier(lw, lw.value(op.bars), step, empty=False)
    lw.emit(ptx.MbarrierOp("cp_async_arrive", addr, offset=offset, guard=lw.guard))


@handles(m.StageWaitOp)
def lower_stage_wait(lw: KernelLowering, op: m.StageWaitOp) -> None:
    addr, offset, parity = _barrier(lw, lw.value(op.bars), lw.value(op.step), empty=False)
    _spin(lw, addr, offset, parity)
    if m.copies_into(op.bars):
        # cp.async wrote the stage through the generic proxy; wgmma reads it through the async proxy: the wait made
        # the bytes visible to this thread, the proxy fence orders them before its wgmmas
        lw.emit(ptx.FenceOp("proxy.async.shared::cta"))


@handles(m.StageReleaseOp)
def lower_stage_release(lw: KernelLowering, op: m.StageReleaseOp) -> None:
    addr, offset, _ = _barrier(lw, lw.value(op.bars), lw.value(op.step), empty=True)
    if op.bars.type.cluster.data > 1:  # type: ignore[attr-defined]
        # the stage's multicast slices came from every block's producer: a warp done with it tells each block
        lw.emit(ptx.WarpSyncOp())
        lane = lw.thread_env["lane"]
        signals = lw.at_entry("lane<cluster", lambda: lw.op("setp.lt.u32", "pred", lane, Imm(lw.cluster), n=1))
        rank = lw.expr(Leaf("lane") % lw.cluster)  # (lanes past the cluster's size map a valid rank, unused)
        remote = lw.op("mapa.shared::cluster.u32", "b32", lw.op("add.s32", "b32", addr, Imm(offset), n=1), rank, n=1)
        lw.emit(ptx.MbarrierOp("arrive_cluster", remote, guard=_guard(lw, signals)))
        return
    if op.bars in _read_by_generic_loads(lw.fn):
        # the stage was read by ldmatrix (the generic proxy) and the next TMA load into it writes through the async
        # proxy: the mbarrier alone did not order them on the H200 (a stage released right after its ldmatrix was
        # refilled under it); the proxy fence is the PTX memory model's ordering between the two
        lw.emit(ptx.FenceOp("proxy.async.shared::cta"))
    lw.emit(ptx.MbarrierOp("arrive", addr, offset=offset, guard=lw.guard))


def _read_by_generic_loads(fn: Operation) -> set[SSAValue]:
    """The stage barriers of the rings whose stages some `tile.load` reads into registers (through views too)."""
    from tkc.ir import async_ops as a
    from tkc.ir.types import RegTileType
    from tkc.passes.insert_tma_pipeline import stage_uses

    bars_of = {op.ring: op.bars for op in fn.walk() if isinstance(op, m.TmaLoadOp)}
    return {bars_of[op.ring] for op in fn.walk() if isinstance(op, a.RingReadOp) and op.ring in bars_of
            and any(isinstance(user, t.LoadOp) and isinstance(user.result.type, RegTileType)
                    for user in stage_uses([op.result]))}


def _skip_boxes_before_row0(lw: KernelLowering, guard: SSAValue, first_row: Any, rows: int) -> SSAValue:
    """`guard` and "the box has a row at or after row 0": a box wholly before row 0 stores nothing, and a TMA
    store of one stops the H200 with an illegal instruction (causal attention's warps whose 16 query rows lie
    before row 0, where Nq is not a multiple of its query blocks)."""
    if isinstance(first_row, Imm) and int(first_row.value) > -rows:
        return guard
    some_row = lw.op("setp.gt.s32", "pred", lw.reg(first_row), Imm(-rows), n=1)
    return lw.op("and.pred", "pred", guard, some_row, n=1)  # type: ignore[return-value]


def lower_tma_store(lw: KernelLowering, op: Any, reduce: str | None = None) -> None:
    """A warp's register tile to global memory through its staging tile and TMA (insert-tma-stores); with `reduce`
    (add) added to what is there."""
    from tkc.backend.lower_memory import _register_type, _shared_run_access, _store_runs
    from tkc.backend.lower_compute import pack, unpack
    from tkc.passes import allocate_shared
    from tkc.passes.insert_tma_stores import staging_tile
    from tkc.backend.lowering import SharedRef

    value_type = op.value.type
    tile = staging_tile(value_type)
    rows, cols, e, swizzle = tile.rows.data, tile.cols.data, element_bytes(tile.element_type), tile.swizzle
    panel_cols, panels = swizzle // e, cols * e // swizzle
    name = op.dest.name_hint if isinstance(op.dest, SSAValue) else None
    if not name or op.dest not in lw.fn.body.block.args:
        raise TkcError("internal: a TMA store writes a kernel argument")
    stride = allocate_shared.staging_stride(op)  # the kernel's staging buffer: a tile a warp at this stride
    staging = lw.op("add.s32", "b32", shared_base(lw, offset_of(op)), lw.expr(Leaf("warp") * stride), n=1)
    lw.emit(ptx.BulkGroupOp("wait_read", 0))  # this warp's previous TMA store has read the staging tile
    lw.emit(ptx.WarpSyncOp())
    value = lw.reg(lw.value(op.value))
    mem_type = _register_type(value_type, tile.element_type)
    if mem_type != value_type:
        value = pack(lw, unpack(lw, value, value_type), mem_type)
    runs, bundle, base_of, offset, guard = _shared_run_access(lw, SharedRef(staging, tile), mem_type, [Imm(0), Imm(0)])
    _store_runs(lw, "shared", mem_type, value, runs, bundle, base_of, offset, guard, np.arange(len(runs)))
    lw.emit(ptx.FenceOp("proxy.async.shared::cta"))  # the lanes' writes, visible to TMA
    lw.emit(ptx.WarpSyncOp())
    stacked = "n" if op.dest.type.rank > 2 else ""  # boxes one matrix deep: they stop at its last row
    tmap = _tensor_map(lw, f"{name}_tmap{stacked}_{rows}x{panel_cols}_sw{swizzle}")
    indices = global_coords(lw, op)
    coords, where = _box_coordinates(lw, indices, rows, cols, panel_cols, panels)
    lane0 = lw.at_entry("lane==0", lambda: lw.op("setp.eq.u32", "pred", lw.thread_env["lane"], Imm(0), n=1))
    guard = _guard(lw, lane0)
    guard = _skip_boxes_before_row0(lw, guard, mul_imm(lw, indices[-2], rows), rows)
    for p in range(panels):
        lw.emit(ptx.TmaStoreOp(staging, 0, p * rows * swizzle, tmap, coords, [p, *where], guard=guard, reduce=reduce))
    lw.emit(ptx.BulkGroupOp("commit"))
    lw.tma_stores = True
