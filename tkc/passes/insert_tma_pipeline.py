"""insert-tma-pipeline{stages=N}: on sm_90a, turn a loop's global→shared tile loads into an N-stage TMA ring.

A loop qualifies when every global→shared load in its body reads a tensor whose address, strides and row
length are 16-byte aligned (of rank > 2: a stack of matrices, a box stopping at its matrix's end) (the kernel's alignment specialization says so at compile time), into a tile of at
most 256 rows whose rows are whole 32/64/128-byte swizzle panels, with indices that depend only on the loop
index, values from outside the loop and tile.reads of tensors the kernel never writes (a page table: read again
for the step a refill loads). Each load gets a ring of N stages; one set of stage barriers
(`tkc/ir/tma_ops.py`) serves them all. Before the loop, steps 0..N-2 are filled (each only if it runs). Step k
waits for its bytes, reads stage k mod N, releases the stage after its last use, and refills for step k+N-1. A
loop whose wgmma may run on into the next step (a loop-carried accumulator, A in shared memory: GEMM's K loop)
releases step k-1 after step k's wgmma instead (marked `tkc.wgmma_in_flight`: the lowering waits for the
previous step's wgmma only there), so the refill never overwrites what a running wgmma reads. A tile loop (one
around another pipelined loop: a persistent kernel's, attention's over query blocks) gets one stage, released
after the tile's last read (queries moved into registers at the tile's start: released then and refilled for the
next tile while the inner loop runs), or two where the tile reads it to its end and shared memory has room (the
next tile's load then runs during this one). With `split_ring=1` each load of a loop gets barriers of its own,
waited for right before the step first reads it and released after its own readers (attention's K once Q·Kᵀ is
done, its V a step late after the deferred P·V), so that one load's late release does not hold the other's refill;
one read by a wgmma that runs on into the next step is released in that step as soon as an earlier wgmma's result
is used (the dQ kernel's K once the next S = Q·Kᵀ is in; without defer; one ring keeps its release behind the
step's own last read). With `mixed_ring=1` a loop whose other loads TMA cannot make (rows gathered by rows_at or
cut at an end) keeps its TMA loads on the ring: those others become `tile.stage_copy`, every thread's cp.async
chunks counted on the step's full barrier (its bytes not announced; every thread acquires the stage). Loops that
do not qualify are left to `insert-async-pipeline`.

    scf.for %j = %lb to %ub step %c1 {
      %a = tile.load %A[%i, %j] : !tile.gl<?x?xbf16> -> !tile.st<128x64xbf16>
      %acc2 = tile.wgmma_AB %av, %b, %acc ...
becomes
    %ring = tile.ring_alloc : !tile.ring<4, !tile.st<128x64xbf16>>
    %bars = tile.stage_barriers : !tile.stage_barriers<4, 256>
    scf.if (0 < trips) { tile.stage_expect %bars[0], 16384   tile.tma_load %A[%i, %lb], %ring, %bars[0] }
    ... steps 1 and 2 ...
    scf.for %j = %lb to %ub step %c1 {
      tile.stage_wait %bars[%k]
      %a = tile.ring_read %ring[%k mod 4]
      %acc2 = tile.wgmma_AB %av, %b, %acc ...
      scf.if (%k > 0) { tile.stage_release %bars[%k - 1] }
      scf.if (%k + 3 < trips) { tile.stage_acquire %bars[%k + 3]   tile.stage_expect ...   tile.tma_load ... }
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, UnitAttr, i32
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint

from tkc.backend.shared_layout import swizzle_for
from tkc.errors import SourceLoc, TkcError
from tkc.ir import async_ops as a
from tkc.ir import ops as t
from tkc.ir import tma_ops as m
from tkc.ir.types import GlobalType, RegTileType, SharedTileType, element_bytes
from tkc.passes import register
from tkc.passes.insert_async_pipeline import WGMMA_IN_FLIGHT, _constant, _index_slice, kernel_stages
from tkc.passes.util import (carries_only_the_accumulator, constant_int, waited_by_the_next_step, with_one_more_carried,
                             yielded_at)
from tkc.targets import SM_90A

MAX_BOX_ROWS = 256  # a TMA box dimension
SPLIT_RING = "tkc.split_ring"  # on a kernel with split_ring=1: each load of a pipelined loop its own barriers
MIXED_RING = "tkc.mixed_ring"  # on a kernel with mixed_ring=1: loads TMA cannot make join the ring as cp.async copies
EARLY_RELEASE = "tkc.early_release"  # on such a load's release that does not lag a step


def _aligned_args(fn: func.FuncOp) -> set[SSAValue]:
    """The kernel's tensor arguments specialized to 16-byte aligned addresses, pitches and rows (all of them
    without a specialization, as the lowering assumes: `lowering.DEFAULT_ALIGN`)."""
    from tkc.backend.lowering import argument_aligns

    return {arg for arg, align in zip(fn.body.block.args, argument_aligns(fn)) if align % 16 == 0}


def tma_loadable(op: Operation, aligned: set[SSAValue]) -> bool:
    """Whether TMA can fill this load's tile: a 2-D 16-byte aligned tensor, a tile of whole swizzle panels, one box
    of it (not rows gathered by rows_at: sm_90a's TMA does not gather rows; nor cut short by an end)."""
    if not (isinstance(op, t.LoadOp) and isinstance(op.source.type, GlobalType)
            and isinstance(op.result.type, SharedTileType) and op.row_index is None and op.rows_end is None):
        return False
    tile = op.result.type
    row_bytes = tile.cols.data * element_bytes(tile.element_type)
    return (op.source.type.rank >= 2 and op.source in aligned and tile.rows.data <= MAX_BOX_ROWS
            and swizzle_for(row_bytes) >= 32)


def stage_copyable(op: Operation, loop: scf.ForOp) -> bool:
    """Whether a load TMA cannot make may still join the loop's TMA ring as cp.async copies counted on its barriers
    (tile.stage_copy): in a kernel with mixed_ring=1, a 2-D tile whose rows are gathered by row numbers or cut at an
    end (an unaligned tensor's loads keep a loop on cp.async alone) of a kernel without a producer
    warpgroup, ping-pong warpgroups, split rings or clusters (every computing thread copies and arrives), not in a
    tile loop around another pipelined loop."""
    fn = _kernel_of(loop)
    return (isinstance(op, t.LoadOp) and isinstance(op.source.type, GlobalType) and op.source.type.rank == 2
            and (op.row_index is not None or op.rows_end is not None)
            and isinstance(op.result.type, SharedTileType) and t.MULTICAST not in op.attributes
            and fn is not None and MIXED_RING in fn.attributes
            and not any(name in fn.attributes for name in ("tkc.producer", "tkc.pingpong", SPLIT_RING))
            and t.cluster_size(fn) == 1 and not _tile_loop(loop))


@dataclass
class _Load:
    op: t.LoadOp
    slice: list[Operation]
    ring: SSAValue | None = None
    copied: bool = False  # cp.async copies counted on the ring's barriers (tile.stage_copy), not TMA


def _shared_loads(body: Block) -> list[t.LoadOp]:
    return [op for op in body.ops if isinstance(op, t.LoadOp) and isinstance(op.source.type, GlobalType)
            and isinstance(op.result.type, SharedTileType)]


def _top_level(op: Operation, body: Block) -> Operation:
    while op.parent_block() is not body:
        parent = op.parent_op()
        assert parent is not None
        op = parent
    return op


def step_index(loop: scf.ForOp) -> SSAValue | None:
    """The loop's step index k = (iv - lb) / step, as the pipeline computes it at the top of the body."""
    iv = loop.body.block.args[0]
    for op in loop.body.block.ops:
        if isinstance(op, arith.DivUIOp) and isinstance(op.lhs.owner, arith.SubiOp) and op.lhs.owner.lhs is iv:
            return op.result
    return None


def step_start(loop: scf.ForOp) -> SSAValue:
    """Where the loop's step index counts from: `start` in k = (iv - start) / step (the loop's lower bound, or the one
    before peel-deferred-step moved it a step on)."""
    k = step_index(loop)
    assert k is not None
    return k.owner.lhs.owner.rhs  # type: ignore[union-attr]


def stage_uses(values: list[SSAValue]) -> set[Operation]:
    """The ops that use any of the values (stages), directly or through row views of them."""
    pending, seen, users = list(values), set(), set()
    while pending:
        value = pending.pop()
        if value in seen:
            continue
        seen.add(value)
        for use in value.uses:
            users.add(use.operation)
            if isinstance(use.operation, t.LoadOp) and isinstance(use.operation.result.type, SharedTileType):
                pending.append(use.operation.result)  # a view: its readers read the stage too
    return users


def stage_readers(body: Block, values: list[SSAValue]) -> set[Operation]:
    """The ops of the body (at its top level) that read any of the values, directly or through row views."""
    users = {_top_level(user, body) for user in stage_uses(values)}
    return {u for u in users if not isinstance(u, scf.YieldOp)}


def _last_use(body: Block, values: list[SSAValue]) -> Operation | None:
    """The last op of the body that reads any of the values."""
    order = {op: n for n, op in enumerate(body.ops)}
    return max(stage_readers(body, values), key=order.__getitem__, default=None)


def _fill(b: Builder, loads: list[_Load], iv: SSAValue, j: SSAValue, bars: SSAValue, k: SSAValue,
          acquire: bool, cluster: int) -> None:
    """(Acquire,) announce and start step k's loads, their indices computed for loop index `j`."""
    if acquire:
        b.insert(m.StageAcquireOp(bars, k))
    b.insert(m.StageExpectOp(bars, k, sum(p.op.result.type.nbytes for p in loads if not p.copied)))
    for p in loads:
        mapping: dict[SSAValue, SSAValue] = {iv: j}
        for op in p.slice:
            clone = op.clone(value_mapper=mapping)
            b.insert(clone)
            for old, new in zip(op.results, clone.results):
                mapping[old] = new
        indices = [mapping.get(i, i) for i in p.op.indices]
        if p.copied:
            copied = t.keep_index_units(p.op, m.StageCopyOp(
                p.op.source, indices, p.ring, bars, k,  # type: ignore[arg-type]
                *(mapping.get(v, v) if v is not None else None for v in (p.op.row_index, p.op.rows_end))))
            copied.location = p.op.location
            b.insert(copied)
            continue
        copy = t.keep_index_units(p.op, m.TmaLoadOp(p.op.source, indices, p.ring, bars, k))  # type: ignore[arg-type]
        copy.location = p.op.location
        if cluster > 1 and t.MULTICAST in p.op.attributes:
            copy.attributes[t.MULTICAST] = p.op.attributes[t.MULTICAST]  # (the whole cluster, or its group)
        b.insert(copy)


def _guarded(b: Builder, cond: SSAValue, build: Callable[[Builder], None]) -> None:
    then = Block()
    build(Builder(InsertPoint.at_end(then)))
    Builder(InsertPoint.at_end(then)).insert(scf.YieldOp())
    b.insert(scf.IfOp(cond, [], Region(then), Region(Block([scf.YieldOp()]))))


def _may_accumulate_in_flight(op: Operation, loop: scf.ForOp) -> bool:
    """Could the lowering leave this wgmma running into the next step: a loop-carried accumulator with A in shared
    memory (GEMM's K loop), or a wgmma waited for by the next step's first one (attention's P·V, so that it and
    the next Q·Kᵀ queue up back to back)? Only then must a step release its stage one step late."""
    return isinstance(op, t.WgmmaOp) and (
        (not isinstance(op.a.type, RegTileType) and carries_only_the_accumulator(op, loop))
        or waited_by_the_next_step(op, loop))


def _kernel_of(op: Operation) -> func.FuncOp | None:
    fn = op.parent_op()
    while fn is not None and not isinstance(fn, func.FuncOp):
        fn = fn.parent_op()
    return fn


def _deferred_kernel(loop: scf.ForOp) -> bool:
    """A loop with two wgmmas (S, P·V) in a kernel with defer=1: defer-wgmma will leave its last one running into
    the next step (also behind overlap=1's early Q·Kᵀ, where waited_by_the_next_step sees none)."""
    fn = _kernel_of(loop)
    return (fn is not None and "tkc.defer" in fn.attributes
            and sum(isinstance(op, t.WgmmaOp) for op in loop.body.block.ops) >= 2)


def _release_lags(loop: scf.ForOp) -> bool:
    """Whether step k releases its stage one iteration late: when the lowering may leave its wgmma running."""
    return WGMMA_IN_FLIGHT in loop.attributes


def _enclosing_loops(loop: scf.ForOp) -> list[scf.ForOp] | None:
    """The loops around `loop`, innermost first, or None if something else (an if) encloses it."""
    chain: list[scf.ForOp] = []
    parent = loop.parent_op()
    while not isinstance(parent, func.FuncOp):
        if not isinstance(parent, scf.ForOp):
            return None
        chain.append(parent)
        parent = parent.parent_op()
    return chain


def _with_base(outer: scf.ForOp, init: SSAValue) -> tuple[scf.ForOp, SSAValue]:
    """`outer` rebuilt with one more loop-carried value (initially `init`, passed through unchanged until the
    caller sets what the body yields); the new op and its block argument."""
    body = outer.body.block
    arg = body.insert_arg(i32, len(body.args))
    yield_op = body.last_op
    assert isinstance(yield_op, scf.YieldOp)
    yield_op.operands = [*yield_op.operands, arg]
    return with_one_more_carried(outer, init), arg  # type: ignore[return-value]


def _thread_base(chain: list[scf.ForOp]) -> tuple[SSAValue | None, list[scf.ForOp]]:
    """The ring's steps are counted across the loops around the pipelined one (a persistent kernel's tile loop):
    each of them carries the count of steps before it. (The count at the pipelined loop, the rebuilt loops.)"""
    if not chain:
        return None, []
    init = _constant(Builder(InsertPoint.before(chain[-1])), 0)
    rebuilt = []
    for outer in reversed(chain):
        outer, init = _with_base(outer, init)
        rebuilt.append(outer)
    return init, rebuilt[::-1]


def _inner_loops(loop: scf.ForOp) -> list[tuple[Operation, scf.ForOp]]:
    """(top-level op of the body, loop in it) for each loop in the body that loads tiles."""
    return [(inner, op) for inner in loop.body.block.ops for op in inner.walk()
            if isinstance(op, scf.ForOp) and _shared_loads(op.body.block)]


def _tile_loop(loop: scf.ForOp) -> bool:
    """Whether the loop is a tile loop: one around an inner loop that loads tiles (attention's loop over query blocks
    around its key loop)."""
    return bool(_inner_loops(loop))


TILE_RING_SPARE = 8 * 1024  # shared memory left for barriers and alignment


def _other_shared_bytes(fn: Operation, threads: int) -> int:
    """What else the kernel will hold in shared memory: its own shared tiles (`empty`; two buffers where it asks)
    and, where insert-tma-stores (later) will send stores or atomic adds by TMA, the staging buffer: a tile a warp,
    the largest of them."""
    from tkc.passes.insert_tma_stores import goes_by_tma, staging_tile

    tiles = sum(op.buffers * op.result.type.nbytes for op in fn.walk()
                if isinstance(op, t.EmptyOp) and isinstance(op.result.type, SharedTileType))
    staged = [staging_tile(op.value.type).nbytes for op in fn.walk() if goes_by_tma(op, fn)]  # type: ignore[arg-type]
    return tiles + threads // 32 * max(staged, default=0)


def _tile_ring_stages(loop: scf.ForOp, loads: list[t.LoadOp], depth: int, threads: int) -> int:
    """A tile loop's stages. Its stage is released after the tile's last read of it: where that is before the inner
    loop (queries moved into registers), one stage is refilled for the next tile while the inner loop runs. Where
    the tile reads it to its end (queries read from shared memory by every Q·Kᵀ), a second stage lets the next
    tile's load run during this one (else it starts at the tile's end, its latency in every tile: 9% of attention
    at D=64, N=1024), if it fits beside the inner ring (not at D = 128 with 128-key steps: 64 + 192 KB) and the
    block has at most two warpgroups of its own (with three, the second stage's bookkeeping made ptxas spill
    8 bytes at D=64 causal)."""
    body = loop.body.block
    order = {op: n for n, op in enumerate(body.ops)}
    readers = stage_readers(body, [op.result for op in loads])
    inner = _inner_loops(loop)
    held = bool(readers) and max(order[r] for r in readers) >= min(order[top] for top, _ in inner)
    tile_bytes = sum(op.result.type.nbytes for op in loads)
    inner_bytes = sum(op.result.type.nbytes for _, l in inner for op in _shared_loads(l.body.block))
    fn = _kernel_of(loop)
    assert fn is not None
    need = 2 * tile_bytes + depth * inner_bytes + _other_shared_bytes(fn, threads)
    fits = need + TILE_RING_SPARE <= SM_90A.shared_bytes  # (the pass runs for sm_90a only)
    return 2 if held and fits and threads <= 256 else 1


def _multicast_cluster(loop: scf.ForOp, loads: list[t.LoadOp]) -> int:
    """The blocks that share the loop's ring: the kernel's cluster where some load is multicast (each block of the
    group sharing a load then copies 1/size of its rows, a whole number of 8-row swizzle patterns, into the stage of
    every block of the group), else 1."""
    fn = _kernel_of(loop)
    cluster = t.cluster_size(fn) if fn is not None else 1
    shared = [op for op in loads if t.MULTICAST in op.attributes]
    if cluster == 1 or not shared:
        return 1
    for op in shared:
        rows = op.result.type.rows.data
        size, stride = t.multicast_group(op, cluster)
        if cluster % (size * stride):
            raise TkcError(f"a multicast load shared by {size} blocks {stride} apart in a cluster of {cluster}: "
                           "size·stride must divide the cluster", SourceLoc.from_attr(op.location))
        if rows % (8 * size):
            raise TkcError(f"a multicast load of {op.result.type.spec()} shared by {size} blocks of a cluster: each "
                           f"block copies {rows}/{size} rows, which must be a multiple of 8",
                           SourceLoc.from_attr(op.location))
    return cluster


def pipeline_loop(loop: scf.ForOp, stages: int, aligned: set[SSAValue], threads: int) -> bool:
    body = loop.body.block
    candidates = _shared_loads(body)
    by_tma = [tma_loadable(op, aligned) for op in candidates]
    if stages < 2 or not any(by_tma) or not all(tma or stage_copyable(op, loop)
                                                for op, tma in zip(candidates, by_tma)):
        return False
    if _tile_loop(loop):
        stages = _tile_ring_stages(loop, candidates, stages, threads)
    chain = _enclosing_loops(loop)
    if chain is None:
        return False
    loads = []
    for op, tma in zip(candidates, by_tma):
        sl = _index_slice(op, loop)
        if sl is None:
            return False
        loads.append(_Load(op, sl, copied=not tma))
    step = loop.step  # a run-time step too: a persistent kernel's tile loop (the grid's size)

    # rings and barriers live for the whole kernel, before the loops around this one
    top = chain[-1] if chain else loop
    alloc = Builder(InsertPoint.before(top))
    for p in loads:
        ring = alloc.insert(a.RingAllocOp(a.RingType(stages, p.op.result.type)))
        ring.location = p.op.location
        p.ring = ring.result
    cluster = _multicast_cluster(loop, candidates)
    fn = _kernel_of(loop)
    split = (fn is not None and SPLIT_RING in fn.attributes and len(loads) > 1 and cluster == 1 and stages > 1
             and not _tile_loop(loop))
    bars_of = [alloc.insert(m.StageBarriersOp(m.StageBarriersType(stages, threads, cluster))).result
               for _ in (loads if split else [None])]
    bars = bars_of[0]
    base, rebuilt = _thread_base(chain)

    def step_at(b: Builder, k: SSAValue) -> SSAValue:
        """The ring's step for the loop's k-th iteration: k, after `base` steps of earlier loops."""
        return k if base is None else b.insert(arith.AddiOp(base, k)).result

    pre = Builder(InsertPoint.before(loop))
    trips = pre.insert(arith.CeilDivSIOp(pre.insert(arith.SubiOp(loop.ub, loop.lb)).result, step)).result
    if split:
        _pipeline_each_load(loop, loads, bars_of, stages, pre, trips, base, rebuilt, step_at)
        return True
    _fill_first_steps(pre, loop, [(loads, bars)], stages, trips, step_at, base, cluster)

    # step k: wait for its bytes, read its stage
    inb, k, g, stage = _step_of(loop, stages, step_at)
    wait = inb.insert(m.StageWaitOp(bars, g))
    reads = []
    for p in loads:
        read = a.RingReadOp(p.ring, stage)  # type: ignore[arg-type]
        read.location = p.op.location
        Builder(InsertPoint.before(p.op)).insert(read)
        p.op.result.replace_all_uses_with(read.result)
        p.op.detach()
        p.op.erase()
        reads.append(read.result)

    # release after the last read (a wgmma's: one step later, when the next step's wgmma has been issued and
    # the lowering waited for this one), then refill the released stage for step k + stages - 1
    last = _last_use(body, reads)
    lags = _mark_in_flight(loop)
    after = Builder(InsertPoint.after(last if last is not None else wait))
    ahead = max(stages - 1, 1)  # the step the refill fills, after this one
    if lags:  # (not sooner, as split_ring's: 1-9 % slower at D = 128, RESULTS "early releases in one ring")
        _release_previous(after, bars, k, g)
        refill = after
    else:
        after.insert(m.StageReleaseOp(bars, g))
        # step k - 1 released its stage: refill it before this step's work (one stage: the one just released)
        refill = after if stages == 1 else Builder(InsertPoint.after(wait))
    _refill(refill, loop, loads, bars, k, g, ahead, trips, base, cluster)
    _after_loop(loop, base, trips, rebuilt, [bars] if lags else [])
    return True


def _fill_first_steps(pre: Builder, loop: scf.ForOp, rings: list[tuple[list[_Load], SSAValue]], stages: int,
                      trips: SSAValue, step_at: Callable[[Builder, SSAValue], SSAValue], base: SSAValue | None,
                      cluster: int) -> None:
    """Before the loop: steps 0 .. stages - 2 of each ring (its loads and barriers), each if it runs (one stage: step
    0, and each step refills the next after its release)."""
    for s in range(max(stages - 1, 1)):
        c_s = _constant(pre, s)
        j = pre.insert(arith.AddiOp(loop.lb, _times(pre, loop.step, s))).result
        g = step_at(pre, c_s)
        runs = pre.insert(arith.CmpiOp(c_s, trips, "slt")).result
        for loads, bars in rings:
            _guarded(pre, runs, lambda b, j=j, g=g, loads=loads, bars=bars: _fill(
                b, loads, loop.body.block.args[0], j, bars, g, acquire=base is not None, cluster=cluster))


def _mark_in_flight(loop: scf.ForOp) -> bool:
    """Mark the loop `tkc.wgmma_in_flight` where a wgmma may run on into the next step (a lagging release)."""
    if any(_may_accumulate_in_flight(op, loop) for op in loop.body.block.ops) or _deferred_kernel(loop):
        loop.attributes[WGMMA_IN_FLIGHT] = UnitAttr()
    return _release_lags(loop)


def _release_previous(at: Builder, bars: SSAValue, k: SSAValue, g: SSAValue) -> None:
    """At `at`: release step k - 1's stage, if there was one (a release a step late)."""
    has_previous = at.insert(arith.CmpiOp(k, _constant(at, 0), "sgt")).result
    previous = at.insert(arith.SubiOp(g, _constant(at, 1))).result
    _guarded(at, has_previous, lambda b: b.insert(m.StageReleaseOp(bars, previous)))


def _step_of(loop: scf.ForOp, stages: int, step_at: Callable[[Builder, SSAValue], SSAValue]
             ) -> tuple[Builder, SSAValue, SSAValue, SSAValue]:
    """At the top of the body: the step index k, the ring's step g and its stage (a builder there, for the wait)."""
    first = loop.body.block.first_op
    assert first is not None
    inb = Builder(InsertPoint.before(first))
    k = inb.insert(arith.DivUIOp(inb.insert(arith.SubiOp(loop.body.block.args[0], loop.lb)).result, loop.step)).result
    g = step_at(inb, k)
    return inb, k, g, inb.insert(arith.RemUIOp(g, _constant(inb, stages))).result


def _refill(at: Builder, loop: scf.ForOp, loads: list[_Load], bars: SSAValue, k: SSAValue, g: SSAValue, ahead: int,
            trips: SSAValue, base: SSAValue | None, cluster: int) -> None:
    """At `at`: if step k + ahead runs, acquire its stage and start its loads."""
    iv = loop.body.block.args[0]
    k_next = at.insert(arith.AddiOp(k, _constant(at, ahead))).result
    g_next = k_next if base is None else at.insert(arith.AddiOp(g, _constant(at, ahead))).result
    j_next = at.insert(arith.AddiOp(iv, _times(at, loop.step, ahead))).result
    _guarded(at, at.insert(arith.CmpiOp(k_next, trips, "slt")).result,
             lambda b: _fill(b, loads, iv, j_next, bars, g_next, acquire=True, cluster=cluster))


def _after_loop(loop: scf.ForOp, base: SSAValue | None, trips: SSAValue, rebuilt: list[scf.ForOp],
                lagging: list[SSAValue]) -> None:
    """In loops around this one: after it, release the last step of each ring that releases a step late (its wgmma is
    waited for at the loop's end) and count the steps into the ring's base."""
    if base is None:
        return
    post = Builder(InsertPoint.after(loop))
    end = post.insert(arith.AddiOp(base, trips)).result
    if lagging:
        ran = post.insert(arith.CmpiOp(_constant(post, 0), trips, "slt")).result
        last_step = post.insert(arith.SubiOp(end, _constant(post, 1))).result
        for bars in lagging:
            _guarded(post, ran, lambda b, bars=bars: b.insert(m.StageReleaseOp(bars, last_step)))
    for inner, outer in zip([end, *[o.results[-1] for o in rebuilt[:-1]]], rebuilt):
        yield_op = outer.body.block.last_op
        yield_op.operands = [*yield_op.operands[:-1], inner]  # type: ignore[union-attr]


def _pipeline_each_load(loop: scf.ForOp, loads: list[_Load], bars_of: list[SSAValue], stages: int, pre: Builder,
                        trips: SSAValue, base: SSAValue | None, rebuilt: list[scf.ForOp],
                        step_at: Callable[[Builder, SSAValue], SSAValue]) -> None:
    """split_ring=1: each load its own stage barriers, its wait right before the step's first read of it, its
    release after its own last reader (a step late only where that is a wgmma that may run on: attention's P·V,
    deferred; K is released once Q·Kᵀ is waited for), its refill right after (a lagging load) or after its wait."""
    body = loop.body.block
    _fill_first_steps(pre, loop, [([p], bars) for p, bars in zip(loads, bars_of)], stages, trips, step_at, base, 1)
    _, k, g, stage = _step_of(loop, stages, step_at)
    in_flight = _mark_in_flight(loop)
    ahead = stages - 1
    lagging = []
    for p, bars in zip(loads, bars_of):
        order = {op: n for n, op in enumerate(body.ops)}
        readers = stage_readers(body, [p.op.result])
        at = min(readers, key=order.__getitem__) if readers else p.op
        wb = Builder(InsertPoint.before(at))
        wait = wb.insert(m.StageWaitOp(bars, g))
        read = a.RingReadOp(p.ring, stage)  # type: ignore[arg-type]
        read.location = p.op.location
        wb.insert(read)
        p.op.result.replace_all_uses_with(read.result)
        p.op.detach()
        p.op.erase()
        last = _last_use(body, [read.result])
        lags = in_flight and _read_by_a_lasting_wgmma(read.result, loop)
        after = Builder(InsertPoint.after(last if last is not None else read))
        if lags:
            after = _early_release_point(loop, body, last, after)
            _release_previous(after, bars, k, g)
            refill = after
            lagging.append(bars)
        else:
            release = after.insert(m.StageReleaseOp(bars, g))
            release.attributes[EARLY_RELEASE] = UnitAttr()  # (defer-wgmma's end-of-step wait is not for it)
            refill = Builder(InsertPoint.after(wait))  # the stage step k - 1 released
        _refill(refill, loop, [p], bars, k, g, ahead, trips, base, 1)
    _after_loop(loop, base, trips, rebuilt, lagging)


def _early_release_point(loop: scf.ForOp, body: Block, last: Operation | None, after: Builder) -> Builder:
    """Where step k releases step k - 1's stage, read last by `last`, a wgmma that runs on into the next step:
    step k - 1's wgmmas are done once one of step k's is waited for (wgmma groups complete in order), so right
    after the first op that uses such a result, where there is one (in a loop without defer, which moves wgmmas
    across steps); else `after` (behind step k's own `last`)."""
    earlier = None if _deferred_kernel(loop) or last is None else _after_an_earlier_wgmma(body, last)
    return after if earlier is None else Builder(InsertPoint.after(earlier))


def _after_an_earlier_wgmma(body: Block, lasting: Operation) -> Operation | None:
    """The first op of the body, before the `lasting` wgmma (which runs on into the next step), that reads the
    result of a wgmma issued before it: the lowering waits for that wgmma there, and wgmma groups complete in order,
    so the previous step's `lasting` wgmma is done by then and its stage can be released (split_ring=1: the dQ
    kernel's K, free once the next step's S = Q·Kᵀ is in, not only after its own dQ product is issued). None if
    there is none (or only inside a region, whose wait may sit in one branch)."""
    for op in body.ops:
        if op is lasting:
            return None
        if not isinstance(op, t.WgmmaOp) and not op.regions and any(
                isinstance(v.owner, t.WgmmaOp) and v.owner.parent_block() is body for v in op.operands):
            return op  # (that wgmma is in the body before it, so before `lasting` too)
    return None


def _read_by_a_lasting_wgmma(stage: SSAValue, loop: scf.ForOp) -> bool:
    """Does a wgmma that may run on into the next step read the stage (a loop-carried accumulator, or attention's
    P·V, which defer-wgmma issues a step late)? Then it is released a step late."""
    return any(isinstance(u, t.WgmmaOp) and (_may_accumulate_in_flight(u, loop)
                                             or yielded_at(u, loop.body.block) is not None)
               for u in stage_uses([stage]))


def _times(b: Builder, step: SSAValue, n: int) -> SSAValue:
    """n · step (folded when the step is a constant)."""
    value = constant_int(step)
    if value is not None:
        return _constant(b, n * value)
    return step if n == 1 else b.insert(arith.MuliOp(step, _constant(b, n))).result


def insert_tma_pipeline(module: ModuleOp, stages: int | None) -> None:
    target = module.attributes.get("tkc.target")
    if not (isinstance(target, StringAttr) and target.data.startswith("sm_90")):
        return
    for fn in module.ops:
        if not isinstance(fn, func.FuncOp):
            continue
        depth = kernel_stages(fn, stages)
        warps = fn.attributes.get("tkc.warps")
        threads = 32 * (warps.value.data if isinstance(warps, IntegerAttr) else 1)
        aligned = _aligned_args(fn)
        for loop in [op for op in fn.walk() if isinstance(op, scf.ForOp) and _shared_loads(op.body.block)]:
            pipeline_loop(loop, depth, aligned, threads)  # (the loops around it are rebuilt: collected first)


@register("insert-tma-pipeline", "on sm_90a, turn loop loads of aligned 2-D tiles into a TMA + mbarrier ring")
@dataclass(frozen=True)
class InsertTmaPipeline(ModulePass):
    name = "insert-tma-pipeline"
    stages: int | None = None  # None: the kernel's own `stages`, else 3

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.stages is not None and self.stages < 1:
            raise TkcError(f"insert-tma-pipeline needs stages >= 1, got {self.stages}")
        insert_tma_pipeline(op, self.stages)

