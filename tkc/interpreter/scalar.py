"""arith and math on lane arrays (see lanes.py): each scalar is a (B|1, W|1) numpy array."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from xdsl.dialects import arith, math
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, IntegerType
from xdsl.interpreter import Interpreter, InterpreterFunctions, PythonValues, impl, register_impls

from tkc.errors import TkcError
from tkc.interpreter.control import lane_state

INT32 = np.iinfo(np.int32)


def _wrap_i32(x: np.ndarray) -> np.ndarray:
    """Two's-complement wrap-around of 32-bit integer arithmetic."""
    x = np.asarray(x, dtype=np.int64)
    return ((x - INT32.min) % (1 << 32)) + INT32.min


def _f32(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _floordiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # (divisors: `_divisor`'s, never 0)
    return np.floor_divide(a, b)


def _divsi(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


def _ceildiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return -np.floor_divide(-a, b)


def _remsi(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a - _divsi(a, b) * b


_INT_BINARY: dict[type, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    arith.AddiOp: np.add,
    arith.SubiOp: np.subtract,
    arith.MuliOp: np.multiply,
    arith.FloorDivSIOp: _floordiv,
    arith.DivSIOp: _divsi,
    arith.CeilDivSIOp: _ceildiv,
    arith.RemSIOp: _remsi,
    arith.DivUIOp: lambda a, b: _floordiv(a & 0xFFFFFFFF, b & 0xFFFFFFFF),
    arith.RemUIOp: lambda a, b: (a & 0xFFFFFFFF) - _floordiv(a & 0xFFFFFFFF, b & 0xFFFFFFFF) * (b & 0xFFFFFFFF),
    arith.MaxSIOp: np.maximum,
    arith.MinSIOp: np.minimum,
    arith.ShLIOp: np.left_shift,
    arith.ShRSIOp: np.right_shift,
}
_BITWISE = {arith.AndIOp: np.bitwise_and, arith.OrIOp: np.bitwise_or, arith.XOrIOp: np.bitwise_xor}
_FLOAT_BINARY: dict[type, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    arith.AddfOp: np.add,
    arith.SubfOp: np.subtract,
    arith.MulfOp: np.multiply,
    arith.DivfOp: np.divide,
    arith.MaximumfOp: np.maximum,
    arith.MinimumfOp: np.minimum,
}
_FLOAT_UNARY: dict[type, Callable[[np.ndarray], np.ndarray]] = {
    arith.NegfOp: np.negative,
    math.ExpOp: np.exp,
    math.Exp2Op: np.exp2,
    math.LogOp: np.log,
    math.Log2Op: np.log2,
    math.SqrtOp: np.sqrt,
    math.RsqrtOp: lambda x: 1.0 / np.sqrt(x),
    math.TanhOp: np.tanh,
    math.AbsFOp: np.abs,
}
_CMPI = {"eq": np.equal, "ne": np.not_equal, "slt": np.less, "sle": np.less_equal, "sgt": np.greater, "sge": np.greater_equal}
_CMPF = {"oeq": np.equal, "une": np.not_equal, "olt": np.less, "ole": np.less_equal, "ogt": np.greater, "oge": np.greater_equal}


class ScalarFunctions(InterpreterFunctions):
    @impl(arith.ConstantOp)
    def run_constant(self, interpreter: Interpreter, op: arith.ConstantOp, args: PythonValues) -> PythonValues:
        value = op.value
        if isinstance(value, IntegerAttr):
            if isinstance(value.type, IntegerType) and value.type.width.data == 1:
                return (np.full((1, 1), bool(value.value.data)),)
            return (np.full((1, 1), value.value.data, dtype=np.int64),)
        if isinstance(value, FloatAttr):
            return (np.full((1, 1), value.value.data, dtype=np.float32),)
        raise TkcError(f"arith.constant of {value} is not supported")

    @impl(arith.CmpiOp)
    def run_cmpi(self, interpreter: Interpreter, op: arith.CmpiOp, args: PythonValues) -> PythonValues:
        predicate = arith.CMPI_COMPARISON_OPERATIONS[op.predicate.value.data]
        return (_CMPI[predicate](args[0], args[1]),)

    @impl(arith.CmpfOp)
    def run_cmpf(self, interpreter: Interpreter, op: arith.CmpfOp, args: PythonValues) -> PythonValues:
        predicate = arith.CMPF_COMPARISON_OPERATIONS[op.predicate.value.data]
        if predicate not in _CMPF:
            raise TkcError(f"arith.cmpf {predicate} is not supported")
        return (_CMPF[predicate](args[0], args[1]),)

    @impl(arith.SelectOp)
    def run_select(self, interpreter: Interpreter, op: arith.SelectOp, args: PythonValues) -> PythonValues:
        return (np.where(args[0], args[1], args[2]),)

    @impl(arith.SIToFPOp)
    def run_sitofp(self, interpreter: Interpreter, op: arith.SIToFPOp, args: PythonValues) -> PythonValues:
        return (_f32(args[0]),)

    @impl(arith.FPToSIOp)
    def run_fptosi(self, interpreter: Interpreter, op: arith.FPToSIOp, args: PythonValues) -> PythonValues:
        return (_wrap_i32(np.trunc(args[0]).astype(np.int64)),)

    @impl(math.AbsIOp)
    def run_absi(self, interpreter: Interpreter, op: math.AbsIOp, args: PythonValues) -> PythonValues:
        return (np.abs(args[0]),)


_DIVISIONS = (arith.FloorDivSIOp, arith.DivSIOp, arith.CeilDivSIOp, arith.RemSIOp, arith.DivUIOp, arith.RemUIOp)


def _divisor(interpreter: Interpreter, b: np.ndarray) -> np.ndarray:
    """A division's divisor, zero only an error on the lanes that run it (a lane past the end of its persistent loop
    still computes beside the others, on values its program never sees); 1 on the others."""
    zero = b == 0
    if not zero.any():
        return b
    if (zero & lane_state(interpreter).active()).any():
        raise TkcError("integer division by zero")
    return np.where(zero, 1, b)


def _register(table: dict[type, Callable[..., np.ndarray]], kind: str) -> None:
    for op_type, fn in table.items():

        def run(self: Any, interpreter: Interpreter, op: Any, args: PythonValues, fn: Any = fn) -> PythonValues:
            if kind == "int":
                a, b = np.asarray(args[0], np.int64), np.asarray(args[1], np.int64)
                return (_wrap_i32(fn(a, _divisor(interpreter, b) if isinstance(op, _DIVISIONS) else b)),)
            if kind == "bits":
                a, b = args
                return (fn(a, b) if a.dtype == bool else _wrap_i32(fn(a, b)),)
            with np.errstate(all="ignore"):
                return (_f32(fn(*(_f32(a) for a in args))),)

        setattr(ScalarFunctions, f"run_{op_type.__name__}", impl(op_type)(run))


_register(_INT_BINARY, "int")
_register(_BITWISE, "bits")
_register(_FLOAT_BINARY, "float")
_register(_FLOAT_UNARY, "float")
register_impls(ScalarFunctions)
