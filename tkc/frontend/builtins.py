"""What each name of `tkc.lang` (and the Python builtins and operators that work on tiles) emits.

Each implementation takes the code generator and the evaluated arguments (Python values or SSA values), checks
what the op verifier cannot phrase for a kernel author, and emits tile / arith / math ops.
"""

from __future__ import annotations

import ast
import math as pymath
from collections.abc import Callable
from typing import Any

from xdsl.dialects import arith, math
from xdsl.dialects.builtin import ArrayAttr, Float32Type, IntegerAttr, UnitAttr, i32
from xdsl.ir import SSAValue

from tkc import lang
from tkc.errors import TkcError
from tkc.frontend.codegen import CodeGen
from tkc.frontend.values import (
    BoundMethod,
    GlShape,
    describe,
    is_bool,
    is_float,
    is_global,
    is_int,
    is_register,
    is_runtime,
    is_shared,
)
from tkc.ir import ops as t
from tkc.ir.types import INDEX_TYPES, GlobalType, RegTileType, RegVecType, SharedTileType
from tkc.targets import get_target

IMPLS: dict[lang.DslOp, Callable[..., Any]] = {}
PY_BUILTIN_IMPLS: dict[Any, Callable[..., Any]] = {}


def implements(*ops: lang.DslOp) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            IMPLS[op] = fn
        return fn

    return register


def _spec(value: Any, what: str, kinds: tuple[str, ...] = ("rt", "st", "rv", "sv")) -> lang.TileSpec:
    if not isinstance(value, lang.TileSpec) or value.kind not in kinds:
        wanted = " or ".join(f"{k}[...]" for k in kinds)
        raise TkcError(f"{what} must be a type like {wanted}, got {describe(value)}")
    return value


def _number(value: Any, what: str) -> float:
    if is_runtime(value) or not isinstance(value, int | float):
        raise TkcError(f"{what} must be a compile-time number, got {describe(value)}")
    return float(value)


def _register(value: Any, what: str) -> SSAValue:
    if is_register(value):
        return value
    if is_shared(value):
        raise TkcError(f"{what} must be in registers; load the shared tile first with `load(...)`")
    raise TkcError(f"{what} must be a register tile or vector, got {describe(value)}")


def _reg_tile(value: Any, what: str) -> SSAValue:
    value = _register(value, what)
    if not isinstance(value.type, RegTileType):
        raise TkcError(f"{what} must be a register tile, got {describe(value)}")
    return value


# --------------------------------------------------------------------------------------------------------------
# Indices


@implements(lang.block_idx)
def _block_idx(cg: CodeGen) -> tuple[SSAValue, ...]:
    return tuple(cg.emit_value(t.BlockIdxOp(d)) for d in range(3))


@implements(lang.num_blocks)
def _num_blocks(cg: CodeGen) -> tuple[SSAValue, ...]:
    return tuple(cg.emit_value(t.NumBlocksOp(d)) for d in range(3))


@implements(lang.warp_id)
def _warp_id(cg: CodeGen) -> SSAValue:
    return cg.emit_value(t.WarpIdOp())


@implements(lang.warpgroup_id)
def _warpgroup_id(cg: CodeGen) -> SSAValue:
    return cg.emit_value(t.WarpgroupIdOp())


@implements(lang.cluster_rank)
def _cluster_rank(cg: CodeGen) -> SSAValue | int:
    return cg.emit_value(t.ClusterRankOp()) if cg.cluster > 1 else 0


