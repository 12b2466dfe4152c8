"""What an expression in a kernel evaluates to, besides plain Python values (which are compile-time constants)
and xDSL SSA values (which live at run time)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from xdsl.dialects.builtin import Float32Type, IntegerType, f32, i1, i32
from xdsl.ir import Attribute, SSAValue

from tkc.errors import TkcError
from tkc.ir.types import GlobalType, RegTileType, RegVecType, SharedTileType, SharedVecType


@dataclass(frozen=True)
class GlShape:
    """`G.shape` of a global tensor: its sizes are read (`tile.dim`) only when indexed with a constant."""

    tensor: SSAValue

    @property
    def rank(self) -> int:
        return self.tensor.type.rank  # type: ignore[attr-defined]


@dataclass(frozen=True)
class BoundMethod:
    """`x.to`: a method of a run-time value, waiting for its arguments."""

    name: str
    impl: Callable[..., Any]
    receiver: SSAValue


def is_runtime(value: Any) -> bool:
    return isinstance(value, SSAValue)


def is_int(value: Any) -> bool:
    return isinstance(value, SSAValue) and value.type == i32


def is_float(value: Any) -> bool:
    return isinstance(value, SSAValue) and isinstance(value.type, Float32Type)


def is_bool(value: Any) -> bool:
    return isinstance(value, SSAValue) and value.type == i1


def is_scalar(value: Any) -> bool:
    return isinstance(value, SSAValue) and isinstance(value.type, IntegerType | Float32Type)


def is_register(value: Any) -> bool:
    return isinstance(value, SSAValue) and isinstance(value.type, RegTileType | RegVecType)


def is_shared(value: Any) -> bool:
    return isinstance(value, SSAValue) and isinstance(value.type, SharedTileType | SharedVecType)


def is_global(value: Any) -> bool:
    return isinstance(value, SSAValue) and isinstance(value.type, GlobalType)


def describe(value: Any) -> str:
    """How a value reads in a message: `rt[bf16, 16, 64]`, `a run-time int`, `3 (a compile-time int)`."""
    if isinstance(value, SSAValue):
        t: Attribute = value.type
        if hasattr(t, "spec"):
            return t.spec()  # type: ignore[attr-defined]
        if t == i32:
            return "a run-time int"
        if t == f32:
            return "a run-time float"
        if t == i1:
            return "a run-time bool"
        return str(t)
    if isinstance(value, GlShape):
        return "the shape of a global tensor"
    if isinstance(value, bool | int | float):
        return f"{value!r} (a compile-time {type(value).__name__})"
    if isinstance(value, ModuleType):
        return f"the module `{value.__name__}`"
    return repr(value)


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise TkcError(message)
