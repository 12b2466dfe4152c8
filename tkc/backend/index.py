"""Integer index expressions with two meanings: evaluated in numpy (over every thread at once) and emitted as PTX.

The lowering writes each address computation once, as an expression over leaves (`lane`, `tid`, run-time
indices); numpy evaluation tells which accesses share a per-thread base so that the rest become immediate
offsets, and emission turns the same expression into integer PTX instructions. One formula, two readings: the
simulator then checks that the PTX computes what the numpy reading assumed.

    row = lane % 8 + 8 * (lane // 8 % 2)
    offset = swizzle(row * 128 + 16 * (lane // 16))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Union

import numpy as np

Operand = Union["Expr", int]


def _wrap(x: Operand) -> Expr:
    return x if isinstance(x, Expr) else Const(int(x))


class Expr:
    """A non-negative 32-bit integer expression."""

    def __add__(self, other: Operand) -> Expr:
        return _fold("+", self, _wrap(other))

    __radd__ = __add__

    def __sub__(self, other: Operand) -> Expr:
        return _fold("-", self, _wrap(other))

    def __mul__(self, other: Operand) -> Expr:
        return _fold("*", self, _wrap(other))

    __rmul__ = __mul__

    def __floordiv__(self, other: Operand) -> Expr:
        return _fold("//", self, _wrap(other))

    def __mod__(self, other: Operand) -> Expr:
        return _fold("%", self, _wrap(other))

    def __xor__(self, other: Operand) -> Expr:
        return _fold("^", self, _wrap(other))

    def __and__(self, other: Operand) -> Expr:
        return _fold("&", self, _wrap(other))

    def __lshift__(self, other: int) -> Expr:
        return _fold("<<", self, _wrap(other))

    def __rshift__(self, other: int) -> Expr:
        return _fold(">>", self, _wrap(other))

    def eval(self, env: Mapping[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def leaves(self) -> set[str]:
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: int

    def eval(self, env: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.asarray(self.value, dtype=np.int64)

    def leaves(self) -> set[str]:
        return set()

    def __repr__(self) -> str:
        return str(self.value)


@dataclass(frozen=True, eq=False)
class Leaf(Expr):
    """A value known at run time: `lane`, `tid`, `warp`, or a run-time index of the tile IR."""

    name: str

    def eval(self, env: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.asarray(env[self.name], dtype=np.int64)

    def leaves(self) -> set[str]:
        return {self.name}

    def __repr__(self) -> str:
        return self.name


_NUMPY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "+": np.add,
    "-": np.subtract,
    "*": np.multiply,
    "//": np.floor_divide,
    "%": np.remainder,
    "^": np.bitwise_xor,
    "&": np.bitwise_and,
    "<<": np.left_shift,
    ">>": np.right_shift,
}


@dataclass(frozen=True, eq=False)
class BinOp(Expr):
    op: str
    lhs: Expr
    rhs: Expr

    def eval(self, env: Mapping[str, np.ndarray]) -> np.ndarray:
        return _NUMPY[self.op](self.lhs.eval(env), self.rhs.eval(env))

    def leaves(self) -> set[str]:
        return self.lhs.leaves() | self.rhs.leaves()

    def __repr__(self) -> str:
        return f"({self.lhs!r} {self.op} {self.rhs!r})"


def _pow2(x: Expr) -> int | None:
    if isinstance(x, Const) and x.value > 0 and x.value & (x.value - 1) == 0:
        return x.value.bit_length() - 1
    return None


def _fold(op: str, a: Expr, b: Expr) -> Expr:
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(int(_NUMPY[op](np.int64(a.value), np.int64(b.value))))
    if isinstance(b, Const):
        v = b.value
        if op in ("+", "-", "^", "<<", ">>") and v == 0:
            return a
        if op in ("*", "//") and v == 1:
            return a
        if op == "*" and v == 0:
            return Const(0)
        if op == "%" and v == 1:
            return Const(0)
        if op == "+" and isinstance(a, BinOp) and a.op == "+" and isinstance(a.rhs, Const):
            return _fold("+", a.lhs, Const(a.rhs.value + v))
    if isinstance(a, Const) and op in ("+", "*", "^", "&") and not isinstance(b, Const):
        return _fold(op, b, a)  # constants on the right
    if isinstance(a, Const) and a.value == 0 and op in ("*", "&", "<<", ">>", "//"):
        return Const(0)
    return BinOp(op, a, b)


LANE = Leaf("lane")
TID = Leaf("tid")


# --------------------------------------------------------------------------------------------------------------
# Sharing bases between accesses


@dataclass(frozen=True)
class BasedAccess:
    """Access i reads `bases[base[i]] + offset[i]`."""

    bases: list[Expr]
    base: np.ndarray
    offset: np.ndarray


def share_bases(exprs: list[Expr], env: Mapping[str, np.ndarray]) -> BasedAccess:
    """Group accesses whose addresses differ by a constant for every thread and every run-time value in `env`
    (arrays broadcast against each other), so each group needs one base register and immediate offsets."""
    values = [np.broadcast_to(e.eval(env), np.broadcast_shapes(*(np.shape(v) for v in env.values()))) for e in exprs]
    bases: list[Expr] = []
    base_values: list[np.ndarray] = []
    base_of = np.zeros(len(exprs), dtype=np.int64)
    offset = np.zeros(len(exprs), dtype=np.int64)
    for i, (e, v) in enumerate(zip(exprs, values)):
        for b, bv in enumerate(base_values):
            diff = v - bv
            if diff.size == 0 or (diff == diff.flat[0]).all():
                base_of[i], offset[i] = b, int(diff.flat[0]) if diff.size else 0
                break
        else:
            base_of[i] = len(bases)
            bases.append(e)
            base_values.append(v)
    return BasedAccess(bases, base_of, offset)
