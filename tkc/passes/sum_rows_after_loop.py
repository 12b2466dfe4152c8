"""sum-rows-after-loop: a loop-carried sum of row sums adds up its lanes' parts once, after the loop (`late_sums=1`).

A row_sum of a register tile adds each lane's elements of a row, then the lanes that share the row exchange their
parts (two butterfly shuffles and adds in the mma/wgmma layouts). FlashAttention's l is such a sum, carried by the
key loop: every step scales it by the row's correction and adds the step's row sums. Scaling and adding are as
good per lane as per row (the correction is the same in every lane of a row), so the lanes can keep their own
parts through the loop and exchange them once after it. The row_sum is marked `tkc.partial` (its lowering skips
the exchange) and a `tile.finish_row_sum` after the loop does it. The carried value must start at 0 and go only
through multiplications by a vector or scalar and the additions of the row sums; otherwise the loop is left alone.

    %l0 = tile.fill 0.0 : !tile.rv<16xf32>
    %l = scf.for ... iter_args(%acc = %l0) {
      %scaled = tile.mul %acc, %correction : !tile.rv<16xf32>
      %sums = tile.row_sum %p : !tile.rt<16x128xf32> -> !tile.rv<16xf32>
      %next = tile.add %scaled, %sums : !tile.rv<16xf32>
      scf.yield %next
    }
    %o = tile.div_row %acc_o, %l
becomes
    %l = scf.for ... iter_args(%acc = %l0) {
      ...
      %sums = tile.row_sum %p {tkc.partial} : !tile.rt<16x128xf32> -> !tile.rv<16xf32>
      ...
    }
    %l_all = tile.finish_row_sum %l : !tile.rv<16xf32>
    %o = tile.div_row %acc_o, %l_all

The interpreter reads a partial row_sum as the whole row's sum and finish_row_sum as the identity (the parts are
the lowering's), so the pass keeps the interpreter's results exactly; the PTX simulation checks the lanes.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects import func, scf
from xdsl.dialects.builtin import ModuleOp, UnitAttr
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from tkc.ir import ops as t
from tkc.ir.types import RegVecType
from tkc.passes import register

LATE_SUMS_ATTR = "tkc.late_sums"
MUL, ADD = t.BINARY_OPS["mul"], t.BINARY_OPS["add"]


def _only_use(value: SSAValue) -> Operation | None:
    uses = list(value.uses)
    return uses[0].operation if len(uses) == 1 else None


def _row_sums_added(loop: scf.ForOp, index: int) -> list[t.ReduceOp] | None:
    """The row_sums whose results the loop's carried value `index` adds up, if that is all it does: from the block
    argument, a chain of single-use multiplications (by anything else) and additions of a row_sum (used only there)
    to the yield; None otherwise."""
    body = loop.body.block
    value: SSAValue = body.args[1 + index]
    sums: list[t.ReduceOp] = []
    while True:
        user = _only_use(value)
        if isinstance(user, scf.YieldOp):
            return sums if user.parent_block() is body and user.operands[index] is value and sums else None
        if not isinstance(user, MUL | ADD) or user.parent_block() is not body:
            return None
        other = user.operands[1] if user.operands[0] is value else user.operands[0]
        if other is value:
            return None
        if isinstance(user, ADD):
            reduce = other.owner
            if not (isinstance(reduce, t.ReduceOp) and reduce.fn == "sum" and reduce.axis == "row"
                    and reduce.acc is None and _only_use(other) is user and t.PARTIAL not in reduce.attributes):
                return None
            sums.append(reduce)
        value = user.result


def holds_partial_sums(value: SSAValue) -> bool:
    """Does `value` hold lanes' parts of row sums (a partial row_sum, or what a loop carries from one, before its
    finish_row_sum)? Such a vector must not be moved between layouts: a relayout takes a row's value from one lane,
    a part here (assign-layouts refuses it)."""
    pending, seen = [value], set()
    while pending:
        v = pending.pop()
        if v in seen:
            continue
        seen.add(v)
        owner = v.owner
        if isinstance(owner, t.ReduceOp) and t.PARTIAL in owner.attributes:
            return True
        if isinstance(owner, MUL | ADD):
            pending.extend(o for o in owner.operands if isinstance(o.type, RegVecType))
        elif isinstance(owner, scf.ForOp):
            index = v.index  # type: ignore[attr-defined]
            pending.append(owner.body.block.last_op.operands[index])  # type: ignore[union-attr]
        elif isinstance(owner, Block) and isinstance(owner.parent_op(), scf.ForOp) and v.index > 0:  # type: ignore[attr-defined]
            pending.append(owner.last_op.operands[v.index - 1])  # type: ignore[union-attr, attr-defined]
    return False


def _starts_at_zero(value: SSAValue) -> bool:
    return isinstance(value.owner, t.FillOp) and value.owner.fill_value == 0.0


def sum_rows_after_loop(module: ModuleOp) -> None:
    for fn in module.walk():
        if not (isinstance(fn, func.FuncOp) and LATE_SUMS_ATTR in fn.attributes):
            continue
        for loop in [op for op in fn.walk() if isinstance(op, scf.ForOp)]:
            for index, (init, result) in enumerate(zip(loop.iter_args, loop.results)):
                if not (isinstance(result.type, RegVecType) and _starts_at_zero(init)):
                    continue
                sums = _row_sums_added(loop, index)
                if sums is None:
                    continue
                for reduce in sums:
                    reduce.attributes[t.PARTIAL] = UnitAttr()
                if not result.uses:
                    continue
                finished = t.FinishRowSumOp(result)
                Rewriter.insert_op(finished, InsertPoint.after(loop))
                result.replace_uses_with_if(finished.result, lambda use: use.operation is not finished)


@register("sum-rows-after-loop", "a loop-carried sum of row sums exchanges its lanes' parts once, after the loop")
class SumRowsAfterLoop(ModulePass):
    name = "sum-rows-after-loop"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        sum_rows_after_loop(op)