@implements(lang.cdiv)
def _cdiv(cg: CodeGen, a: Any, b: Any) -> Any:
    if not is_runtime(a) and not is_runtime(b):
        if not isinstance(a, int) or not isinstance(b, int):
            raise TkcError(f"cdiv takes integers, got {describe(a)} and {describe(b)}")
        if b == 0:
            raise TkcError(f"cdiv({a}, 0): division by zero")
        return -(-a // b)
    if not is_runtime(b) and b == 0:
        raise TkcError("cdiv(..., 0): division by zero")
    return cg.emit_value(arith.CeilDivSIOp(cg.as_i32(a, "cdiv's numerator"), cg.as_i32(b, "cdiv's divisor")))


# --------------------------------------------------------------------------------------------------------------
# Fills


def _fill(cg: CodeGen, spec: Any, value: float, name: str) -> SSAValue:
    return cg.emit_value(t.FillOp(value, _spec(spec, f"{name}'s argument").ir))


@implements(lang.zeros)
def _zeros(cg: CodeGen, spec: Any) -> SSAValue:
    return _fill(cg, spec, 0.0, "zeros")


@implements(lang.ones)
def _ones(cg: CodeGen, spec: Any) -> SSAValue:
    return _fill(cg, spec, 1.0, "ones")


@implements(lang.neg_infty)
def _neg_infty(cg: CodeGen, spec: Any) -> SSAValue:
    return _fill(cg, spec, -pymath.inf, "neg_infty")


@implements(lang.pos_infty)
def _pos_infty(cg: CodeGen, spec: Any) -> SSAValue:
    return _fill(cg, spec, pymath.inf, "pos_infty")


@implements(lang.full)
def _full(cg: CodeGen, spec: Any, value: Any) -> SSAValue:
    return _fill(cg, spec, _number(value, "full's value"), "full")


@implements(lang.empty)
def _empty(cg: CodeGen, spec: Any, buffers: Any = 1) -> SSAValue:
    if buffers not in (1, 2) or isinstance(buffers, bool):
        raise TkcError(f"empty's buffers must be 1 or 2 (a compile-time number), got {describe(buffers)}")
    if buffers == 2 and not cg.for_loops:
        raise TkcError("empty(..., buffers=2) takes its two buffers in turn over a loop's steps: call it in a loop")
    return cg.emit_value(t.EmptyOp(_spec(spec, "empty's argument", ("st", "sv")).ir, buffers))


# --------------------------------------------------------------------------------------------------------------
# Elementwise

_SCALAR_MATH = {
    "exp": (math.ExpOp, pymath.exp),
    "exp2": (math.Exp2Op, lambda x: 2.0**x),
    "log": (math.LogOp, pymath.log),
    "log2": (math.Log2Op, pymath.log2),
    "sqrt": (math.SqrtOp, pymath.sqrt),
    "rsqrt": (math.RsqrtOp, lambda x: 1.0 / pymath.sqrt(x)),
    "tanh": (math.TanhOp, pymath.tanh),
}


def _unary(name: str) -> Callable[..., Any]:
    def impl(cg: CodeGen, x: Any) -> Any:
        if is_register(x):
            return cg.emit_value(t.UNARY_OPS[name](x))
        if name == "copy":
            return x
        if name == "relu":
            return _max(cg, x, 0.0)
        scalar_op, py_fn = _SCALAR_MATH[name]
        if not is_runtime(x):
            try:
                return py_fn(_number(x, f"{name}'s argument"))
            except (ValueError, OverflowError) as e:
                raise TkcError(f"{name}({x!r}): {e}") from None
        if is_int(x) or is_float(x):
            return cg.emit_value(scalar_op(cg.as_f32(x, f"{name}'s argument")))
        raise TkcError(f"{name} takes a register tile, vector or scalar, got {describe(x)}")

    return impl


for _name in ("exp", "exp2", "log", "log2", "relu", "sqrt", "rsqrt", "tanh", "copy"):
    IMPLS[getattr(lang, _name)] = _unary(_name)


def tile_binary(cg: CodeGen, fn: str, lhs: Any, rhs: Any) -> SSAValue:
    """tile ⊕ tile or tile ⊕ scalar (either order)."""
    for side in (lhs, rhs):
        if is_shared(side) or is_global(side):
            raise TkcError(f"{fn}: {describe(side)} is not in registers; load it first with `load(...)`")
    if is_register(lhs) and is_register(rhs):
        lt, rt_ = lhs.type, rhs.type
        if isinstance(lt, RegTileType) != isinstance(rt_, RegTileType):
            raise TkcError(
                f"{fn}: {describe(lhs)} and {describe(rhs)}: combine a tile with a vector using "
                f"{fn}_row (one element per row) or {fn}_col (one per column)"
            )
        if lt.shape != rt_.shape:  # type: ignore[attr-defined]
            raise TkcError(f"{fn}: shape mismatch: {describe(lhs)} and {describe(rhs)}; elementwise ops take one shape")
        if lt.element_type != rt_.element_type:  # type: ignore[attr-defined]
            raise TkcError(
                f"{fn}: dtype mismatch: {describe(lhs)} and {describe(rhs)}; convert one first, "
                f"e.g. `x.to({lang.dtype_of(rt_.element_type).name})`"  # type: ignore[attr-defined]
            )
        return cg.emit_value(t.BINARY_OPS[fn](lhs, rhs))
    if is_register(lhs):
        return cg.emit_value(t.BINARY_OPS[fn](lhs, cg.as_f32(rhs, f"{fn}'s scalar operand")))
    return cg.emit_value(t.BINARY_OPS[fn](cg.as_f32(lhs, f"{fn}'s scalar operand"), rhs))


def _named_binary(fn: str) -> Callable[..., Any]:
    def impl(cg: CodeGen, a: Any, b: Any) -> Any:
        if is_register(a) or is_register(b):
            return tile_binary(cg, fn, a, b)
        op = {"add": ast.Add, "sub": ast.Sub, "mul": ast.Mult, "div": ast.Div}[fn]()
        return cg.binary(op, a, b)

    return impl


for _name in ("add", "sub", "mul", "div"):
    IMPLS[getattr(lang, _name)] = _named_binary(_name)

_INT_BINOPS = {
    ast.Add: arith.AddiOp,
    ast.Sub: arith.SubiOp,
    ast.Mult: arith.MuliOp,
    ast.FloorDiv: arith.FloorDivSIOp,
    ast.LShift: arith.ShLIOp,
    ast.RShift: arith.ShRSIOp,
    ast.BitAnd: arith.AndIOp,
    ast.BitOr: arith.OrIOp,
    ast.BitXor: arith.XOrIOp,
}
_FLOAT_BINOPS = {ast.Add: arith.AddfOp, ast.Sub: arith.SubfOp, ast.Mult: arith.MulfOp, ast.Div: arith.DivfOp}


def scalar_binary(cg: CodeGen, op: type[ast.operator], lhs: Any, rhs: Any) -> SSAValue:
    for side in (lhs, rhs):
        if is_runtime(side) and not (is_int(side) or is_float(side) or is_bool(side)):
            raise TkcError(f"arithmetic on {describe(side)} needs a register tile; load it first")
        if not is_runtime(side) and not isinstance(side, int | float):
            raise TkcError(f"cannot combine {describe(lhs)} and {describe(rhs)}")
    if is_bool(lhs) and is_bool(rhs) and op in (ast.BitAnd, ast.BitOr, ast.BitXor):
        return cg.emit_value(_INT_BINOPS[op](lhs, rhs))
    floating = op is ast.Div or any(is_float(s) or isinstance(s, float) for s in (lhs, rhs))
    if floating:
        if op not in _FLOAT_BINOPS:
            raise TkcError(f"operator {_symbol(op)} is not defined on run-time floats")
        a, b = cg.as_f32(lhs, "an operand"), cg.as_f32(rhs, "an operand")
        return cg.emit_value(_FLOAT_BINOPS[op](a, b))
    a, b = cg.as_i32(lhs, "an operand"), cg.as_i32(rhs, "an operand")
    if op is ast.Mod:  # Python's modulo: the result takes the divisor's sign
        q = cg.emit_value(arith.FloorDivSIOp(a, b))
        return cg.emit_value(arith.SubiOp(a, cg.emit_value(arith.MuliOp(q, b))))
    if op not in _INT_BINOPS:
        raise TkcError(f"operator {_symbol(op)} is not defined on run-time integers")
    return cg.emit_value(_INT_BINOPS[op](a, b))


def _symbol(op: type[ast.operator]) -> str:
    from tkc.frontend.codegen import _OP_SYMBOLS

    return f"`{_OP_SYMBOLS.get(op, op.__name__)}`"


def unary_operator(cg: CodeGen, op: type[ast.unaryop], x: SSAValue) -> SSAValue:
    if op is ast.UAdd:
        return x
    if is_register(x):
        if op is ast.USub:
            return cg.emit_value(t.UNARY_OPS["neg"](x))
        raise TkcError(f"this operator is not defined on {describe(x)}")
    if op is ast.Not:
        cond = cg.as_condition(x)
        return cg.emit_value(arith.XOrIOp(cond, cg.constant(True)))
    if op is ast.USub:
        if is_float(x):
            return cg.emit_value(arith.NegfOp(x))
        if is_int(x):
            return cg.emit_value(arith.SubiOp(cg.constant(0), x))
    if op is ast.Invert and is_int(x):
        return cg.emit_value(arith.XOrIOp(x, cg.constant(-1)))
    raise TkcError(f"this operator is not defined on {describe(x)}")


def compare(cg: CodeGen, op: type[ast.cmpop], lhs: Any, rhs: Any) -> SSAValue:
    from tkc.frontend.codegen import _CMPF, _CMPI

    for side in (lhs, rhs):
        if is_register(side) or is_shared(side) or is_global(side):
            raise TkcError(f"tiles cannot be compared; got {describe(side)}")
    if op not in _CMPI:
        raise TkcError("only == != < <= > >= compare run-time values")
    if any(is_float(s) or isinstance(s, float) for s in (lhs, rhs)):
        a, b = cg.as_f32(lhs, "an operand"), cg.as_f32(rhs, "an operand")
        return cg.emit_value(arith.CmpfOp(a, b, _CMPF[op]))
    if is_bool(lhs) or is_bool(rhs):
        a, b = cg.as_runtime(lhs), cg.as_runtime(rhs)
        if a.type != b.type:
            raise TkcError(f"cannot compare {describe(lhs)} with {describe(rhs)}")
        return cg.emit_value(arith.CmpiOp(a, b, _CMPI[op]))
    a, b = cg.as_i32(lhs, "an operand"), cg.as_i32(rhs, "an operand")
    return cg.emit_value(arith.CmpiOp(a, b, _CMPI[op]))


# Python builtins on run-time values


def _max_min(fn: str) -> Callable[..., Any]:
    def impl(cg: CodeGen, *args: Any) -> Any:
        if len(args) == 1:
            (x,) = args
            if is_register(x) and isinstance(x.type, RegVecType):
                return cg.emit_value(t.VECTOR_REDUCE_OPS[fn](x))
            if is_register(x):
                raise TkcError(f"{fn}() of a whole tile: use row_{fn} or col_{fn}")
            raise TkcError(f"{fn}() of one argument takes a register vector, got {describe(x)}")
        if not args:
            raise TkcError(f"{fn}() expects arguments")
        result = args[0]
        for other in args[1:]:
            result = _pairwise(cg, fn, result, other)
        return result

    return impl


def _pairwise(cg: CodeGen, fn: str, a: Any, b: Any) -> Any:
    if not is_runtime(a) and not is_runtime(b):
        return max(a, b) if fn == "max" else min(a, b)
    if is_register(a) or is_register(b):
        return tile_binary(cg, fn, a, b)
    if any(is_float(s) or isinstance(s, float) for s in (a, b)):
        op = arith.MaximumfOp if fn == "max" else arith.MinimumfOp
        return cg.emit_value(op(cg.as_f32(a, "an operand"), cg.as_f32(b, "an operand")))
    op = arith.MaxSIOp if fn == "max" else arith.MinSIOp
    return cg.emit_value(op(cg.as_i32(a, "an operand"), cg.as_i32(b, "an operand")))


def _max(cg: CodeGen, a: Any, b: Any) -> Any:
    return _pairwise(cg, "max", a, b)


def _abs(cg: CodeGen, x: Any) -> Any:
    if is_register(x):
        return cg.emit_value(t.UNARY_OPS["abs"](x))
    if is_float(x):
        return cg.emit_value(math.AbsFOp(x))
    if is_int(x):
        return cg.emit_value(math.AbsIOp(x))
    raise TkcError(f"abs() is not defined on {describe(x)}")


def _sum(cg: CodeGen, x: Any) -> Any:
    if is_register(x) and isinstance(x.type, RegVecType):
        return cg.emit_value(t.VECTOR_REDUCE_OPS["sum"](x))
    if is_register(x):
        raise TkcError("sum() of a whole tile: use row_sum or col_sum")
    raise TkcError(f"sum() takes a register vector, got {describe(x)}")


def _float(cg: CodeGen, x: Any) -> Any:
    return cg.as_f32(x, "float()'s argument")


def _int(cg: CodeGen, x: Any) -> Any:
    if is_int(x):
        return x
    if is_float(x):
        return cg.emit_value(arith.FPToSIOp(x, i32))
    raise TkcError(f"int() is not defined on {describe(x)}")


PY_BUILTIN_IMPLS.update({max: _max_min("max"), min: _max_min("min"), abs: _abs, sum: _sum, float: _float, int: _int})


# --------------------------------------------------------------------------------------------------------------
# Broadcasts and reductions


def _row_col_binary(fn: str, axis: str) -> Callable[..., Any]:
    def impl(cg: CodeGen, tile: Any, vec: Any) -> SSAValue:
        tile = _reg_tile(tile, f"{fn}_{axis}'s tile")
        if not (is_register(vec) and isinstance(vec.type, RegVecType)):
            raise TkcError(f"{fn}_{axis} takes a register vector as its second argument, got {describe(vec)}")
        return cg.emit_value(t.BROADCAST_BINARY_OPS[(fn, axis)](tile, vec))

    return impl


for _fn in ("add", "sub", "mul", "div"):
    for _axis in ("row", "col"):
        IMPLS[getattr(lang, f"{_fn}_{_axis}")] = _row_col_binary(_fn, _axis)


def _broadcast(axis: str) -> Callable[..., Any]:
    def impl(cg: CodeGen, vec: Any, spec: Any) -> SSAValue:
        if not (is_register(vec) and isinstance(vec.type, RegVecType)):
            raise TkcError(f"broadcast_{axis} takes a register vector, got {describe(vec)}")
        result = _spec(spec, f"broadcast_{axis}'s type", ("rt",)).ir
        op = t.BroadcastRowOp if axis == "row" else t.BroadcastColOp
        return cg.emit_value(op(vec, result))

    return impl


IMPLS[lang.broadcast_row] = _broadcast("row")
IMPLS[lang.broadcast_col] = _broadcast("col")


def _reduce(fn: str, axis: str) -> Callable[..., Any]:
    def impl(cg: CodeGen, tile: Any, acc: Any = None) -> SSAValue:
        tile = _reg_tile(tile, f"{axis}_{fn}'s argument")
        rows, cols = tile.type.shape
        result = RegVecType(tile.type.element_type, rows if axis == "row" else cols)
        if acc is not None:
            acc = _register(acc, f"{axis}_{fn}'s accumulator")
            if acc.type != result:
                raise TkcError(f"{axis}_{fn}: the accumulator must be {result.spec()}, got {describe(acc)}")
        return cg.emit_value(t.REDUCE_OPS[(fn, axis)](tile, result, acc))

    return impl


for _fn in t.REDUCE_FUNCTIONS:
    for _axis in ("row", "col"):
        IMPLS[getattr(lang, f"{_axis}_{_fn}")] = _reduce(_fn, _axis)


# --------------------------------------------------------------------------------------------------------------
# Layout, masking, conversion


@implements(lang.transpose)
def _transpose(cg: CodeGen, tile: Any) -> SSAValue:
    tile = _reg_tile(tile, "transpose's argument")
    rows, cols = tile.type.shape
    return cg.emit_value(t.TransposeOp(tile, RegTileType(tile.type.element_type, cols, rows)))


def _triangle(op: type[t.TriangleOp], name: str) -> Callable[..., Any]:
    def impl(cg: CodeGen, tile: Any, diagonal: Any = 0, fill: Any = 0.0) -> SSAValue:
        tile = _reg_tile(tile, f"{name}'s tile")
        return cg.emit_value(op(tile, cg.as_i32(diagonal, f"{name}'s diagonal"), _number(fill, f"{name}'s fill")))

    return impl


IMPLS[lang.tril] = _triangle(t.TrilOp, "tril")
IMPLS[lang.triu] = _triangle(t.TriuOp, "triu")
_keep_cols = _triangle(t.KeepColsOp, "keep_cols")


@implements(lang.keep_cols)
def _keep_cols_impl(cg: CodeGen, tile: Any, n: Any, fill: Any = -pymath.inf) -> SSAValue:
    return _keep_cols(cg, tile, n, fill)


IMPLS[lang.keep_rows] = _triangle(t.KeepRowsOp, "keep_rows")


@implements(lang.make_causal)
def _make_causal(cg: CodeGen, tile: Any, fill: Any = -pymath.inf) -> SSAValue:
    return IMPLS[lang.tril](cg, tile, 0, fill)


@implements(lang.convert)
def _convert(cg: CodeGen, x: Any, dtype: Any) -> SSAValue:
    x = _register(x, "the value to convert")
    if not isinstance(dtype, lang.DType):
        raise TkcError(f"convert to a dtype (bf16, f16, f32), got {describe(dtype)}")
    if x.type.element_type == dtype.ir:
        return x
    return cg.emit_value(t.ConvertOp(x, x.type.with_element(dtype.ir)))


# --------------------------------------------------------------------------------------------------------------
# Matrix multiply


def _mma(name: str) -> Callable[..., Any]:
    def impl(cg: CodeGen, a: Any, b: Any, c: Any) -> SSAValue:
        wg_name = "wg" + name
        shared = isinstance(getattr(b, "type", None), SharedTileType) and \
            isinstance(getattr(a, "type", None), SharedTileType | RegTileType)
        if shared and wg_name in t.WGMMA_OPS and get_target(cg.target).sm >= 90:
            # B in shared memory: the warpgroup's wgmma (sm_90a), A from shared memory or each warp's registers
            transposed = name.startswith("mma_At")
            if isinstance(a.type, SharedTileType) and a.type.shape[int(transposed)] != t.WgmmaOp.ROWS:
                want = "st[bf16, K, 64]" if transposed else "st[bf16, 64, K]"
                raise TkcError(f"{name} of shared tiles is a warpgroup's wgmma, whose A is {want}, got "
                               f"{describe(a)}; for a warp's mma.sync the operands must be in registers: load them")
            if transposed and isinstance(a.type, RegTileType):
                raise TkcError(f"{name} with B in shared memory is a warpgroup's wgmma, whose transposed A must be a "
                               f"shared tile st[bf16, K, 64], got {describe(a)}")
            return cg.emit_value(t.WGMMA_OPS[wg_name](a, b, _reg_tile(c, f"{name}'s accumulator C")))
        a, b, c = (_reg_tile(v, f"{name}'s {w}") for v, w in ((a, "A"), (b, "B"), (c, "accumulator C")))
        return cg.emit_value(t.MMA_OPS[name](a, b, c))

    return impl


def _mm(name: str) -> Callable[..., Any]:
    def impl(cg: CodeGen, a: Any, b: Any) -> SSAValue:
        a, b = _reg_tile(a, f"{name}'s A"), _reg_tile(b, f"{name}'s B")
        m = a.type.shape[1] if name.startswith("mm_At") else a.type.shape[0]
        n = b.type.shape[0] if name.endswith("Bt") else b.type.shape[1]
        acc = cg.emit_value(t.FillOp(0.0, RegTileType(lang.f32.ir, m, n)))
        return cg.emit_value(t.MMA_OPS["mma" + name[2:]](a, b, acc))

    return impl


for _name in t.MMA_OPS:
    IMPLS[getattr(lang, _name)] = _mma(_name)
    IMPLS[getattr(lang, "mm" + _name[3:])] = _mm("mm" + _name[3:])


# --------------------------------------------------------------------------------------------------------------
# Memory


class _RowsIndex:
    """`rows(r)`: a row index in rows, not tiles (only in the row place of a global load or store); `rows(r, end)`:
    rows from `end` on are out."""

    def __init__(self, value: Any, end: Any = None):
        self.value = value
        self.end = end


@implements(lang.rows)
def _rows(cg: CodeGen, n: Any, end: Any = None) -> _RowsIndex:
    return _RowsIndex(n, None if end is None else cg.as_i32(end, "rows(r, end)'s end"))


class _RowsAt(_RowsIndex):
    """`rows_at(I, r)`: rows I[r], I[r + 1], ... (only in the row place of a register tile's global load, store or
    atomic_add, or of a load into a shared tile); `rows_at(I, r, end)`: up to I[end - 1]."""

    def __init__(self, index: SSAValue, first: Any, end: Any = None):
        super().__init__(first, end)
        self.index = index


@implements(lang.rows_at)
def _rows_at(cg: CodeGen, index: Any, first: Any, end: Any = None) -> _RowsAt:
    if not (is_global(index) and index.type.element_type in INDEX_TYPES and index.type.rank == 1):
        raise TkcError(f"rows_at's index must be a global tensor gl[i32, 1] or gl[i64, 1] of row numbers, got "
                       f"{describe(index)}")
    return _RowsAt(index, first, None if end is None else cg.as_i32(end, "rows_at(I, r, end)'s end"))


def _indices(cg: CodeGen, index: Any, count: int, what: str) -> list[SSAValue]:
    if index is None:
        raise TkcError(f"{what} needs an index with {count} entries")
    if not isinstance(index, tuple | list):
        index = (index,)
    if len(index) != count:
        raise TkcError(f"{what} takes {count} indices, got {len(index)}")
    if any(isinstance(i, _RowsIndex) for i in index):
        raise TkcError(f"{what}: rows(...) is for a global tensor's row index of a 2-D tile or a register vector")
    return [cg.as_i32(i, f"{what}'s index") for i in index]


def _global_indices(cg: CodeGen, index: Any, gtype: GlobalType, tile: Any, what: str,
                    by_row_numbers: bool = False) -> tuple[list[SSAValue], bool]:
    """A global load/store's index values, and whether its row index is rows(r) (allowed in the row place, the
    second-to-last, of a 2-D tile's index only; rows_at(I, r) too where `by_row_numbers`: a register tile's, or a
    shared tile's load)."""
    if gtype.element_type in INDEX_TYPES:
        raise TkcError(f"{what}: integer tensors hold arrive_last's counters and rows_at's row numbers; tiles load "
                       "from and store into bf16, f16, f32 and fp8 tensors")
    # the row place: a 2-D tile's second-to-last index; a register vector's last (its elements are rows' values)
    rows_place = gtype.rank - 2 if len(tile.shape) == 2 else gtype.rank - 1 if isinstance(tile, RegVecType) else None
    entries = list(index) if isinstance(index, tuple | list) else [index]
    in_rows = rows_place is not None and len(entries) == gtype.rank and isinstance(entries[rows_place], _RowsIndex)
    if any(isinstance(i, _RowsAt) for i in entries) and not (in_rows and by_row_numbers):
        raise TkcError(f"{what}: rows_at(...) picks the rows of a register tile's load, store or atomic_add, or of a "
                       f"load into a shared tile (not multicast), in the row place of its index (index {gtype.rank - 2})")
    if in_rows:
        entries[rows_place] = entries[rows_place].value
    elif any(isinstance(i, _RowsIndex) for i in entries) and rows_place is not None:
        raise TkcError(f"{what}: rows(...) goes in the row place of a global tensor's index (index {rows_place})")
    return _indices(cg, None if index is None else entries, gtype.rank, what), in_rows


def _marked(op: Any, in_rows: bool) -> Any:
    if in_rows:
        op.attributes[t.ROWS_ATTR] = UnitAttr()
    return op


@implements(lang.load)
def _load(cg: CodeGen, src: Any, index: Any = None, spec: Any = None, multicast: Any = False,
          rank: Any = None, conflicts: Any = 1, repeat: Any = 1) -> SSAValue:
    if isinstance(index, lang.TileSpec) and spec is None:
        index, spec = None, index
    conflicts = _conflicts(conflicts, "load", shared=is_shared(src))
    if repeat != 1:
        _check_repeat(src, spec, repeat)
    if rank is not None:
        return _cluster_load(cg, src, index, spec, rank, conflicts)
    group = _multicast_group(cg, multicast)
    if is_global(src):
        if spec is None:
            raise TkcError(f"load from {src.type.spec()} needs the type to load: `load(G, index, rt[bf16, 16, 64])`")
        spec = _spec(spec, "load's type (its third argument)")
        gtype: GlobalType = src.type
        what = f"load from {gtype.spec()}"
        gathers = spec.kind in ("rt", "st") and not multicast
        indices, in_rows = _global_indices(cg, index, gtype, spec.ir, what, gathers)
        load = _marked(t.LoadOp(src, indices, spec.ir, _row_numbers_of(index) if gathers else None,
                                _rows_end_of(index, spec.ir, what, load=not multicast)), in_rows)
        if repeat != 1:
            load.attributes[t.REPEAT_COLS] = IntegerAttr(repeat, 64)
        if multicast:
            if spec.kind != "st":
                raise TkcError(f"multicast=True shares a copy into shared memory between the blocks of a cluster; "
                               f"{what} into {spec} stays in this block's registers")
            if group is not None:  # (without clusters, or a group of one: a plain load)
                size, stride = group
                load.attributes[t.MULTICAST] = (UnitAttr() if size == cg.cluster else
                                                ArrayAttr([IntegerAttr(size, 64), IntegerAttr(stride, 64)]))
        return cg.emit_value(load)
    if multicast:
        raise TkcError("multicast=True is for loads from a global tensor into a shared tile")
    if is_shared(src):
        reg_kind = "rt" if isinstance(src.type, SharedTileType) else "rv"
        # from a shared tile: a register sub-tile, or (st) a view of some of its rows
        spec, indices = _from_shared(cg, src, index, spec, (reg_kind, "st") if reg_kind == "rt" else (reg_kind,))
        return cg.emit_value(_expecting(t.LoadOp(src, indices, spec.ir), conflicts))
    if is_register(src):
        raise TkcError(f"{describe(src)} is already in registers")
    raise TkcError(f"load's source must be a global tensor or a shared tile, got {describe(src)}")


def _rows_end_of(index: Any, tile: Any, what: str, load: bool = False) -> SSAValue | None:
    """The end of rows(r, end) / rows_at(I, r, end) in a load's / store's index (None without one): for a register
    tile's rows, or (`load`) a shared tile's."""
    entries = index if isinstance(index, tuple | list) else (index,)
    end = next((i.end for i in entries if isinstance(i, _RowsIndex) and i.end is not None), None)
    if end is not None and not isinstance(tile, RegTileType | RegVecType | SharedTileType if load else
                                          RegTileType | RegVecType):
        raise TkcError(f"{what}: an end to the rows (rows(r, end), rows_at(I, r, end)) cuts a register tile's or "
                       f"vector's load or store, or a load into a shared tile, short; not {tile.spec()}'s")
    return end


def _row_numbers_of(index: Any) -> SSAValue | None:
    """The index tensor of rows_at(I, r) in a load's / store's index (None without it; _global_indices checked its
    place)."""
    entries = index if isinstance(index, tuple | list) else (index,)
    return next((i.index for i in entries if isinstance(i, _RowsAt)), None)


def _check_repeat(src: Any, spec: Any, repeat: Any) -> None:
    """`load(G, index, rt[f32, R, C], repeat=2)`: columns of G each spread over 2 adjacent columns of the tile."""
    if isinstance(repeat, bool) or not isinstance(repeat, int) or is_runtime(repeat) or repeat != 2:
        raise TkcError(f"load's repeat must be 2 (or 1), got {describe(repeat)}")
    spec = _spec(spec, "load's type (its third argument)") if spec is not None else None
    if not is_global(src) or spec is None or spec.kind != "rt" or spec.dtype.name != "f32":
        raise TkcError(f"load(..., repeat={repeat}) reads a global tensor into an f32 register tile "
                       f"(`load(G, index, rt[f32, 16, 64], repeat={repeat})`)")
    if spec.ir.shape[1] % (16 * repeat):
        raise TkcError(f"load(..., repeat={repeat}) into {spec} reads {spec.ir.shape[1]}/{repeat} columns: make "
                       f"the tile a multiple of {16 * repeat} columns wide")


@implements(lang.rotate_pairs)
def _rotate_pairs(cg: CodeGen, tile: Any) -> SSAValue:
    tile = _reg_tile(tile, "rotate_pairs's tile")
    if not isinstance(tile.type.element_type, Float32Type):
        raise TkcError(f"rotate_pairs takes an f32 tile, got {describe(tile)}: `.to(f32)` first")
    return cg.emit_value(t.RotatePairsOp(tile))


def _multicast_group(cg: CodeGen, multicast: Any) -> tuple[int, int] | None:
    """A load's `multicast`: False, True (every block of the cluster) or (size, stride) (the `size` blocks of ranks
    r0 + i·stride, the group of this block: e.g. in a cluster of 4 taking 2×2 tiles, (2, 1) the blocks of one row
    of tiles, (2, 2) those of one column); the blocks sharing it as (size, stride), None for a plain load."""
    if isinstance(multicast, tuple) and len(multicast) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and not is_runtime(v) for v in multicast):
        size, stride = multicast
        if size < 1 or stride < 1 or cg.cluster % (size * stride):
            raise TkcError(f"multicast={multicast} names the {size} blocks r0 + i·{stride} of a cluster of "
                           f"{cg.cluster}: size and stride must be positive and size·stride divide the cluster")
        return (size, stride) if size > 1 else None
    if is_runtime(multicast) or not isinstance(multicast, bool | int):
        raise TkcError(f"load's multicast must be True, False or (size, stride) when the kernel is compiled, got "
                       f"{describe(multicast)}")
    return (cg.cluster, 1) if multicast and cg.cluster > 1 else None


