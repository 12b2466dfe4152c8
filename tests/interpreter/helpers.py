"""Shared helpers of the interpreter tests: dtype rounding as the ops define it, and running IR text."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
from xdsl.parser import Parser

from tkc.interpreter import run_function
from tkc.ir import make_context
from tkc.lang import DType, bf16, f16, f32

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = (f32, bf16, f16)


def rnd(x: Any, dt: DType) -> np.ndarray:
    """`x` rounded to `dt` (nearest even), held as float32: what a tile of dtype `dt` holds."""
    with np.errstate(all="ignore"):
        return np.asarray(x, dtype=np.float32).astype(dt.np).astype(np.float32)


def poisoned(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return np.full(shape, np.nan, dtype=dtype)


def assert_same(out: np.ndarray, ref: np.ndarray) -> None:
    """Bit-for-bit equal as float32 values (NaN matches NaN, -0 matches 0)."""
    np.testing.assert_array_equal(np.asarray(out, dtype=np.float32), np.asarray(ref, dtype=np.float32))


def run_ir(text: str, args: tuple[Any, ...], grid: Any = 1, name: str = "k") -> None:
    """Parse tile IR text (a `func.func @k`, no module wrapper needed) and interpret it."""
    module = Parser(make_context(), text).parse_module()
    module.verify()
    run_function(module, name, args, grid)


def normal(rng: np.random.Generator, *shape: int, scale: float = 2.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def small_ints(rng: np.random.Generator, *shape: int, bound: int = 4) -> np.ndarray:
    """Integers in [-bound, bound]: sums and products of a few of them are exact in f32 (and bf16 is then one
    rounding of the exact result), so reductions and mma can be checked bit for bit."""
    return rng.integers(-bound, bound + 1, shape).astype(np.float32)
