"""insert-async-pipeline{stages=N}: turn a loop's global→shared loads into an N-stage asynchronous pipeline.

A load into shared memory inside an `scf.for`, whose indices depend only on the loop index and values from
outside the loop (and on `tile.read`s of tensors the kernel never writes: a page table, read again for the step
it loads ahead), gets a ring of N buffers. Before the loop, copies for the first N-1 iterations start (each only
if that iteration runs); iteration k waits for its own copy (`wait_group N-2`: the N-2 newer groups may still
fly), starts the copy for iteration k+N-1 into the stage iteration k-1 used, and reads stage k mod N.
Every iteration commits one group, empty or not, so the counting holds when the loop runs 0, 1 or fewer than
N-1 times. The step may be a run-time value (a persistent kernel's stride over its tiles): trip counts and
stages then count steps of it. `insert-barriers` then puts the one `tile.barrier` each iteration needs between the
wait and the next copy. With stages=1 nothing changes (loads stay synchronous). A loop that runs a wgmma (sm_90a) gets one
stage of slack when it has one to spare: copies run stages-2 ahead and the loop is marked `tkc.wgmma_in_flight`,
so that the lowering may leave each step's wgmma running until the next step (the stage it reads is refilled
two steps later).

    scf.for %j = %lb to %ub step %c1 {
      %k_s = tile.load %K[%b, %j] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
      ...
becomes
    %ring = tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16>>
    scf.if (0 < trips) { tile.copy_async %K[%b, %lb], %ring[0] }   tile.commit_group
    scf.if (1 < trips) { tile.copy_async %K[%b, %lb + 1], %ring[1] }   tile.commit_group
    scf.for %j = %lb to %ub step %c1 {
      tile.wait_group 1
      scf.if (k + 2 < trips) { tile.copy_async %K[%b, %j + 2], %ring[(k + 2) % 3] }   tile.commit_group
      %k_s = tile.ring_read %ring[k % 3]
      ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects import arith, scf
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, UnitAttr, i32
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint
from xdsl.traits import is_side_effect_free

from tkc.errors import TkcError
from tkc.ir import async_ops as a
from tkc.ir import ops as t
from tkc.ir.types import GlobalType, SharedTileType, SharedVecType
from tkc.passes import register
from tkc.passes.util import within

DEFAULT_STAGES = 3
WGMMA_IN_FLIGHT = "tkc.wgmma_in_flight"  # on a loop whose copies leave room for one wgmma step in flight


def _constant(b: Builder, value: int) -> SSAValue:
    return b.insert(arith.ConstantOp(IntegerAttr(value, i32))).result


def _index_slice(load: t.LoadOp, loop: scf.ForOp) -> list[Operation] | None:
    """The ops of the loop body that compute the load's indices, in order, or None if some index (or its rows_at
    tensor, or its rows' end) depends on anything but the loop index and values from outside the loop."""
    extras = [v for v in (load.row_index, load.rows_end) if v is not None]
    return value_slice(list(load.indices) + extras, loop)


def reads_unwritten(op: Operation) -> bool:
    """A `tile.read` of a kernel argument that the kernel only reads (loads from it or by its row numbers, reads,
    its dims): read again for another step, it gives what that step would have read (a page table's entry)."""
    source = op.source if isinstance(op, t.ReadOp) else None
    return (source is not None and isinstance(source.owner, Block)
            and all(isinstance(use.operation, t.ReadOp | t.DimOp | t.LoadOp) for use in source.uses))


def value_slice(values: list[SSAValue], loop: scf.ForOp) -> list[Operation] | None:
    """The ops of the loop body that compute `values`, in order, or None if one depends on anything but the loop
    index, values from outside the loop and reads of tensors the kernel never writes (what can be computed again
    for another value of the index)."""
    body = loop.body.block
    iv = body.args[0]
    needed: list[Operation] = []
    seen: set[Operation] = set()

    def visit(value: SSAValue) -> bool:
        if value is iv:
            return True
        owner = value.owner
        if isinstance(owner, Block):
            return not within(owner, body)
        if owner.parent_block() is not body:
            return not within(owner.parent_block(), body)
        if owner in seen:
            return True
        if not (is_side_effect_free(owner) or reads_unwritten(owner)) or owner.regions:
            return False
        seen.add(owner)
        if not all(visit(o) for o in owner.operands):
            return False
        needed.append(owner)
        return True

    if not all(visit(v) for v in values):
        return None
    order = {op: n for n, op in enumerate(body.ops)}
    return sorted(needed, key=order.__getitem__)


@dataclass
class _Pipelined:
    load: t.LoadOp
    slice: list[Operation]
    ring: SSAValue | None = None


def _issue(b: Builder, loads: list[_Pipelined], iv: SSAValue, j: SSAValue, stage: SSAValue) -> None:
    """Clone each load's index computation with the loop index replaced by `j`, and start its copy."""
    for p in loads:
        mapping: dict[SSAValue, SSAValue] = {iv: j}
        for op in p.slice:
            clone = op.clone(value_mapper=mapping)
            b.insert(clone)
            for old, new in zip(op.results, clone.results):
                mapping[old] = new
        indices = [mapping.get(i, i) for i in p.load.indices]
        end = mapping.get(p.load.rows_end, p.load.rows_end) if p.load.rows_end is not None else None
        copy = t.keep_index_units(p.load, a.CopyAsyncOp(p.load.source, indices, p.ring, stage,  # type: ignore[arg-type]
                                                         p.load.row_index, end))
        copy.location = p.load.location
        b.insert(copy)