def _from_shared(cg: CodeGen, src: Any, index: Any, spec: Any, kinds: tuple[str, ...]) -> tuple[Any, list[SSAValue]]:
    """The type (the whole shared tile's in registers where none is given; one of `kinds`) and the indices of a
    load from the shared tile or vector `src` (all zeros where the load takes all of it)."""
    stype = src.type
    if spec is None:
        spec = lang.TileSpec(kinds[0], lang.dtype_of(stype.element_type), stype.shape)
    spec = _spec(spec, "load's type", kinds)
    if index is None:
        if spec.shape != stype.shape:
            raise TkcError(f"loading {spec} out of {stype.spec()} needs the sub-tile's index")
        index = (0,) * len(stype.shape)
    return spec, _indices(cg, index, len(stype.shape), f"load from {stype.spec()}")


def _cluster_load(cg: CodeGen, src: Any, index: Any, spec: Any, rank: Any, conflicts: int = 1) -> SSAValue:
    """`load(s, index, rt[...], rank=r)`: a register sub-tile of block r's copy of the shared tile s (`conflicts`:
    the bank conflicts expected where the cluster is one block, and this a plain shared load)."""
    if not is_shared(src) or not isinstance(src.type, SharedTileType):
        raise TkcError(f"load(..., rank=r) reads a shared tile of another block of the cluster, got {describe(src)}")
    spec, indices = _from_shared(cg, src, index, spec, ("rt",))
    if cg.cluster == 1:  # the only block of its cluster
        return cg.emit_value(_expecting(t.LoadOp(src, indices, spec.ir), conflicts))
    if cg.shared_written.get(src, cg.cluster_syncs) == cg.cluster_syncs:
        raise TkcError("load(..., rank=r) reads another block's copy of this shared tile: call cluster_sync() "
                       "after the blocks' last store into it, and before this load")
    if not is_runtime(rank) and isinstance(rank, int) and not isinstance(rank, bool) and not 0 <= rank < cg.cluster:
        raise TkcError(f"load's rank must be a block of the cluster (0 to {cg.cluster - 1}), got {rank}")
    rank = cg.as_i32(rank, "load's rank")
    cg.cluster_reads[cg.shared_root.get(src, src)] = (cg.cluster_syncs, cg.loc())
    return cg.emit_value(t.ClusterLoadOp(src, indices, rank, spec.ir))


