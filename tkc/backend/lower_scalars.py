"""Scalars → `ptx` ops: arith and math on i32 / f32 / i1 (folded where both sides are immediates; division by a
constant without a division), grid and warp indices, a tensor's sizes. Registered with lowering.py's dispatch.

    %q = arith.floordivsi %i, %c4 : i32
becomes
    %q = "ptx.op"(%i) <{opcode = "shr.s32", immediates = ["2"], ...}> : (!ptx.regs<b32, 1>) -> !ptx.regs<b32, 1>
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from xdsl.dialects import arith, math, scf
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, i1
from xdsl.ir import Block, Operation, SSAValue

from tkc.backend import ptx
from tkc.backend.index import Leaf
from tkc.errors import TkcError
from tkc.ir import ops as t
from tkc.passes.util import constant_int
from tkc.backend.lowering import LN2, LOG2E, Imm, KernelLowering, _log2, _udiv_by_constant, handles


_INT_OPS = {
    arith.AddiOp: "add.s32",
    arith.SubiOp: "sub.s32",
    arith.MuliOp: "mul.lo.s32",
    arith.DivSIOp: "div.s32",
    arith.RemSIOp: "rem.s32",
    arith.DivUIOp: "div.u32",
    arith.RemUIOp: "rem.u32",
    arith.MaxSIOp: "max.s32",
    arith.MinSIOp: "min.s32",
    arith.ShLIOp: "shl.b32",
    arith.ShRSIOp: "shr.s32",
    arith.AndIOp: "and.b32",
    arith.OrIOp: "or.b32",
    arith.XOrIOp: "xor.b32",
}
_FLOAT_OPS = {
    arith.AddfOp: "add.f32",
    arith.SubfOp: "sub.f32",
    arith.MulfOp: "mul.f32",
    arith.DivfOp: "div.rn.f32",
    arith.MaximumfOp: "max.f32",
    arith.MinimumfOp: "min.f32",
}
_FLOAT_UNARY = {
    arith.NegfOp: "neg.f32",
    math.Exp2Op: "ex2.approx.ftz.f32",
    math.Log2Op: "lg2.approx.ftz.f32",
    math.SqrtOp: "sqrt.rn.f32",
    math.RsqrtOp: "rsqrt.approx.ftz.f32",
    math.TanhOp: "tanh.approx.f32",
    math.AbsFOp: "abs.f32",
    math.AbsIOp: "abs.s32",
}
_CMP = {"eq": "eq", "ne": "ne", "slt": "lt", "sle": "le", "sgt": "gt", "sge": "ge",
        "oeq": "eq", "une": "neu", "olt": "lt", "ole": "le", "ogt": "gt", "oge": "ge"}


def _wrap32(value: int) -> int:
    return (value + 2**31) % 2**32 - 2**31


_INT_FOLD: dict[type, Callable[[int, int], int]] = {
    arith.AddiOp: lambda a, b: a + b,
    arith.SubiOp: lambda a, b: a - b,
    arith.MuliOp: lambda a, b: a * b,
    arith.FloorDivSIOp: lambda a, b: a // b,
    arith.CeilDivSIOp: lambda a, b: -(-a // b),
    arith.DivSIOp: lambda a, b: int(a / b),
    arith.RemSIOp: lambda a, b: a - int(a / b) * b,
    arith.DivUIOp: lambda a, b: (a % 2**32) // (b % 2**32),
    arith.RemUIOp: lambda a, b: (a % 2**32) % (b % 2**32),
    arith.MaxSIOp: max,
    arith.MinSIOp: min,
    arith.ShLIOp: lambda a, b: a << b,
    arith.ShRSIOp: lambda a, b: a >> b,
    arith.AndIOp: lambda a, b: a & b,
    arith.OrIOp: lambda a, b: a | b,
    arith.XOrIOp: lambda a, b: a ^ b,
}
_FLOAT_FOLD: dict[type, Callable[[Any, Any], Any]] = {
    arith.AddfOp: lambda a, b: a + b,
    arith.SubfOp: lambda a, b: a - b,
    arith.MulfOp: lambda a, b: a * b,
    arith.DivfOp: lambda a, b: a / b,
    arith.MaximumfOp: lambda a, b: np.fmax(a, b),
    arith.MinimumfOp: lambda a, b: np.fmin(a, b),
}


def _fold_int(op: Operation, a: int, b: int) -> int | None:
    fn = _INT_FOLD.get(type(op))
    if fn is None or (b == 0 and type(op) in (arith.FloorDivSIOp, arith.CeilDivSIOp, arith.DivSIOp, arith.RemSIOp,
                                              arith.DivUIOp, arith.RemUIOp)):
        return None
    return _wrap32(fn(a, b))


@handles(arith.ConstantOp)
def _lower_constant(lw: KernelLowering, op: arith.ConstantOp) -> list[Any]:
    value = op.value
    if isinstance(value, IntegerAttr):
        if value.type == i1:
            return [Imm(bool(value.value.data), "pred")]
        return [Imm(int(value.value.data))]
    if isinstance(value, FloatAttr):
        return [Imm(float(value.value.data))]
    raise TkcError(f"cannot lower constant {value}")


@handles(*_INT_OPS, arith.FloorDivSIOp, arith.CeilDivSIOp)
def _lower_int(lw: KernelLowering, op: Operation) -> list[Any]:
    a, b = (lw.value(o) for o in op.operands)
    if op.results[0].type == i1:
        if isinstance(a, Imm) and isinstance(b, Imm):
            fn = {arith.AndIOp: lambda x, y: x and y, arith.OrIOp: lambda x, y: x or y, arith.XOrIOp: lambda x, y: x != y}
            return [Imm(bool(fn[type(op)](a.value, b.value)), "pred")]
        opcode = {arith.AndIOp: "and.pred", arith.OrIOp: "or.pred", arith.XOrIOp: "xor.pred"}[type(op)]
        return [lw.op(opcode, "pred", lw.reg(a, "pred") if isinstance(a, Imm) else a, b)]
    if isinstance(a, Imm) and isinstance(b, Imm):
        folded = _fold_int(op, int(a.value), int(b.value))
        if folded is not None:
            return [Imm(folded)]
    if isinstance(op, arith.FloorDivSIOp):
        shift = _log2(b.value) if isinstance(b, Imm) else None
        if shift is not None:
            return [lw.op("shr.s32", "b32", lw.reg(a), Imm(shift))]
        if not isinstance(b, Imm) and non_negative(op.operands[0]) and non_negative(op.operands[1]):
            return [lw.op("div.u32", "b32", lw.reg(a), b)]  # a tile index by a count: no sign fix-ups
        return [_floordiv(lw, lw.reg(a), b)]
    if isinstance(op, arith.CeilDivSIOp):
        if isinstance(b, Imm) and b.value > 0:
            shifted = lw.op("add.s32", "b32", lw.reg(a), Imm(b.value - 1))
            shift = _log2(b.value)
            if shift is not None:
                return [lw.op("shr.s32", "b32", shifted, Imm(shift))]
            return [_floordiv(lw, shifted, b)]
        neg = lw.op("neg.s32", "b32", lw.reg(a))
        return [lw.op("neg.s32", "b32", _floordiv(lw, neg, b))]
    if isinstance(op, arith.DivUIOp | arith.RemUIOp) and isinstance(b, Imm):
        divided = _udiv_by_constant(lw, lw.reg(a), b.value, remainder=isinstance(op, arith.RemUIOp))
        if divided is not None:
            return [divided]
    return [lw.op(_INT_OPS[type(op)], "b32", lw.reg(a), b)]


_NON_NEGATIVE_OPS = (t.BlockIdxOp, t.NumBlocksOp, t.DimOp, t.WarpIdOp, t.WarpgroupIdOp, t.ClusterRankOp)
_CLOSED_OPS = (arith.AddiOp, arith.MuliOp, arith.FloorDivSIOp, arith.CeilDivSIOp, arith.DivUIOp, arith.RemUIOp,
               arith.MinSIOp)  # non-negative when all their operands are


def non_negative(value: SSAValue, depth: int = 0) -> bool:
    """Is this i32 value never negative: built from grid indices and counts, tensor sizes and non-negative
    constants by +, ·, division, % and min, or the index of a loop from a non-negative start by a positive step? Then
    Python's floor division by it is an unsigned one (a persistent kernel's tile index by its query blocks)."""
    if depth > 32:
        return False
    owner = value.owner
    if isinstance(owner, Block):
        loop = owner.parent_op()
        return (isinstance(loop, scf.ForOp) and value is owner.args[0] and non_negative(loop.lb, depth + 1)
                and non_negative(loop.step, depth + 1))
    if isinstance(owner, arith.ConstantOp):
        return (constant_int(value) or 0) >= 0
    if isinstance(owner, _NON_NEGATIVE_OPS):
        return True
    if isinstance(owner, arith.MaxSIOp):
        return any(non_negative(v, depth + 1) for v in owner.operands)
    if isinstance(owner, arith.SubiOp):  # Python's a % b as the frontend spells it, a - (a // b)·b: of a, b ≥ 0
        product = owner.rhs.owner
        quotient = product.lhs.owner if isinstance(product, arith.MuliOp) else None
        return (isinstance(quotient, arith.FloorDivSIOp) and quotient.lhs is owner.lhs
                and quotient.rhs is product.rhs and non_negative(owner.lhs, depth + 1)
                and non_negative(quotient.rhs, depth + 1))
    return isinstance(owner, _CLOSED_OPS) and all(non_negative(v, depth + 1) for v in owner.operands)


def _floordiv(lw: KernelLowering, a: SSAValue, b: Any) -> SSAValue:
    """Python's floor division on s32: truncate, then step down when the remainder's sign differs."""
    q = lw.op("div.s32", "b32", a, b)
    r = lw.op("rem.s32", "b32", a, b)
    nonzero = lw.op("setp.ne.s32", "pred", r, Imm(0))
    sign = lw.op("xor.b32", "b32", r, b)
    negative = lw.op("setp.lt.s32", "pred", sign, Imm(0))
    adjust = lw.op("and.pred", "pred", nonzero, negative)
    return lw.op("selp.b32", "b32", lw.op("sub.s32", "b32", q, Imm(1)), q, adjust)


@handles(*_FLOAT_OPS)
def _lower_float(lw: KernelLowering, op: Operation) -> list[Any]:
    a, b = (lw.value(o) for o in op.operands)
    if isinstance(a, Imm) and isinstance(b, Imm):
        with np.errstate(all="ignore"):
            return [Imm(float(np.float32(_FLOAT_FOLD[type(op)](np.float32(a.value), np.float32(b.value)))))]
    if isinstance(op, arith.DivfOp) and isinstance(b, Imm) and b.value and np.frexp(b.value)[0] in (0.5, -0.5):
        return [lw.op("mul.f32", "b32", lw.reg(a), Imm(1.0 / b.value))]  # by a power of two: exact, and no slow path
    return [lw.op(_FLOAT_OPS[type(op)], "b32", lw.reg(a), b)]


@handles(*_FLOAT_UNARY, math.ExpOp, math.LogOp)
def _lower_float_unary(lw: KernelLowering, op: Operation) -> list[Any]:
    x = lw.reg(lw.value(op.operands[0]))
    if isinstance(op, math.ExpOp):
        return [lw.op("ex2.approx.ftz.f32", "b32", lw.op("mul.f32", "b32", x, Imm(LOG2E)))]
    if isinstance(op, math.LogOp):
        return [lw.op("mul.f32", "b32", lw.op("lg2.approx.ftz.f32", "b32", x), Imm(LN2))]
    return [lw.op(_FLOAT_UNARY[type(op)], "b32", x)]


@handles(arith.CmpiOp, arith.CmpfOp)
def _lower_cmp(lw: KernelLowering, op: arith.CmpiOp | arith.CmpfOp) -> list[Any]:
    a, b = (lw.value(o) for o in op.operands)
    names = arith.CMPI_COMPARISON_OPERATIONS if isinstance(op, arith.CmpiOp) else arith.CMPF_COMPARISON_OPERATIONS
    pred = names[op.predicate.value.data]
    if pred not in _CMP:
        raise TkcError(f"comparison {pred} is not supported")
    if isinstance(op, arith.CmpiOp) and op.lhs.type == i1:
        if pred not in ("eq", "ne"):
            raise TkcError("booleans compare only with == and !=")
        x = lw.op("xor.pred", "pred", lw.reg(a, "pred"), lw.reg(b, "pred"))
        return [x if pred == "ne" else lw.op("not.pred", "pred", x)]
    kind = "s32" if isinstance(op, arith.CmpiOp) else "f32"
    return [lw.op(f"setp.{_CMP[pred]}.{kind}", "pred", lw.reg(a), b)]


@handles(arith.SelectOp)
def _lower_select(lw: KernelLowering, op: arith.SelectOp) -> list[Any]:
    c, x, y = (lw.value(o) for o in op.operands)
    if isinstance(c, Imm):
        return [x if c.value else y]
    if op.result.type == i1:
        return [lw.op("or.pred", "pred", lw.op("and.pred", "pred", c, lw.reg(x, "pred")),
                      lw.op("and.pred", "pred", lw.op("not.pred", "pred", c), lw.reg(y, "pred")))]
    return [lw.op("selp.b32", "b32", lw.reg(x), lw.reg(y), c)]


@handles(arith.SIToFPOp)
def _lower_sitofp(lw: KernelLowering, op: arith.SIToFPOp) -> list[Any]:
    x = lw.value(op.input)
    if isinstance(x, Imm):
        return [Imm(float(x.value))]
    return [lw.op("cvt.rn.f32.s32", "b32", x)]


@handles(arith.FPToSIOp)
def _lower_fptosi(lw: KernelLowering, op: arith.FPToSIOp) -> list[Any]:
    return [lw.op("cvt.rzi.s32.f32", "b32", lw.reg(lw.value(op.input)))]


def _lower_special(name: str) -> Callable[[KernelLowering, Operation], list[Any]]:
    def lower(lw: KernelLowering, op: Operation) -> list[Any]:
        dim = "xyz"[op.dim.value.data]  # type: ignore[attr-defined]
        return [lw.emit(ptx.SpecialOp(f"%{name}.{dim}")).results[0]]

    return lower


handles(t.BlockIdxOp)(_lower_special("ctaid"))
handles(t.NumBlocksOp)(_lower_special("nctaid"))


@handles(t.WarpIdOp)
def _lower_warp_id(lw: KernelLowering, op: Operation) -> list[Any]:
    return [lw.thread_env["warp"]]


def cluster_rank(lw: KernelLowering) -> Any:
    """This block's rank in its cluster (`%cluster_ctarank`, read once at entry); 0 without clusters."""
    if lw.cluster == 1:
        return Imm(0)
    return lw.at_entry("cluster_rank", lambda: lw.emit(ptx.SpecialOp("%cluster_ctarank")).results[0])


@handles(t.ClusterRankOp)
def _lower_cluster_rank(lw: KernelLowering, op: Operation) -> list[Any]:
    return [cluster_rank(lw)]


@handles(t.WarpgroupIdOp)
def _lower_warpgroup_id(lw: KernelLowering, op: Operation) -> list[Any]:
    return [lw.expr(Leaf("warp") >> 2)]  # from the broadcast warp index: warp-uniform to ptxas


@handles(t.DimOp)
def _lower_dim(lw: KernelLowering, op: t.DimOp) -> list[Any]:
    return [lw.value(op.source).dims[op.index.value.data]]

