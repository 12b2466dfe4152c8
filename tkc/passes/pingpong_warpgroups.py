"""pingpong-warpgroups: two warpgroups take turns at the tensor cores (kernels with `pingpong=1`, sm_90a).

In a loop whose body issues wgmmas and then works on their results (attention: S = Q·Kᵀ, the softmax on S, then
O += P·V), both warpgroups tend to reach their wgmmas together and their softmax together, so the tensor cores
idle while both compute. Here the warpgroups hand a turn back and forth with two named barriers: a warpgroup
waits for its turn before its wgmmas (`tile.turn_wait`) and passes it on once they are issued (`tile.turn_pass`),
so that one warpgroup's wgmmas run while the other computes. The last wgmma of step j and the first of step
j + 1 share one turn, so each turn covers the tensor-core work the other warpgroup's computation hides under.
Warpgroup 1 passes once before the loop so that warpgroup 0 starts, and warpgroup 0 takes one turn after it so
that every arrival at a barrier is waited for. Values do not change: the interpreter ignores the turns.

The lowering (backend/lower_control.py, lower_compute.py) makes this work on the GPU: a pass right after a wgmma
goes between its commit and its wait (the other warpgroup's wgmmas queue up behind the running ones); P·V is not
waited for within its step, so the turn that issues it goes straight on to the next Q·Kᵀ; a wait before a wgmma
with a register operand takes a barrier number computed from those registers (+0, but ptxas cannot tell), or ptxas sinks the
work that computes them (the softmax) past the bar.sync, into the turn; and, without a producer warpgroup,
warpgroup 1 refills TMA rings. A refill waits for both warpgroups to release a stage: issued from warpgroup 0
inside its turn, it could need a release that warpgroup 1 makes only in its next turn, which waits for
warpgroup 0 (a hang). For the same reason such a ring needs 3 stages or more: warpgroup 0 must not wait for a
refill warpgroup 1 issues in its next turn. A producer warpgroup (producer=1) takes no turns and refills.

    scf.for %j = %lb to %ub step %c1 {
      %s = tile.wgmma_ABt %q, %k, %z          // S_j
      ... softmax ...
      %o2 = tile.wgmma_AB %p, %v, %o          // O += P_j · V_j
    }
becomes
    scf.if (warpgroup_id == 1) { tile.turn_pass }
    scf.for %j = %lb to %ub step %c1 {
      scf.if (%j == %lb) { tile.turn_wait }
      %s = tile.wgmma_ABt %q, %k, %z
      tile.turn_pass
      ... softmax ...                          // the other warpgroup's P·V and next Q·Kᵀ run meanwhile
      tile.turn_wait
      %o2 = tile.wgmma_AB %p, %v, %o
      scf.if (%j + %c1 >= %ub) { tile.turn_pass }
    }
    scf.if (warpgroup_id == 0) { tile.turn_wait }
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i32
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from tkc.errors import SourceLoc, TkcError
from tkc.ir import async_ops as a
from tkc.ir import ops as t
from tkc.ir import tma_ops as m
from tkc.passes import register
from tkc.passes.defer_wgmma import DEFERRED
from tkc.passes.insert_async_pipeline import kernel_stages
from tkc.passes.specialize_warps import CONSUMER_WARPS
from tkc.passes.util import wgmma_loops

PINGPONG_ATTR = "tkc.pingpong"
WARPGROUPS = 2


def _wgmmas(block: Block) -> list[Operation]:
    return [op for op in block.ops if isinstance(op, t.WgmmaOp)]


def _back_to_back(gemms: list[Operation]) -> list[list[Operation]]:
    """The wgmmas in runs that share one turn: those with only index arithmetic and ring reads between them
    (defer-wgmma's S_j and P_{j-1}·V_{j-1})."""
    groups = [[gemms[0]]]
    for gemm in gemms[1:]:
        between, op = [], groups[-1][-1].next_op
        while op is not gemm:
            between.append(op)
            op = op.next_op  # type: ignore[union-attr]
        if all(o.name.startswith("arith.") or isinstance(o, a.RingReadOp) for o in between):
            groups[-1].append(gemm)
        else:
            groups.append([gemm])
    return groups


def _varies_by_warp(value: SSAValue) -> bool:
    """Is the value computed from warp_id or warpgroup_id (so that the warpgroups may loop a different number of
    times, and one would wait for a turn the other never passes)?"""
    pending, seen = [value], set()
    while pending:
        v = pending.pop()
        if v in seen or not isinstance(v.owner, Operation):
            continue
        seen.add(v)
        if isinstance(v.owner, t.WarpIdOp | t.WarpgroupIdOp):
            return True
        pending.extend(v.owner.operands)
    return False


def _guarded(condition: Operation, op: Operation) -> list[Operation]:
    """[condition, scf.if condition { op }]."""
    return [condition, scf.IfOp(condition.results[0], [], Region(Block([op, scf.YieldOp()])))]


def _on_warpgroup(index: int, op: Operation) -> list[Operation]:
    warpgroup, wanted = t.WarpgroupIdOp(), arith.ConstantOp(IntegerAttr(index, i32))
    return [warpgroup, wanted, *_guarded(arith.CmpiOp(warpgroup, wanted, "eq"), op)]


def _take_turns(loop: scf.ForOp) -> None:
    loc = SourceLoc.from_attr(loop.location)
    if any(_varies_by_warp(v) for v in (loop.lb, loop.ub, loop.step)):
        raise TkcError("pingpong=1: the loop's bounds depend on warp_id() or warpgroup_id(), so the warpgroups could "
                       "take different numbers of turns (a hang)", loc)
    body = loop.body.block
    gemms = _wgmmas(body)
    nested = [op for op in loop.walk() if isinstance(op, t.WgmmaOp) and op.parent_block() is not body]
    if nested:
        raise TkcError("pingpong=1: every wgmma of the loop must be at its top level (not in an if or an inner loop), "
                       "so that both warpgroups take the same turns", SourceLoc.from_attr(nested[0].location))
    iv = body.args[0]
    groups = _back_to_back(gemms)
    for i, group in enumerate(groups):
        if i == 0 and len(groups) > 1:  # the first turn of step j + 1 is the last one of step j, but at step 0
            Rewriter.insert_op(_guarded(arith.CmpiOp(iv, loop.lb, "eq"), t.TurnWaitOp()), InsertPoint.before(group[0]))
        else:
            Rewriter.insert_op(t.TurnWaitOp(), InsertPoint.before(group[0]))
        if i == len(groups) - 1 and len(groups) > 1:  # ...and at the last step, the last turn is its own
            following = arith.AddiOp(iv, loop.step)
            Rewriter.insert_op([following, *_guarded(arith.CmpiOp(following, loop.ub, "sge"), t.TurnPassOp())],
                               InsertPoint.after(group[-1]))
        else:
            Rewriter.insert_op(t.TurnPassOp(), InsertPoint.after(group[-1]))
    Rewriter.insert_op(_on_warpgroup(1, t.TurnPassOp()), InsertPoint.before(loop))
    Rewriter.insert_op(_on_warpgroup(0, t.TurnWaitOp()), InsertPoint.after(loop))


def pingpong_warpgroups(module: ModuleOp) -> None:
    for fn in module.walk():
        if not (isinstance(fn, func.FuncOp) and PINGPONG_ATTR in fn.attributes):
            continue
        loc = SourceLoc.from_attr(fn.location)
        consumers = fn.attributes.get(CONSUMER_WARPS, fn.attributes["tkc.warps"])
        warps = consumers.value.data  # type: ignore[attr-defined]
        if warps != 4 * WARPGROUPS:
            raise TkcError(f"pingpong=1 takes turns between two warpgroups: the kernel needs warps=8 (besides a "
                           f"producer warpgroup), got {warps}", loc)
        producer = CONSUMER_WARPS in fn.attributes  # then the producer refills the rings, not warpgroup 1
        if not producer and any(isinstance(o, m.StageBarriersOp) for o in fn.walk()) and kernel_stages(fn, None) < 3:
            raise TkcError("pingpong=1 with a TMA ring needs stages >= 3: warpgroup 1 refills the ring inside its "
                           "turn, so a refill must run two steps ahead of warpgroup 0's wait (with 2 it waits for "
                           "a refill that comes after its own turn: a hang)", loc)
        loops = wgmma_loops(fn, "pingpong=1")
        deferred = any(DEFERRED in o.attributes for loop in loops for o in loop.body.block.ops)
        if producer and not deferred and kernel_stages(fn, None) < 3:
            raise TkcError("pingpong=1 with a producer warpgroup and P·V waited for in its own step (defer=0) needs "
                           "stages >= 3: a warpgroup waits inside its turn for a stage the other releases only "
                           "after its next turn (with 2: a hang once there are more steps than stages; or defer=1)",
                           loc)
        for loop in loops:
            _take_turns(loop)


@register("pingpong-warpgroups", "two warpgroups take turns at the tensor cores around their wgmmas (pingpong=1)")
class PingpongWarpgroups(ModulePass):
    name = "pingpong-warpgroups"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        pingpong_warpgroups(op)