@implements(lang.cluster_sync)
def _cluster_sync(cg: CodeGen) -> None:
    if cg.runtime_branches:
        raise TkcError("cluster_sync: every warp of the cluster must reach it, so it cannot be inside a run-time `if`")
    cg.emit(t.ClusterSyncOp() if cg.cluster > 1 else t.BarrierOp())
    cg.cluster_syncs += 1


def _conflicts(conflicts: Any, what: str, shared: bool) -> int:
    """A load's or store's `conflicts`: the bank conflicts its author expects of this shared access."""
    if is_runtime(conflicts) or isinstance(conflicts, bool) or not isinstance(conflicts, int) or conflicts < 1:
        raise TkcError(f"{what}'s `conflicts` must be a compile-time whole number ≥ 1, got {describe(conflicts)}")
    if conflicts > 1 and not shared:
        raise TkcError(f"{what}'s `conflicts` is about shared memory banks; this {what} is not from or into a shared "
                       "tile")
    return conflicts


def _expecting(op: Any, conflicts: int) -> Any:
    """`op` marked with the bank conflicts its author expects (assign-swizzles then warns only of worse)."""
    if conflicts > 1:
        op.attributes[t.CONFLICTS_ATTR] = IntegerAttr(conflicts, 64)
    return op


@implements(lang.store)
def _store(cg: CodeGen, dst: Any, src: Any, index: Any = None, conflicts: Any = 1) -> SSAValue | None:
    if is_global(src) or (is_register(dst) and not is_register(src)):
        raise TkcError("store(dst, src, index): the destination comes first")
    if is_global(dst):
        if not (is_register(src) or is_shared(src)):
            raise TkcError(f"store's source must be a tile or vector, got {describe(src)}")
        _conflicts(conflicts, "store", shared=False)
        gtype: GlobalType = dst.type
        scatters = isinstance(src.type, RegTileType)
        indices, in_rows = _global_indices(cg, index, gtype, src.type, f"store into {gtype.spec()}", scatters)
        what = f"store into {gtype.spec()}"
        cg.emit(_marked(t.StoreOp(src, dst, indices, _row_numbers_of(index) if scatters else None,
                                  _rows_end_of(index, src.type, what)), in_rows))
        return None
    if is_shared(dst):
        src = _register(src, "the value stored into shared memory")
        stype = dst.type
        if index is None:
            if src.type.shape != stype.shape:
                raise TkcError(f"storing {describe(src)} into {stype.spec()} needs the sub-tile's index")
            index = (0,) * len(stype.shape)
        insert = t.InsertOp(src, dst, _indices(cg, index, len(stype.shape), f"store into {stype.spec()}"))
        return cg.emit_value(_expecting(insert, _conflicts(conflicts, "store", shared=True)))
    raise TkcError(f"store's destination must be a global tensor or a shared tile, got {describe(dst)}")


