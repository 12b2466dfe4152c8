"""defer-wgmma: issue a loop's last wgmma in the next step, right behind the step's first (kernels with `defer=1`,
sm_90a): FlashAttention-3's overlap of P·V with the softmax inside one warpgroup.

In attention, step j computes S_j = Q·K_jᵀ, the softmax on S_j, then O += P_j·V_j. A warpgroup's tensor-core work
and its softmax alternate, and the tensor cores idle whenever every warpgroup is in its softmax. Here step j
issues S_j, then O += P_{j-1}·V_{j-1} (P carried from the step before, V read again from the previous step's ring
stage), waits for S_j alone (`tile.wgmma_wait 1`), runs the softmax while that P·V runs, and waits for it
(`tile.wgmma_wait 0`) just before the ring stage it reads is released and before its result is read. Step 0
multiplies a zero P by its own stage (adds 0); the last P·V runs after the loop, if the loop ran.

Every wgmma after the first that takes the same P is deferred alike (attention's ROWSUM_MMA: P·1 for the row
sums beside P·V, its B a tile from outside the loop); the wait before the softmax then leaves them all running.
More generally the step's trailing wgmmas (A registers the step computes, result only to the yield) are deferred,
each A carried once, each B a ring stage, a view of one, or a tile from outside the loop; the wgmmas before them are
the step's leads, waited for together: the dK/dV block's (HALVES) Sᵀ and dPᵀ parts lead, its dV (A = P, B a view of
the dO stage) and dK (A = dS, B a view of the Q stage) run in the next step under its exchange and softmax.
All of them are marked `tkc.deferred`: the lowering leaves them running and the explicit waits cover them. What
reads the deferred result moves to the end of the step, after the wait: an scf.if that updates it together with
other values (attention's rescale of O, l and m) is split in two, the ops the moved part needs cloned into it.
The ring must release a step one iteration late (`insert-tma-pipeline` does, for a wgmma that may run on).

With late_pv=1 the deferred wgmmas are issued after the op that takes S_j's row max (right after the wait where
the step takes none), S_j waited for alone (`tile.wgmma_wait 0`) before the softmax: ptxas then spreads the P·V
wgmmas through the softmax instead of issuing them all in front of it (D=64 N=1024: +2%, RESULTS 2026-12-04 02:53).

With overlap=1 too (overlap-wgmma ran first: the body's first wgmma is S_{j+1}, its result only carried, and the
softmax works on S_j from the step before), P_{j-1}·V_{j-1} goes in front of S_{j+1}, no wait precedes the softmax
(S_j was waited for at the end of the step before), and one `tile.wgmma_wait 0` at the end covers both: the
tensor cores run P·V and the next Q·Kᵀ while the softmax runs (FlashAttention-3's two-stage pipelining within a
warpgroup). The yield would copy S_{j+1} into the carried registers (S_j is still read while S_{j+1} is written):
the loop is marked for `unroll-overlapped-loop`, which runs two steps an iteration so that the two alternate.
defer=2 and up (peeled or rotated loops) do not combine with overlap=1.

    scf.for %j = %lb to %ub step %c1 iter_args(%o = %o0) {
      tile.stage_wait %bars[%k]
      %k_s = tile.ring_read %K_ring[%stage]
      %v_s = tile.ring_read %V_ring[%stage]
      %s = tile.wgmma_ABt %q, %k_s, %zero
      ... softmax on %s: %p ...  %o1 = (%o rescaled)
      %o2 = tile.wgmma_AB %p, %v_s, %o1
      scf.if (%k > 0) { tile.stage_release %bars[%k - 1] }
      scf.yield %o2
    }
becomes
    scf.for %j = %lb to %ub step %c1 iter_args(%o = %o0, %p_prev = %zero_p) {
      tile.stage_wait %bars[%k]
      %k_s = tile.ring_read %K_ring[%stage]
      %s = tile.wgmma_ABt %q, %k_s, %zero {tkc.deferred}
      %v_prev = tile.ring_read %V_ring[(%k > 0 ? %k - 1 : %k) mod 3]
      %o_acc = tile.wgmma_AB %p_prev, %v_prev, %o {tkc.deferred}
      tile.wgmma_wait 1
      ... softmax on %s: %p ...
      tile.wgmma_wait 0
      scf.if (%k > 0) { tile.stage_release %bars[%k - 1] }
      %o1 = (%o_acc rescaled)
      scf.yield %o1, %p
    }
    %o_end = scf.if (trips > 0) { tile.wgmma_AB %p_last, (ring_read of the last step's stage), %o_res } else { %o_res }
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.context import Context
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, UnitAttr, i32
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import is_side_effect_free

from tkc.errors import SourceLoc, TkcError
from tkc.ir import async_ops as a
from tkc.ir import ops as t
from tkc.ir import tma_ops as m
from tkc.ir.types import RegTileType, SharedTileType
from tkc.passes import register
from tkc.passes.insert_async_pipeline import WGMMA_IN_FLIGHT, value_slice
from tkc.passes.insert_tma_pipeline import EARLY_RELEASE, _top_level, step_index
from tkc.passes.overlap_wgmma import _clone_at
from tkc.passes.unroll_overlapped_loop import UNROLL2
from tkc.passes.util import defined_in, wgmma_loops, with_more_carried, yielded_at

DEFER_ATTR = "tkc.defer"
DEFERRED = "tkc.deferred"  # on a wgmma that does not wait for itself: a tile.wgmma_wait after it does


def _fail(message: str, op: Operation) -> TkcError:
    return TkcError(f"defer=1: {message}", SourceLoc.from_attr(op.location))


def _reads(op: Operation, value: SSAValue) -> bool:
    """Whether `op` or an op nested in it uses `value`."""
    return any(value in o.operands for o in op.walk())


def _depends_on(value: SSAValue, source: SSAValue, region: Region) -> bool:
    """Whether `value` is `source` or computed from it by ops of `region`."""
    if value is source:
        return True
    owner = value.owner
    if not isinstance(owner, Operation) or owner.parent_region() is not region:
        return False
    return any(_reads(owner, source) or _depends_on(v, source, region) for v in owner.operands)


def _split_if(op: scf.IfOp, source: SSAValue) -> scf.IfOp | None:
    """Split an if whose results are some computed from `source` and some not: the ones from `source` go to a new
    if (with the same condition, right after, with clones of the ops they need); the old one keeps the rest."""
    regions = [op.true_region, op.false_region]
    if not all(r.blocks for r in regions):
        return None
    yields = [r.block.last_op for r in regions]
    moved = [i for i in range(len(op.results))
             if any(_depends_on(y.operands[i], source, r) for y, r in zip(yields, regions))]  # type: ignore[union-attr]
    if not moved or len(moved) == len(op.results):
        return None
    blocks = []
    for region, y in zip(regions, yields):
        needed: set[Operation] = set()

        def need(value: SSAValue, region: Region = region) -> None:
            owner = value.owner
            if isinstance(owner, Operation) and owner.parent_region() is region and owner not in needed:
                needed.add(owner)
                for v in owner.operands:
                    need(v)

        for i in moved:
            need(y.operands[i])  # type: ignore[union-attr]
        block, mapping = Block(), {}
        for o in region.block.ops:
            if o in needed:
                clone = o.clone(value_mapper=mapping)
                block.add_op(clone)
                mapping.update(zip(o.results, clone.results))
        block.add_op(scf.YieldOp(*[mapping.get(y.operands[i], y.operands[i]) for i in moved]))  # type: ignore[union-attr]
        blocks.append(block)
    split = scf.IfOp(op.cond, [op.results[i].type for i in moved], Region(blocks[0]), Region(blocks[1]))
    Rewriter.insert_op(split, InsertPoint.after(op))
    for i, new in zip(moved, split.results):
        op.results[i].replace_all_uses_with(new)
    # the old if keeps the other results
    kept = [i for i in range(len(op.results)) if i not in moved]
    for y in yields:
        y.operands = [y.operands[i] for i in kept]  # type: ignore[union-attr]
    then_region, else_region = op.true_region, op.false_region
    rest = scf.IfOp(op.cond, [op.results[i].type for i in kept], op.detach_region(then_region),
                    op.detach_region(else_region))
    rest.location = split.location = op.location
    Rewriter.insert_op(rest, InsertPoint.before(op))
    for i, new in zip(kept, rest.results):
        op.results[i].replace_all_uses_with(new)
    op.detach()
    op.erase()
    for region in (rest.true_region, rest.false_region):  # what only the moved results needed
        for o in reversed(list(region.block.ops)):
            if not any(r.uses for r in o.results) and o.results and is_side_effect_free(o):
                o.detach()
                o.erase()
    return split


def _after_row_max(first: Operation, body: Block) -> Operation | None:
    """The op of `body` (top level) that takes the row max of the first wgmma's result, masked or not (late_pv=1),
    if the step takes one."""
    derived = {first.results[0]}  # S and what the body computes from it (masks in ifs included)
    for op in body.ops:
        nested = list(op.walk())
        if any(isinstance(o, t.ReduceOp) and o.name == "tile.row_max" and o.input in derived for o in nested):
            return op
        if any(v in derived for o in nested for v in o.operands):
            derived.update(op.results)
            derived.update(r for o in nested for r in o.results)
    return None


def _trailing(gemms: list[t.WgmmaOp], loop: scf.ForOp) -> list[t.WgmmaOp]:
    """The wgmmas that end the step and run in the next one: from the last back, those whose A is a register tile the
    step computes and whose result only feeds the yield (attention's P·V and P·1; the dK/dV block's dV and dK)."""
    body, tails = loop.body.block, []
    for gemm in reversed(gemms[1:]):
        if not (isinstance(gemm.a.type, RegTileType) and defined_in(gemm.a, loop)
                and yielded_at(gemm, body) is not None):
            break
        tails.insert(0, gemm)
    return tails or gemms[1:]  # (none: the checks below say what is wrong with the last one)


def _stage_of(gemm: t.WgmmaOp, loop: scf.ForOp) -> tuple[a.RingReadOp, t.LoadOp | None] | None:
    """Where a trailing wgmma's B comes from: a ring stage of this step (the ring read, and the view of it the wgmma
    takes, if any), or None for a tile from outside the loop."""
    owner = gemm.b.owner
    view = None
    if isinstance(owner, t.LoadOp) and isinstance(owner.source.type, SharedTileType) and defined_in(gemm.b, loop):
        view, owner = owner, owner.source.owner
    if isinstance(owner, a.RingReadOp) and owner.parent_block() is loop.body.block \
            and isinstance(owner.stage.owner, arith.RemUIOp):
        return owner, view
    if not defined_in(gemm.b, loop):
        return None
    raise _fail("a deferred wgmma's B must be a ring stage of a pipelined loop (insert-tma-pipeline), a view of one, "
                "or a tile from outside the loop", gemm)


def _tiles_at(sources: list[tuple[a.RingReadOp, t.LoadOp | None] | None], stage_at: Callable[[arith.RemUIOp], SSAValue],
              emit: Callable[[list[Operation]], object]) -> list[SSAValue | None]:
    """The trailing wgmmas' B tiles at another step: each ring read (and the view of it) again, at the stage
    `stage_at` gives for its stage op (asked once per ring index), its ops passed to `emit`; None where a B is from
    outside the loop."""
    stages: dict[tuple[SSAValue, SSAValue], SSAValue] = {}
    tiles: list[SSAValue | None] = []
    for where in sources:
        if where is None:
            tiles.append(None)
            continue
        read, view = where
        stage = read.stage.owner
        key = (stage.lhs, stage.rhs)
        if key not in stages:
            stages[key] = stage_at(stage)
        again = a.RingReadOp(read.ring, stages[key])
        again.location = read.location
        ops: list[Operation] = [again]
        if view is not None:
            ops.append(view.clone())
            ops[-1].operands = [again.result, *view.operands[1:]]
        emit(ops)
        tiles.append(ops[-1].results[0])
    return tiles


def _defer(loop: scf.ForOp, late: bool = False) -> None:
    body = loop.body.block
    gemms = [op for op in body.ops if isinstance(op, t.WgmmaOp)]
    if len(gemms) < 2:
        raise _fail("the loop needs two wgmmas (the first is waited for, the last is deferred)", loop)
    tails = _trailing(gemms, loop)
    leads = gemms[:len(gemms) - len(tails)]  # waited for in the step, the tails issued behind them
    first, last = leads[0], tails[-1]
    indices = [yielded_at(tail, body) for tail in tails]
    for tail, index in zip(tails, indices):
        if index is None:
            raise _fail("the loop's last wgmma must only feed the loop's next step (its result goes to the yield)",
                        tail)
        if not isinstance(tail.a.type, RegTileType) or (tail.a is not last.a and not defined_in(tail.a, loop)):
            raise _fail("the loop's last wgmmas must take one A from registers (carried to the next step)", tail)
    stages = {tail: _stage_of(tail, loop) for tail in tails}
    if stages[last] is None:
        raise _fail("the last wgmma's B must be a ring stage of a pipelined loop (insert-tma-pipeline)", last)
    if WGMMA_IN_FLIGHT not in loop.attributes:
        raise _fail("the loop's ring must release each step one iteration late", loop)
    k = step_index(loop)
    carried = [body.args[index + 1] for index in indices]  # type: ignore[operator]
    order = {op: n for n, op in enumerate(body.ops)}
    if k is None or any(order[_top_level(u.operation, body)] <= order[first] for c in carried for u in c.uses):
        raise _fail("the value the last wgmma accumulates is read before the loop's first wgmma", loop)
    # With overlap=1 the first wgmma is the next step's S (its result only carried): it and the P·V run under the
    # whole softmax, both waited for at the step's end (the yield copies S into the carried registers)
    rotated = yielded_at(first, body) is not None

    # this step's P·V is the previous step's: A carried, B the previous stage (step 0: its own, times zero)
    a_values = list(dict.fromkeys(tail.a for tail in tails))  # each A once (P·V and P·1 share P)
    zero_as = [t.FillOp(0.0, value.type) for value in a_values]
    Rewriter.insert_op(zero_as, InsertPoint.before(loop))
    a_prev = {value: body.insert_arg(value.type, len(body.args)) for value in a_values}
    c0, c1 = arith.ConstantOp(IntegerAttr(0, i32)), arith.ConstantOp(IntegerAttr(1, i32))
    has_prev = arith.CmpiOp(k, c0, "sgt")
    prologue: list[Operation] = [c0, c1, has_prev]

    def previous(stage: arith.RemUIOp) -> SSAValue:  # the step before's stage (step 0: its own)
        back = arith.SubiOp(stage.lhs, c1)
        prev_step = arith.SelectOp(has_prev, back, stage.lhs)
        prev_stage = arith.RemUIOp(prev_step, stage.rhs)
        prologue.extend([back, prev_step, prev_stage])
        return prev_stage.result

    b_prev = _tiles_at([stages[tail] for tail in tails], previous, prologue.extend)
    deferred = []
    for tail, acc, b in zip(tails, carried, b_prev):
        pv = tail.clone()
        pv.attributes[DEFERRED] = UnitAttr()
        acc.replace_all_uses_with(pv.result)  # what read the carried value now reads it with this P·V added
        pv.operands = [a_prev[tail.a], tail.b if b is None else b, acc]  # (None: a constant tile, P·1's ones)
        deferred.append(pv)
    for lead in leads:
        lead.attributes[DEFERRED] = UnitAttr()
    prologue += deferred
    if rotated:  # S_j came from the step before (waited for there): the softmax waits for nothing
        Rewriter.insert_op(prologue, InsertPoint.before(first))
    elif late:  # wait for S_j (nothing else runs), issue P·V once S_j's row max is taken
        wait = t.WgmmaWaitOp(0)
        Rewriter.insert_op(wait, InsertPoint.after(leads[-1]))
        Rewriter.insert_op(prologue, InsertPoint.after(_after_row_max(first, body) or wait))
    else:  # wait for the leads alone: each wgmma is a group of its own, the deferred ones issued after them
        Rewriter.insert_op([*prologue, t.WgmmaWaitOp(len(deferred))], InsertPoint.after(leads[-1]))

    yield_op = body.last_op
    assert isinstance(yield_op, scf.YieldOp)
    finals = {index: tail.c for tail, index in zip(tails, indices)}
    yield_op.operands = [*(finals.get(i, v) for i, v in enumerate(yield_op.operands)), *a_values]
    next_as = [value.owner for value in a_values]  # written only after the wait (ptxas would put them in the
    # registers the deferred wgmmas read)
    sources = [where for where in stages.values() if where is not None]
    ring_reads, views = {read for read, _ in sources}, [view for _, view in sources if view is not None]
    for tail in tails:
        tail.detach()
        tail.erase()
    for op in [*views, *ring_reads]:
        if not op.results[0].uses:
            op.detach()
            op.erase()

    # what reads the P·V results, and the next P, wait for them: at the end of the step
    for pv in deferred:
        for op in list(body.ops):
            if isinstance(op, scf.IfOp) and _reads(op, pv.result):
                _split_if(op, pv.result)
    dependent: set[SSAValue] = {pv.result for pv in deferred}
    late = []
    for op in list(body.ops):
        if op is yield_op or op in deferred or not (op in next_as or any(_reads(op, v) for v in dependent)):
            continue
        if not (is_side_effect_free(op) or (isinstance(op, scf.IfOp) and all(
                is_side_effect_free(o) for o in op.walk() if o is not op and not isinstance(o, scf.YieldOp)))):
            raise _fail("an op with side effects reads the deferred wgmma's result", op)
        late.append(op)
        dependent.update(op.results)
    for op in late:
        op.detach()
        Rewriter.insert_op(op, InsertPoint.before(yield_op))
    releases = [_top_level(op, body) for op in body.walk()  # (split_ring=1: K's own release is not the P·V's)
                if isinstance(op, m.StageReleaseOp) and EARLY_RELEASE not in op.attributes]
    order = {op: n for n, op in enumerate(body.ops)}
    wait_at = min([*late, *releases, yield_op], key=order.__getitem__)
    Rewriter.insert_op(t.WgmmaWaitOp(0), InsertPoint.before(wait_at))  # (rotated: also S_{j+1}, before its yield)

    # the loop carries P; the last P·V after it
    rebuilt = with_more_carried(loop, [zero.result for zero in zero_as])
    if rotated:  # S_{j+1} is carried too: two steps an iteration spare its copy (unroll-overlapped-loop)
        rebuilt.attributes[UNROLL2] = UnitAttr()
    _last_step(rebuilt, indices, [stages[tail] for tail in tails], tails, len(a_values),  # type: ignore[arg-type]
               [a_values.index(tail.a) for tail in tails])


def _last_step(loop: scf.ForOp, indices: list[int], stages: list[tuple[a.RingReadOp, t.LoadOp | None] | None],
               gemms: list[Operation], carried_as: int, a_of: list[int]) -> None:
    """After the loop: O += P_last · V_last on the last step's stage (and the other deferred wgmmas on their B),
    if the loop ran. The loop's last `carried_as` results are the A operands; gemm i takes the a_of[i]-th."""
    pre = [span := arith.SubiOp(loop.ub, loop.lb), trips := arith.CeilDivSIOp(span, loop.step),
           c0 := arith.ConstantOp(IntegerAttr(0, i32)), c1 := arith.ConstantOp(IntegerAttr(1, i32)),
           ran := arith.CmpiOp(trips, c0, "sgt"), last_k := arith.SubiOp(trips, c1),
           offset := arith.MuliOp(last_k, loop.step), last_iv := arith.AddiOp(loop.lb, offset)]
    Rewriter.insert_op(pre, InsertPoint.after(loop))
    then = Block()

    def last(stage: arith.RemUIOp) -> SSAValue:  # the last step's stage
        stage_ops = value_slice([stage.lhs, stage.rhs], loop)
        assert stage_ops is not None
        mapping = _clone_at(stage_ops, loop.body.block.args[0], last_iv.result, InsertPoint.at_end(then))
        last_stage = arith.RemUIOp(mapping.get(stage.lhs, stage.lhs), mapping.get(stage.rhs, stage.rhs))
        then.add_op(last_stage)
        return last_stage.result

    last_b = _tiles_at(stages, last, then.add_ops)
    results = [loop.results[index] for index in indices]
    carried_a = loop.results[len(loop.results) - carried_as:]
    pvs = []
    for i, (gemm, result) in enumerate(zip(gemms, results)):
        pv = gemm.clone()
        pv.operands = [carried_a[a_of[i]], gemm.b if last_b[i] is None else last_b[i], result]
        then.add_op(pv)
        pvs.append(pv)
    then.add_op(scf.YieldOp(*[pv.results[0] for pv in pvs]))
    done = scf.IfOp(ran, [r.type for r in results], Region(then), Region(Block([scf.YieldOp(*results)])))
    done.location = gemms[-1].location
    Rewriter.insert_op(done, InsertPoint.after(last_iv))
    for result, new in zip(results, done.results):
        for use in list(result.uses):
            if use.operation not in pvs and use.operation.parent_op() is not done:
                use.operation.operands[use.index] = new


def defer_wgmma(module: ModuleOp) -> None:
    for fn in module.walk():
        if not (isinstance(fn, func.FuncOp) and DEFER_ATTR in fn.attributes):
            continue
        if "tkc.overlap" in fn.attributes and "tkc.peel" in fn.attributes:
            raise TkcError("overlap=1 goes with defer=1 only (defer=2 and up peel or rotate the loop overlap rotates)",
                           SourceLoc.from_attr(fn.location))
        late = "tkc.late_pv" in fn.attributes
        if late and ("tkc.overlap" in fn.attributes or "tkc.rotate" in fn.attributes):
            raise TkcError("late_pv=1 goes with defer=1 or 2 only (not with overlap=1 or defer=3 and up)",
                           SourceLoc.from_attr(fn.location))
        for loop in wgmma_loops(fn, "defer=1"):
            _defer(loop, late)  # type: ignore[arg-type]


@register("defer-wgmma", "issue a loop's last wgmma in the next step, behind its first (defer=1, FA3's overlap)")
class DeferWgmma(ModulePass):
    name = "defer-wgmma"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        defer_wgmma(op)
