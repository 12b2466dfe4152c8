"""overlap-wgmma: issue the next step's first wgmma before this step's work on the last one's result (kernels with
`overlap=1`, sm_90a).

In attention, step j computes S_j = Q·K_jᵀ, then the softmax on S_j, then O += P_j·V_j. The softmax cannot start
before S_j is done, and the tensor cores idle while it runs. Here the loop is rotated by one wgmma: S_0 is
computed before the loop, and step j issues S_{j+1} first (its K block loaded one step ahead), then works on S_j,
carried from the step before. The lowering leaves S_{j+1} running (a wgmma whose result only goes to the next
step is waited for by the step's later wgmma), so it overlaps the softmax. The last step computes one S past the
loop's end on K rows past the tensor's end (read as zeros) and drops it.

Rotated: the first wgmma of the body whose A and accumulator come from outside the loop and whose B is a shared
tile loaded in the loop at indices computed from the loop index.

    scf.for %j = %lb to %ub step %c1 iter_args(...) {
      %k = tile.load %K[%b, %h, %j, %c0]
      %s = tile.wgmma_ABt %q, %k, %zero
      ... uses of %s ...
    }
becomes
    %k0 = tile.load %K[%b, %h, %lb, %c0]
    %s0 = tile.wgmma_ABt %q, %k0, %zero
    scf.for %j = %lb to %ub step %c1 iter_args(..., %s = %s0) {
      %j1 = arith.addi %j, %c1
      %k = tile.load %K[%b, %h, %j1, %c0]
      %s_next = tile.wgmma_ABt %q, %k, %zero
      ... uses of %s ...
      scf.yield ..., %s_next
    }
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from tkc.errors import SourceLoc, TkcError
from tkc.ir import ops as t
from tkc.ir.types import SharedTileType
from tkc.passes import register
from tkc.passes.insert_async_pipeline import _index_slice
from tkc.passes.util import defined_in, wgmma_loops, with_one_more_carried

OVERLAP_ATTR = "tkc.overlap"


def _candidate(loop: scf.ForOp) -> tuple[t.WgmmaOp, t.LoadOp, list[Operation]] | None:
    """The loop's first top-level wgmma, if it can be issued a step early: (wgmma, the load of its B, the ops to
    clone with it: those that compute that load's indices, and the accumulator's fill if the body makes it)."""
    body = loop.body.block
    gemm = next((op for op in body.ops if isinstance(op, t.WgmmaOp)), None)
    if gemm is None or defined_in(gemm.a, loop):
        return None
    fill = [] if not defined_in(gemm.c, loop) else [gemm.c.owner]
    if fill and not (isinstance(fill[0], t.FillOp) and not fill[0].operands):
        return None
    load = gemm.b.owner
    if not (isinstance(load, t.LoadOp) and load.parent_block() is body and isinstance(load.result.type, SharedTileType)
            and len(list(load.result.uses)) == 1 and not defined_in(load.source, loop)):
        return None
    index_ops = _index_slice(load, loop)
    if index_ops is None:
        return None
    return gemm, load, [*fill, *index_ops]


def _clone_at(ops: list[Operation], iv: SSAValue, at: SSAValue, point: InsertPoint) -> dict[SSAValue, SSAValue]:
    """Clones of `ops` (in order) at `point`, the loop index replaced by `at`; the value mapping."""
    mapping: dict[SSAValue, SSAValue] = {iv: at}
    for op in ops:
        clone = op.clone(value_mapper=mapping)
        Rewriter.insert_op(clone, point)
        for old, new in zip(op.results, clone.results):
            mapping[old] = new
    return mapping


def _rotate(loop: scf.ForOp) -> None:
    found = _candidate(loop)
    if found is None:
        raise TkcError("overlap=1: the loop's first wgmma must take A and its accumulator from outside the loop and "
                       "B from a shared tile loaded in the loop at indices computed from the loop index",
                       SourceLoc.from_attr(loop.location))
    gemm, load, index_ops = found
    body = loop.body.block
    iv = body.args[0]
    # before the loop: step lb's load and wgmma
    first = _clone_at([*index_ops, load, gemm], iv, loop.lb, InsertPoint.before(loop))
    # in the loop: the load and wgmma for the next step, first thing
    ahead = arith.AddiOp(iv, loop.step)
    Rewriter.insert_op(ahead, InsertPoint.at_start(body))
    nxt = _clone_at([*index_ops, load, gemm], iv, ahead.result, InsertPoint.after(ahead))
    # the loop carries the result: uses of this step's wgmma now read the carried one
    carried = body.insert_arg(gemm.result.type, len(body.args))
    gemm.result.replace_all_uses_with(carried)
    yield_op = body.last_op
    assert isinstance(yield_op, scf.YieldOp)
    yield_op.operands = [*yield_op.operands, nxt[gemm.result]]
    for op in (gemm, load, *reversed(index_ops)):
        if op in (gemm, load) or not any(r.uses for r in op.results):
            op.detach()
            op.erase()
    with_one_more_carried(loop, first[gemm.result])


def overlap_wgmma(module: ModuleOp) -> None:
    for fn in module.walk():
        if not (isinstance(fn, func.FuncOp) and OVERLAP_ATTR in fn.attributes):
            continue
        for loop in wgmma_loops(fn, "overlap=1"):
            _rotate(loop)


@register("overlap-wgmma", "issue the next step's first wgmma before this step's work on its result (overlap=1)")
class OverlapWgmma(ModulePass):
    name = "overlap-wgmma"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        overlap_wgmma(op)