@implements(lang.atomic_add)
def _atomic_add(cg: CodeGen, dst: Any, src: Any, index: Any) -> None:
    if not is_global(dst):
        raise TkcError(f"atomic_add(dst, src, index) adds into a global tensor, got {describe(dst)}")
    src = _reg_tile(src, "atomic_add's value")
    gtype: GlobalType = dst.type
    if src.type.element_type != lang.f32.ir or gtype.element_type != lang.f32.ir:
        raise TkcError(f"atomic_add adds an f32 tile into an f32 tensor, got {describe(src)} into {gtype.spec()}")
    indices, in_rows = _global_indices(cg, index, gtype, src.type, f"atomic_add into {gtype.spec()}", True)
    cg.emit(_marked(t.AtomicAddOp(src, dst, indices, _row_numbers_of(index),
                                  _rows_end_of(index, src.type, f"atomic_add into {gtype.spec()}")), in_rows))


@implements(lang.arrive_last)
def _arrive_last(cg: CodeGen, counter: Any, index: Any, arrivals: Any) -> SSAValue:
    if not is_global(counter) or counter.type.element_type != lang.i32.ir or counter.type.rank != 1:
        raise TkcError(f"arrive_last counts in an int32 global tensor of rank 1 (gl[i32, 1]), got {describe(counter)}")
    if cg.runtime_branches:
        raise TkcError("arrive_last: every warp of the block must reach it, so it cannot be inside a run-time `if`")
    return cg.emit_value(t.ArriveLastOp(counter, cg.as_i32(index, "arrive_last's index"),
                                        cg.as_i32(arrivals, "arrive_last's arrivals")))


@implements(lang.barrier)
def _barrier(cg: CodeGen) -> None:
    cg.emit(t.BarrierOp())


@implements(lang.static_assert)
def _static_assert(cg: CodeGen, condition: Any, message: Any = "") -> None:
    if is_runtime(condition):
        raise TkcError("static_assert needs a compile-time condition")
    if not condition:
        raise TkcError(str(message) or "static_assert failed")


# --------------------------------------------------------------------------------------------------------------
# Attributes of run-time values


def attribute_of(cg: CodeGen, value: SSAValue, attr: str) -> Any:
    vt = value.type
    if attr == "shape":
        if isinstance(vt, GlobalType):
            return GlShape(value)
        if hasattr(vt, "shape"):
            return vt.shape
    if attr == "dtype" and hasattr(vt, "element_type"):
        return lang.dtype_of(vt.element_type)
    if attr == "to" and is_register(value):
        return BoundMethod("to", _convert, value)
    if attr == "T" and is_register(value):
        return _transpose(cg, value)
    raise TkcError(f"{describe(value)} has no attribute `{attr}`")

