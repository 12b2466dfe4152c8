"""unroll-overlapped-loop: run two steps per iteration of a loop whose next-step wgmma result is carried (defer=1
with overlap=1), so that the carried accumulator alternates between two register sets instead of being copied.

With defer=1 and overlap=1 a step issues S_{j+1} while its softmax still reads S_j (carried in): the two are live
at once, so the yield copies S_{j+1} into the carried registers (one move per register a step: 32 at D=64 with
64-key steps, ~10% of the step's instructions). Here the body is cloned twice per iteration (the second copy at
j + step, fed by the first's yields), the loop steps by two, and an odd last step runs after it (in an if): the
second copy's S_{j+2} is written while the first copy's S_j is no longer live, so ptxas gives them the same
registers and the copy disappears. Semantics do not change (the interpreter runs the same steps in order).

    scf.for %j = %lb to %ub step %s iter_args(%a = %a0) { body(%j, %a) ; scf.yield %y } {tkc.unroll2}
becomes
    %trips = ceildiv(%ub - %lb, %s) ; %ub2 = %lb + (%trips / 2) · 2 · %s
    %r = scf.for %j = %lb to %ub2 step 2·%s iter_args(%a = %a0) {
      body(%j, %a) -> %y1 ; body(%j + %s, %y1) -> %y2 ; scf.yield %y2
    }
    %out = scf.if (%trips odd) { body(%lb + (%trips - 1)·%s, %r) -> %y ; scf.yield %y } else { scf.yield %r }
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects import arith, scf
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i32
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from tkc.passes import register
from tkc.passes.util import clone_into

UNROLL2 = "tkc.unroll2"  # on a loop that defer-wgmma left carrying a wgmma result issued in the step


def _clone_body(body: Block, iv: SSAValue, args: list[SSAValue], into: Block) -> list[SSAValue]:
    """The body's ops cloned at the end of `into` with the induction variable `iv` and the carried values `args`;
    returns what the clone yields."""
    yield_op = body.last_op
    assert isinstance(yield_op, scf.YieldOp)
    mapping = clone_into(list(body.ops)[:-1], into, {body.args[0]: iv, **dict(zip(body.args[1:], args))})
    return [mapping.get(v, v) for v in yield_op.operands]


def unroll_by_two(loop: scf.ForOp) -> None:
    body = loop.body.block
    pre: list[Operation] = [
        span := arith.SubiOp(loop.ub, loop.lb), trips := arith.CeilDivSIOp(span, loop.step),
        c1 := arith.ConstantOp(IntegerAttr(1, i32)), c2 := arith.ConstantOp(IntegerAttr(2, i32)),
        pairs := arith.DivSIOp(trips, c2), step2 := arith.MuliOp(loop.step, c2),
        covered := arith.MuliOp(pairs, step2), ub2 := arith.AddiOp(loop.lb, covered),
    ]
    Rewriter.insert_op(pre, InsertPoint.before(loop))
    new_body = Block(arg_types=[a.type for a in body.args])
    first = _clone_body(body, new_body.args[0], list(new_body.args[1:]), new_body)
    second_iv = arith.AddiOp(new_body.args[0], loop.step)
    new_body.add_op(second_iv)
    second = _clone_body(body, second_iv.result, first, new_body)
    new_body.add_op(scf.YieldOp(*second))
    unrolled = scf.ForOp(loop.lb, ub2.result, step2.result, list(loop.iter_args), Region(new_body))
    unrolled.attributes |= {k: v for k, v in loop.attributes.items() if k != UNROLL2}
    unrolled.location = loop.location
    Rewriter.insert_op(unrolled, InsertPoint.before(loop))

    odd = [rem := arith.RemSIOp(trips, c2), is_odd := arith.CmpiOp(rem, c1, "eq"),
           last_k := arith.SubiOp(trips, c1), offset := arith.MuliOp(last_k, loop.step),
           last_iv := arith.AddiOp(loop.lb, offset)]
    then = Block()
    then.add_op(scf.YieldOp(*_clone_body(body, last_iv.result, list(unrolled.results), then)))
    rest = scf.IfOp(is_odd.result, [r.type for r in loop.results], Region(then),
                    Region(Block([scf.YieldOp(*unrolled.results)])))
    rest.location = loop.location
    Rewriter.insert_op([*odd, rest], InsertPoint.after(unrolled))
    for old, new in zip(loop.results, rest.results):
        old.replace_all_uses_with(new)
    loop.detach()
    loop.erase()


def unroll_overlapped_loops(module: ModuleOp) -> None:
    for loop in [op for op in module.walk() if isinstance(op, scf.ForOp) and UNROLL2 in op.attributes]:
        unroll_by_two(loop)


@register("unroll-overlapped-loop", "two steps per iteration where defer=1 with overlap=1 carries S (no copy)")
class UnrollOverlappedLoop(ModulePass):
    name = "unroll-overlapped-loop"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        unroll_overlapped_loops(op)