def _guarded_issue(b: Builder, cond: SSAValue, loads: list[_Pipelined], iv: SSAValue,
                   j_of: Callable[[Builder], SSAValue], stage_of: Callable[[Builder], SSAValue]) -> None:
    then = Block()
    inner = Builder(InsertPoint.at_end(then))
    _issue(inner, loads, iv, j_of(inner), stage_of(inner))
    inner.insert(scf.YieldOp())
    b.insert(scf.IfOp(cond, [], Region(then), Region(Block([scf.YieldOp()]))))
    b.insert(a.CommitGroupOp())


def _wgmma_slack(body: Block, stages: int) -> int:
    """Stages kept free for wgmmas still reading: one, where the loop runs a wgmma and has a stage to spare."""
    return int(stages >= 3 and any(isinstance(op, t.WgmmaOp) for op in body.walk()))


def pipeline_loop(loop: scf.ForOp, stages: int) -> bool:
    body = loop.body.block
    candidates: list[_Pipelined] = []
    for op in body.ops:
        if (isinstance(op, t.LoadOp) and isinstance(op.source.type, GlobalType)
                and isinstance(op.result.type, SharedTileType | SharedVecType)):
            sl = _index_slice(op, loop)
            if sl is not None:
                candidates.append(_Pipelined(op, sl))
    if not candidates or stages < 2:
        return False
    step_op = loop.step.owner
    step = (step_op.value.value.data if isinstance(step_op, arith.ConstantOp) and isinstance(step_op.value, IntegerAttr)
            else None)  # None: a run-time step (a persistent kernel's loop over its tiles), defined before the loop

    def step_value(b: Builder) -> SSAValue:
        return _constant(b, step) if step is not None else loop.step

    def times_step(b: Builder, n: SSAValue) -> SSAValue:
        return b.insert(arith.MuliOp(n, step_value(b))).result

    iv = body.args[0]
    # A wgmma reading these tiles may still run while the next iteration starts (it is waited for one step
    # later): then a copy may refill only the stage read two steps ago, so the copies run stages-2 ahead.
    slack = _wgmma_slack(body, stages)
    ahead = stages - 1 - slack
    if slack:
        loop.attributes[WGMMA_IN_FLIGHT] = UnitAttr()

    # Before the loop: rings, trip count, and copies for the first stages-1 iterations.
    pre = Builder(InsertPoint.before(loop))
    for p in candidates:
        ring = pre.insert(a.RingAllocOp(a.RingType(stages, p.load.result.type)))
        ring.location = p.load.location
        p.ring = ring.result
    span = pre.insert(arith.SubiOp(loop.ub, loop.lb)).result
    trips = pre.insert(arith.CeilDivSIOp(span, step_value(pre))).result
    for s in range(ahead):
        c_s = _constant(pre, s)
        cond = pre.insert(arith.CmpiOp(c_s, trips, "slt")).result
        _guarded_issue(
            pre, cond, candidates, iv,
            lambda b, s=s: b.insert(arith.AddiOp(loop.lb, times_step(b, _constant(b, s)))).result,
            lambda b, s=s: _constant(b, s),
        )

    # In the loop: wait for this iteration's copy, start the one stages-1 ahead, read the ring.
    first = body.first_op
    assert first is not None
    inb = Builder(InsertPoint.before(first))
    k = inb.insert(arith.DivUIOp(inb.insert(arith.SubiOp(iv, loop.lb)).result, step_value(inb))).result
    c_stages = _constant(inb, stages)
    stage = inb.insert(arith.RemUIOp(k, c_stages)).result
    inb.insert(a.WaitGroupOp(ahead - 1))
    k_ahead = inb.insert(arith.AddiOp(k, _constant(inb, ahead))).result
    cond = inb.insert(arith.CmpiOp(k_ahead, trips, "slt")).result
    _guarded_issue(
        inb, cond, candidates, iv,
        lambda b: b.insert(arith.AddiOp(loop.lb, times_step(b, k_ahead))).result,
        lambda b: b.insert(arith.RemUIOp(k_ahead, c_stages)).result,
    )
    for p in candidates:
        read = a.RingReadOp(p.ring, stage)  # type: ignore[arg-type]
        read.location = p.load.location
        Builder(InsertPoint.before(p.load)).insert(read)
        p.load.result.replace_all_uses_with(read.result)
        p.load.detach()
        p.load.erase()
    return True




def kernel_stages(fn: Operation, stages: int | None) -> int:
    """The pipeline depth for a kernel: the pass option, else the kernel's own `stages`, else the default."""
    if stages is not None:
        return stages
    attr = fn.attributes.get("tkc.stages")
    return attr.value.data if isinstance(attr, IntegerAttr) else DEFAULT_STAGES


def insert_async_pipeline(module: ModuleOp, stages: int | None) -> None:
    """Pipeline every eligible loop: `stages` deep, or (when None) as deep as the kernel's `tkc.stages` asks."""
    from xdsl.dialects import func

    for fn in module.ops:
        if not isinstance(fn, func.FuncOp):
            continue
        depth = kernel_stages(fn, stages)
        loops = [op for op in fn.walk() if isinstance(op, scf.ForOp)]
        for loop in reversed(loops):  # innermost first
            pipeline_loop(loop, depth)


@register("insert-async-pipeline", "turn loop loads into shared memory into an N-stage cp.async pipeline (sm_80)")
@dataclass(frozen=True)
class InsertAsyncPipeline(ModulePass):
    name = "insert-async-pipeline"
    stages: int | None = None  # None: the kernel's own `stages`, else 3

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.stages is not None and self.stages < 1:
            raise TkcError(f"insert-async-pipeline needs stages >= 1, got {self.stages}")
        insert_async_pipeline(op, self.stages)

