"""stagger-warpgroups: warpgroup 1 starts its work N key steps after warpgroup 0 (kernels with `stagger=N`, sm_90a).

Two consumer warpgroups that share a block's query tile and its K/V ring reach the tile's ends together: both
store their output, then both run step 0 of the next tile (its Q·Kᵀ waited for alone), and the tensor cores idle
meanwhile. Started N steps apart, they stay apart (nothing makes one wait for the other but the ring, which lets
the first run up to its depth - 1 steps ahead), so that one's epilogue and step 0 run while the other's wgmmas
keep the tensor cores busy. Warpgroup 1 waits once, before the tile loop, for a turn that warpgroup 0 passes in
its first tile after N steps of the key loop (or after the loop, where the tile has fewer; a block without a tile
does not wait). Values do not change: the interpreter ignores the turns.

    scf.for %tile = %t0 to %t1 step %g {
      scf.for %j = %lb to %ub step %c1 { ...step... }
    }
becomes
    scf.if (warpgroup_id == 1 && %t0 < %t1) { tile.turn_wait }
    scf.for %tile = %t0 to %t1 step %g {
      scf.for %j = %lb to %ub step %c1 {
        ...step...
        scf.if (warpgroup_id == 0 && %tile == %t0 && %j == min(%lb + N - 1, %ub - 1)) { tile.turn_pass }
      }
      scf.if (warpgroup_id == 0 && %tile == %t0 && %lb >= %ub) { tile.turn_pass }
    }

Runs after the passes that copy or move the key loop's steps (peel-deferred-step, rotate-tile-loop), so that the
steps it counts are the loop's own; the ring needs N + 1 stages or more to let warpgroup 0 run N steps ahead.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i32
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from tkc.errors import SourceLoc, TkcError
from tkc.ir import ops as t
from tkc.passes import register
from tkc.passes.insert_async_pipeline import kernel_stages
from tkc.passes.pingpong_warpgroups import PINGPONG_ATTR, _guarded
from tkc.passes.specialize_warps import CONSUMER_WARPS
from tkc.passes.util import wgmma_loops

STAGGER_ATTR = "tkc.stagger"


def _when(conditions: list[tuple[list[Operation], SSAValue]], op: Operation) -> list[Operation]:
    """The ops that compute each condition, their conjunction, and `scf.if` it `{ op }`."""
    ops: list[Operation] = [o for made, _ in conditions for o in made]  # each list ends with its condition's op
    value = conditions[0][1]
    for _, other in conditions[1:]:
        ops.append(both := arith.AndIOp(value, other))
        value = both.result
    return [*ops[:-1], *_guarded(ops[-1], op)]  # (ops[-1] makes `value`)


def _is_warpgroup(index: int) -> tuple[list[Operation], SSAValue]:
    warpgroup, wanted = t.WarpgroupIdOp(), arith.ConstantOp(IntegerAttr(index, i32))
    equal = arith.CmpiOp(warpgroup, wanted, "eq")
    return [warpgroup, wanted, equal], equal.result


def _compare(a: SSAValue, b: SSAValue, how: str) -> tuple[list[Operation], SSAValue]:
    cmp = arith.CmpiOp(a, b, how)
    return [cmp], cmp.result


def _stagger(loop: scf.ForOp, steps: int) -> None:
    outer = [op for op in _ancestors(loop) if isinstance(op, scf.ForOp)]
    if len(outer) > 1:
        raise TkcError("stagger=N: the key loop must sit in one tile loop (or none)", SourceLoc.from_attr(loop.location))
    tiles = outer[0] if outer else None

    def first_tile() -> list[tuple[list[Operation], SSAValue]]:
        return [] if tiles is None else [_compare(tiles.body.block.args[0], tiles.lb, "eq")]

    # warpgroup 1: one wait, before the tile loop, if there is a tile
    has_tile = [] if tiles is None else [_compare(tiles.lb, tiles.ub, "slt")]
    Rewriter.insert_op(_when([_is_warpgroup(1), *has_tile], t.TurnWaitOp()), InsertPoint.before(tiles or loop))
    # warpgroup 0: the pass, after `steps` steps of the first tile's key loop (its last step if it has fewer)
    body = loop.body.block
    ahead = arith.ConstantOp(IntegerAttr(steps - 1, i32))
    one = arith.ConstantOp(IntegerAttr(1, i32))
    target, last = arith.AddiOp(loop.lb, ahead), arith.SubiOp(loop.ub, one)
    at = arith.MinSIOp(target, last)
    made: list[Operation] = [ahead, one, target, last, at]
    Rewriter.insert_op([*made, *_when([_is_warpgroup(0), *first_tile(), _compare(body.args[0], at.result, "eq")],
                                      t.TurnPassOp())], InsertPoint.before(body.last_op))  # type: ignore[arg-type]
    _pass_after_loop(loop, first_tile())


def _pass_after_loop(loop: scf.ForOp, first_tile: list[tuple[list[Operation], SSAValue]]) -> None:
    """Warpgroup 0's pass right after the key loop, where the first tile's loop runs no step."""
    Rewriter.insert_op(_when([_is_warpgroup(0), *first_tile, _compare(loop.lb, loop.ub, "sge")], t.TurnPassOp()),
                       InsertPoint.after(loop))


def _ancestors(op: Operation) -> list[Operation]:
    found, parent = [], op.parent_op()
    while parent is not None:
        found.append(parent)
        parent = parent.parent_op()
    return found


def stagger_warpgroups(module: ModuleOp) -> None:
    for fn in module.walk():
        if not (isinstance(fn, func.FuncOp) and STAGGER_ATTR in fn.attributes):
            continue
        loc = SourceLoc.from_attr(fn.location)
        steps = fn.attributes[STAGGER_ATTR].value.data  # type: ignore[attr-defined]
        consumers = fn.attributes.get(CONSUMER_WARPS, fn.attributes["tkc.warps"])
        if consumers.value.data != 8:  # type: ignore[attr-defined]
            raise TkcError(f"stagger={steps} starts warpgroup 1 after warpgroup 0: the kernel needs warps=8 (besides "
                           f"a producer warpgroup), got {consumers.value.data}", loc)  # type: ignore[attr-defined]
        if PINGPONG_ATTR in fn.attributes:
            raise TkcError(f"stagger={steps} and pingpong=1 both use the warpgroups' turn barriers: choose one", loc)
        if CONSUMER_WARPS not in fn.attributes:
            raise TkcError(f"stagger={steps} needs a producer warpgroup (producer=1 or 2): without one the consumers "
                           "refill the ring, and warpgroup 0 would wait for loads that warpgroup 1 issues only once "
                           "it has started (a hang)", loc)
        if kernel_stages(fn, None) <= steps:
            raise TkcError(f"stagger={steps} needs a ring of more than {steps} stages (warpgroup 0 runs {steps} "
                           f"steps, and step 0 if peeled, before warpgroup 1 releases any), got "
                           f"{kernel_stages(fn, None)}", loc)
        loops = wgmma_loops(fn, f"stagger={steps}")
        if len(loops) != 1:
            raise TkcError(f"stagger={steps}: the kernel must have one loop with wgmmas, got {len(loops)}", loc)
        _stagger(loops[0], steps)


@register("stagger-warpgroups", "warpgroup 1 starts N key steps after warpgroup 0, so their tile ends differ (stagger=N)")
class StaggerWarpgroups(ModulePass):
    name = "stagger-warpgroups"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        stagger_warpgroups(op)
