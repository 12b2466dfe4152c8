"""peel-deferred-step: run the first step of a `defer-wgmma` loop before the loop, without its P·V (`defer=2`).

defer-wgmma's step j issues S_j, then O += P_{j-1}·V_{j-1}; at step 0 that P·V multiplies a zero P (it adds 0 but
takes the tensor cores as long as any other: 1/65 of a 32-step tile's wgmma work, 1/33 of a 16-step one). Here
step 0 runs before the loop, if the loop runs at all: its S_0, the wait for it alone (nothing else is in flight),
its softmax and whatever else the step does (a refill of the ring included), with the carried values as they
enter the loop and the P·V left out (its result is the accumulator it would add to). The loop then starts at step
1; its step index still counts from the loop's old start, so rings, masks and the P·V after the loop see the same
steps. The tile IR's result is bit for bit the same (O + 0·V = O).

    scf.for %j = %lb to %ub step %c1 iter_args(%o = %o0, %p = %zero) {
      %s = tile.wgmma_ABt %q, %k_s, %z {tkc.deferred}
      %o1 = tile.wgmma_AB %p, %v_prev, %o {tkc.deferred}
      tile.wgmma_wait 1
      ... softmax: %p1 ...
      scf.yield %o1', %p1
    }
becomes
    %o_1, %p_1 = scf.if (%lb < %ub) {
      %s = tile.wgmma_ABt %q, %k_s(step 0), %z {tkc.deferred}
      tile.wgmma_wait 0
      ... softmax: %p1 ...  (with %o0 for %o1)
      scf.yield %o1', %p1
    } else { scf.yield %o0, %zero }
    scf.for %j = %lb + %c1 to %ub step %c1 iter_args(%o = %o_1, %p = %p_1) { ...as before... }
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, UnitAttr
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import is_side_effect_free

from tkc.ir import ops as t
from tkc.passes import register
from tkc.passes.defer_wgmma import DEFERRED
from tkc.passes.insert_tma_pipeline import step_index, step_start
from tkc.passes.util import constant_int as _constant
from tkc.passes.util import erase_while, unused

PEEL_ATTR = "tkc.peel"  # on a kernel with defer=2
PEELED = "tkc.peeled_step"  # on the if that runs a loop's step 0 before it

_FOLD = {
    arith.AddiOp: lambda a, b: a + b,
    arith.SubiOp: lambda a, b: a - b,
    arith.MuliOp: lambda a, b: a * b,
    arith.DivUIOp: lambda a, b: a // b if b > 0 and a >= 0 else None,
    arith.RemUIOp: lambda a, b: a % b if b > 0 and a >= 0 else None,
}
_COMPARE = {"slt": lambda a, b: a < b, "sgt": lambda a, b: a > b, "eq": lambda a, b: a == b,
            "sge": lambda a, b: a >= b, "sle": lambda a, b: a <= b, "ne": lambda a, b: a != b}


def _folded(op: Operation) -> Operation | None:
    """A constant for an integer op whose operands are constants (the step index of step 0 and what follows from
    it: ring steps, the refill's step, whether a step before it exists), so that the peeled step's ring steps read as
    the numbers they are."""
    values = [_constant(v) for v in op.operands]
    if None in values or not op.results:
        return None
    if type(op) in _FOLD:
        folded = _FOLD[type(op)](*values)
        return None if folded is None else arith.ConstantOp(IntegerAttr(folded, op.results[0].type))
    if isinstance(op, arith.CmpiOp):
        name = arith.CMPI_COMPARISON_OPERATIONS[op.predicate.value.data]
        if name in _COMPARE:
            return arith.ConstantOp(IntegerAttr(int(_COMPARE[name](*values)), op.results[0].type))
    return None


def _peel(loop: scf.ForOp) -> None:
    body = loop.body.block
    start = step_start(loop)
    deferred = [op for op in body.ops if isinstance(op, t.WgmmaOp) and DEFERRED in op.attributes]
    pv = deferred[-1]  # P·V of the step before: its A is the carried P

    then = Block()
    mapping: dict[SSAValue, SSAValue] = {body.args[0]: start}
    mapping.update(zip(body.args[1:], loop.iter_args))
    yield_op = body.last_op
    assert isinstance(yield_op, scf.YieldOp)
    for op in body.ops:
        if op is yield_op:
            continue
        if op is pv:
            mapping[pv.results[0]] = mapping.get(pv.c, pv.c)  # step 0's P is zero: O as it enters
            continue
        if isinstance(op, arith.AddiOp | arith.SubiOp) and _constant(mapping.get(op.rhs, op.rhs)) == 0:
            mapping[op.result] = mapping.get(op.lhs, op.lhs)  # the ring's step base + 0: the base itself
            continue
        if op.name == "tile.wgmma_wait":
            clone: Operation = _wait_for_all(op)
        else:
            clone = op.clone(value_mapper=mapping)
            folded = _folded(clone)
            if folded is not None:
                clone.erase()
                clone = folded
        then.add_op(clone)
        mapping.update(zip(op.results, clone.results))
    then.add_op(scf.YieldOp(*[mapping.get(v, v) for v in yield_op.operands]))
    _drop_dead(then)

    runs = arith.CmpiOp(start, loop.ub, "slt")
    peeled = scf.IfOp(runs, [v.type for v in loop.iter_args], Region(then),
                      Region(Block([scf.YieldOp(*loop.iter_args)])))
    peeled.location = loop.location
    peeled.attributes[PEELED] = UnitAttr()
    second = arith.AddiOp(start, loop.step)
    Rewriter.insert_op([runs, peeled, second], InsertPoint.before(loop))
    loop.operands = [second.result, loop.ub, loop.step, *peeled.results]


def _wait_for_all(wait: Operation) -> Operation:
    """The peeled step's waits leave nothing running: S_0 is its only wgmma (the loop's `wait 1` let P·V run on)."""
    return type(wait)(0)


def _drop_dead(block: Block) -> None:
    """Remove what the peeled step computes and does not use (the previous stage's V, the release of step -1)."""
    erase_while(block, lambda op: (isinstance(op, scf.IfOp) and _constant(op.cond) == 0 and not op.results)
                or (unused(op) and is_side_effect_free(op)))


def peel_deferred_steps(module: ModuleOp) -> None:
    for fn in module.walk():
        if not (isinstance(fn, func.FuncOp) and PEEL_ATTR in fn.attributes):
            continue
        for loop in [op for op in fn.walk() if isinstance(op, scf.ForOp)]:
            gemms = [op for op in loop.body.block.ops if isinstance(op, t.WgmmaOp) and DEFERRED in op.attributes]
            if len(gemms) >= 2 and step_index(loop) is not None:
                _peel(loop)


@register("peel-deferred-step", "run a defer-wgmma loop's first step before it, without its zero P·V")
class PeelDeferredStep(ModulePass):
    name = "peel-deferred-step"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        peel_deferred_steps(op)
