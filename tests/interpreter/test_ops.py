"""Per-op semantics of the tile interpreter against numpy, by interpreting small kernels (and IR, for ops the
language does not spell). Every elementwise kernel runs on 2 blocks × 2 warps, each lane on its own tile, so a
mix-up between lanes shows too.

The reference of an op on a bf16/f16 tile is "compute in f32, round the result to the tile's dtype": the ops
round after every op (tkc/ir/ops.py), so results are compared bit for bit.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import tkc
from tkc.lang import *  # noqa: F403
from tkc.lang import DType

from .helpers import BF16, DTYPES, assert_same, normal, poisoned, rnd, run_ir, small_ints

WARPS, BLOCKS = 2, 2
LANES = WARPS * BLOCKS
few = settings(max_examples=5)
some = settings(max_examples=10)
seeds = hs.integers(0, 2**32 - 1)
dtypes = hs.sampled_from(DTYPES)
sizes = hs.sampled_from([16, 32, 48])


@tkc.func
def lane():
    """This warp's index among all warps of the (1-D) grid."""
    return block_idx()[0] * WARPS + warp_id()


@tkc.func
def negate(x):
    return -x


def lane_tiles(out: np.ndarray, rows: int) -> list[np.ndarray]:
    return [out[i * rows:(i + 1) * rows] for i in range(LANES)]


# --------------------------------------------------------------------------------------------------------------
# Elementwise unary

UNARY = {
    "exp": (exp, np.exp),
    "exp2": (exp2, np.exp2),
    "log": (log, np.log),
    "log2": (log2, np.log2),
    "abs": (abs, np.abs),
    "relu": (relu, lambda x: np.maximum(x, np.float32(0))),
    "neg": (negate, np.negative),
    "sqrt": (sqrt, np.sqrt),
    "rsqrt": (rsqrt, lambda x: np.float32(1) / np.sqrt(x)),
    "tanh": (tanh, np.tanh),
    "copy": (copy, lambda x: x),
}
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e30, 7e4, 1.0, -1.0], dtype=np.float32)


@functools.cache
def unary_kernel(name: str) -> tkc.Kernel:
    fn = UNARY[name][0]

    @tkc.kernel(warps=WARPS)
    def unary(X: gl[f32, 2], Y: gl[f32, 2], V: gl[f32, 1], W: gl[f32, 1], DT: const = f32, R: const = 16,
              C: const = 16):
        i = lane()
        store(Y, fn(load(X, (i, 0), rt[DT, R, C])), (i, 0))
        store(W, fn(load(V, (i,), rv[DT, C])), (i,))

    return unary


def _unary_input(rng: np.random.Generator, shape: tuple[int, ...], positive: bool) -> np.ndarray:
    x = normal(rng, *shape)
    if positive:
        x = np.abs(x) + np.float32(0.01)
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, SPECIALS.size, replace=False)] = SPECIALS  # inf, nan, ±0, out of f16's range
    return x


@pytest.mark.parametrize("name", list(UNARY))
@few
@given(dt=dtypes, r=sizes, c=sizes, seed=seeds)
def test_unary(name: str, dt: DType, r: int, c: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    positive = name in ("log", "log2", "sqrt", "rsqrt")
    x, v = _unary_input(rng, (LANES * r, c), positive), _unary_input(rng, (LANES * c,), positive)
    y, w = poisoned(LANES * r, c), poisoned(LANES * c)
    unary_kernel(name).interpret(x, y, v, w, grid=BLOCKS, DT=dt, R=r, C=c)
    ref = UNARY[name][1]
    with np.errstate(all="ignore"):
        assert_same(y, rnd(ref(rnd(x, dt)), dt))
        assert_same(w, rnd(ref(rnd(v, dt)), dt))


def test_unary_against_float64() -> None:
    """Not only numpy's f32 functions: within one bf16 ulp of the float64 result, rounded."""
    x = np.linspace(0.05, 4.0, 16 * 16 * LANES, dtype=np.float32).reshape(LANES * 16, 16)
    for name in ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh"):
        y = poisoned(*x.shape)
        unary_kernel(name).interpret(x, y, x[:, 0].copy(), poisoned(LANES * 16), grid=BLOCKS, DT=bf16)
        ref64 = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sqrt": np.sqrt,
                 "rsqrt": lambda a: 1 / np.sqrt(a), "tanh": np.tanh}[name]
        exact = ref64(rnd(x, bf16).astype(np.float64))
        np.testing.assert_allclose(y, exact, rtol=2**-8, err_msg=name)


# --------------------------------------------------------------------------------------------------------------
# Elementwise binary: tile ⊕ tile, tile ⊕ scalar and scalar ⊕ tile (compile-time and run-time scalars)

BINARY = {
    "add": (add, np.add),
    "sub": (sub, np.subtract),
    "mul": (mul, np.multiply),
    "div": (div, np.divide),
    "max": (max, np.maximum),
    "min": (min, np.minimum),
}
MODES = ("tile_tile", "tile_const", "const_tile", "tile_runtime", "runtime_tile")
# scalars exact in bf16 and f16, so that the result does not hinge on whether the scalar is rounded first
SCALARS = hs.sampled_from([0.0, 1.5, -3.0, 0.125, 96.0, -0.75])


@functools.cache
def binary_kernel(name: str, mode: str) -> tkc.Kernel:
    fn = BINARY[name][0]

    @tkc.kernel(warps=WARPS)
    def binary(X: gl[f32, 2], Z: gl[f32, 2], Y: gl[f32, 2], V: gl[f32, 1], U: gl[f32, 1], W: gl[f32, 1],
               s: float, DT: const = f32, R: const = 16, C: const = 16, S: const = 1.0):
        i = lane()
        x, z = load(X, (i, 0), rt[DT, R, C]), load(Z, (i, 0), rt[DT, R, C])
        v, u = load(V, (i,), rv[DT, C]), load(U, (i,), rv[DT, C])
        if mode == "tile_tile":
            y, w = fn(x, z), fn(v, u)
        elif mode == "tile_const":
            y, w = fn(x, S), fn(v, S)
        elif mode == "const_tile":
            y, w = fn(S, x), fn(S, v)
        elif mode == "tile_runtime":
            y, w = fn(x, s), fn(v, s)
        else:
            y, w = fn(s, x), fn(s, v)
        store(Y, y, (i, 0))
        store(W, w, (i,))

    return binary


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(BINARY))
@few
@given(dt=dtypes, r=sizes, c=sizes, scalar=SCALARS, seed=seeds)
def test_binary(name: str, mode: str, dt: DType, r: int, c: int, scalar: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x, z = normal(rng, LANES * r, c), normal(rng, LANES * r, c)
    v, u = normal(rng, LANES * c), normal(rng, LANES * c)
    z[0, : min(c, 3)] = 0.0  # division by zero
    y, w = poisoned(LANES * r, c), poisoned(LANES * c)
    binary_kernel(name, mode).interpret(x, z, y, v, u, w, scalar, grid=BLOCKS, DT=dt, R=r, C=c, S=scalar)
    ref = BINARY[name][1]
    s = np.float32(scalar)
    x, z, v, u = rnd(x, dt), rnd(z, dt), rnd(v, dt), rnd(u, dt)
    with np.errstate(all="ignore"):
        expect = {
            "tile_tile": (ref(x, z), ref(v, u)),
            "tile_const": (ref(x, s), ref(v, s)),
            "const_tile": (ref(s, x), ref(s, v)),
            "tile_runtime": (ref(x, s), ref(v, s)),
            "runtime_tile": (ref(s, x), ref(s, v)),
        }[mode]
    assert_same(y, rnd(expect[0], dt))
    assert_same(w, rnd(expect[1], dt))


@tkc.kernel(warps=1)
def operators(X: gl[f32, 2], Z: gl[f32, 2], Y: gl[f32, 3], s: float, DT: const = f32):
    x, z = load(X, (0, 0), rt[DT, 16, 32]), load(Z, (0, 0), rt[DT, 16, 32])
    ys = (x + z, x - z, x * z, x / z, 2.0 - x, x / 3.0, s * x, -x + s, max(x, z, s))
    for k in range(len(ys)):  # (enumerate() is not supported as a compile-time iterable)
        store(Y, ys[k], (k, 0, 0))


@given(dt=dtypes, s=SCALARS, seed=seeds)
@few
def test_operators(dt: DType, s: float, seed: int) -> None:
    """`+ - * /`, unary minus and max() of three on tiles emit the same ops as the names."""
    rng = np.random.default_rng(seed)
    x, z = normal(rng, 16, 32), normal(rng, 16, 32)
    y = poisoned(9, 16, 32)
    operators.interpret(x, z, y, s, grid=1, DT=dt)
    x, z, s32 = rnd(x, dt), rnd(z, dt), np.float32(s)
    with np.errstate(all="ignore"):
        expect = [x + z, x - z, x * z, x / z, 2 - x, x / np.float32(3), s32 * x, rnd(-x, dt) + s32,
                  np.maximum(rnd(np.maximum(x, z), dt), s32)]
    for k, e in enumerate(expect):
        assert_same(y[k], rnd(e, dt))


@tkc.kernel(warps=1)
def rounding_chain(X: gl[f32, 2], Z: gl[f32, 2], Y: gl[f32, 2], DT: const = bf16):
    x, z = load(X, (0, 0), rt[DT, 16, 16]), load(Z, (0, 0), rt[DT, 16, 16])
    store(Y, ((x + z) * 3.0 - z) / 7.0 + exp(x * 0.01), (0, 0))


@pytest.mark.parametrize("dt", [bf16, f16])
def test_low_precision_rounds_after_every_op(dt: DType) -> None:
    rng = np.random.default_rng(0)
    x, z = normal(rng, 16, 16), normal(rng, 16, 16)
    y = poisoned(16, 16)
    rounding_chain.interpret(x, z, y, grid=1, DT=dt)
    x, z = rnd(x, dt), rnd(z, dt)
    t = rnd(rnd(rnd(rnd(x + z, dt) * np.float32(3), dt) - z, dt) / np.float32(7), dt)
    expect = rnd(t + rnd(np.exp(rnd(x * np.float32(0.01), dt)), dt), dt)
    assert_same(y, expect)
    unrounded = rnd((((x + z) * 3 - z) / 7 + np.exp(x * np.float32(0.01))), dt)
    assert not np.array_equal(expect, unrounded)  # the test can tell the difference


# --------------------------------------------------------------------------------------------------------------
# Row and column broadcasts


@functools.cache
def row_col_kernel(name: str, axis: str) -> tkc.Kernel:
    fn = {"add_row": add_row, "sub_row": sub_row, "mul_row": mul_row, "div_row": div_row, "add_col": add_col,
          "sub_col": sub_col, "mul_col": mul_col, "div_col": div_col}[f"{name}_{axis}"]

    @tkc.kernel(warps=WARPS)
    def row_col(X: gl[f32, 2], V: gl[f32, 1], Y: gl[f32, 2], B: gl[f32, 2], DT: const = f32, R: const = 16,
                C: const = 16):
        i = lane()
        v = load(V, (i,), rv[DT, R if axis == "row" else C])
        store(Y, fn(load(X, (i, 0), rt[DT, R, C]), v), (i, 0))
        store(B, broadcast_row(v, rt[DT, R, C]) if axis == "row" else broadcast_col(v, rt[DT, R, C]), (i, 0))

    return row_col


@pytest.mark.parametrize("axis", ["row", "col"])
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
@few
@given(dt=dtypes, r=sizes, c=sizes, seed=seeds)
def test_row_col_broadcast(name: str, axis: str, dt: DType, r: int, c: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = r if axis == "row" else c
    x, v = normal(rng, LANES * r, c), normal(rng, LANES * n)
    y, b = poisoned(LANES * r, c), poisoned(LANES * r, c)
    row_col_kernel(name, axis).interpret(x, v, y, b, grid=BLOCKS, DT=dt, R=r, C=c)
    fn = BINARY[name][1]
    for tile, out, bcast, vec in zip(lane_tiles(rnd(x, dt), r), lane_tiles(y, r), lane_tiles(b, r),
                                     np.split(rnd(v, dt), LANES)):
        vb = vec[:, None] if axis == "row" else vec[None, :]
        with np.errstate(all="ignore"):
            assert_same(out, rnd(fn(tile, vb), dt))
        assert_same(bcast, np.broadcast_to(vb, (r, c)))


ROW_COL_IR = """
func.func @k(%X: !tile.gl<?x?xf32>, %V: !tile.gl<?xf32>, %Y: !tile.gl<?x?x?xf32>) attributes {tkc.warps = 1 : i64} {
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %c2 = arith.constant 2 : i32
  %c3 = arith.constant 3 : i32
  %x = tile.load %X[%c0, %c0] : !tile.gl<?x?xf32> -> !tile.rt<16x32xbf16>
  %r = tile.load %V[%c0] : !tile.gl<?xf32> -> !tile.rv<16xbf16>
  %c = tile.load %V[%c0] : !tile.gl<?xf32> -> !tile.rv<32xbf16>
  %a = tile.max_row %x, %r : !tile.rt<16x32xbf16>, !tile.rv<16xbf16>
  %b = tile.min_row %x, %r : !tile.rt<16x32xbf16>, !tile.rv<16xbf16>
  %d = tile.max_col %x, %c : !tile.rt<16x32xbf16>, !tile.rv<32xbf16>
  %e = tile.min_col %x, %c : !tile.rt<16x32xbf16>, !tile.rv<32xbf16>
  tile.store %a, %Y[%c0, %c0, %c0] : !tile.rt<16x32xbf16> -> !tile.gl<?x?x?xf32>
  tile.store %b, %Y[%c1, %c0, %c0] : !tile.rt<16x32xbf16> -> !tile.gl<?x?x?xf32>
  tile.store %d, %Y[%c2, %c0, %c0] : !tile.rt<16x32xbf16> -> !tile.gl<?x?x?xf32>
  tile.store %e, %Y[%c3, %c0, %c0] : !tile.rt<16x32xbf16> -> !tile.gl<?x?x?xf32>
  func.return
}
"""


def test_max_min_row_col_ir() -> None:
    """max_row / min_row / max_col / min_col exist in the IR (the language has no names for them)."""
    rng = np.random.default_rng(0)
    x, v = normal(rng, 16, 32), normal(rng, 32)
    y = poisoned(4, 16, 32)
    run_ir(ROW_COL_IR, (x, v, y))
    x, r, c = rnd(x, bf16), rnd(v[:16], bf16)[:, None], rnd(v, bf16)[None, :]
    for k, e in enumerate((np.maximum(x, r), np.minimum(x, r), np.maximum(x, c), np.minimum(x, c))):
        assert_same(y[k], e)


# --------------------------------------------------------------------------------------------------------------
# Reductions


@functools.cache
def reduce_kernel(name: str, axis: str, with_acc: bool) -> tkc.Kernel:
    fn = globals()[f"{axis}_{name}"]

    @tkc.kernel(warps=WARPS)
    def reduce(X: gl[f32, 2], A: gl[f32, 1], Y: gl[f32, 1], DT: const = f32, R: const = 16, C: const = 16):
        i = lane()
        n = R if axis == "row" else C
        x = load(X, (i, 0), rt[DT, R, C])
        if with_acc:
            y = fn(x, load(A, (i,), rv[DT, n]))
        else:
            y = fn(x)
        store(Y, y, (i,))

    return reduce


REDUCE = {"max": (np.max, np.maximum), "min": (np.min, np.minimum), "sum": (np.sum, np.add),
          "prod": (np.prod, np.multiply)}


def _reduce_input(rng: np.random.Generator, name: str, *shape: int) -> np.ndarray:
    if name == "prod":  # ±1, ±2, ±0.5: every product is exact in f32
        return rng.choice(np.array([1, -1, 2, -2, 0.5, -0.5, 1, 1], dtype=np.float32), shape)
    if name == "sum":
        return small_ints(rng, *shape, bound=40)
    return normal(rng, *shape)


@pytest.mark.parametrize("with_acc", [False, True])
@pytest.mark.parametrize("axis", ["row", "col"])
@pytest.mark.parametrize("name", list(REDUCE))
@few
@given(dt=dtypes, r=sizes, c=sizes, seed=seeds)
def test_reduce(name: str, axis: str, with_acc: bool, dt: DType, r: int, c: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = r if axis == "row" else c
    x, acc = _reduce_input(rng, name, LANES * r, c), _reduce_input(rng, name, LANES * n)
    y = poisoned(LANES * n)
    reduce_kernel(name, axis, with_acc).interpret(x, acc, y, grid=BLOCKS, DT=dt, R=r, C=c)
    reduce, combine = REDUCE[name]
    for tile, out, a in zip(lane_tiles(rnd(x, dt), r), np.split(y, LANES), np.split(rnd(acc, dt), LANES)):
        expect = reduce(tile.astype(np.float64), axis=1 if axis == "row" else 0)
        if with_acc:
            expect = combine(a.astype(np.float64), expect)
        assert_same(out, rnd(expect, dt))  # exact in f32, then one rounding


@tkc.kernel(warps=WARPS)
def vec_reduce(V: gl[f32, 1], Y: gl[f32, 2], DT: const = f32, N: const = 32):
    i = lane()
    v = load(V, (i,), rv[DT, N])
    store(Y, zeros(rv[f32, 16]) + sum(v), (i, 0))
    store(Y, zeros(rv[f32, 16]) + max(v), (i, 1))
    store(Y, zeros(rv[f32, 16]) + min(v), (i, 2))


@some
@given(dt=dtypes, n=sizes, seed=seeds)
def test_vec_reduce(dt: DType, n: int, seed: int) -> None:
    """sum/max/min of a register vector: an f32 scalar (not rounded to the vector's dtype)."""
    rng = np.random.default_rng(seed)
    v = small_ints(rng, LANES * n, bound=100)
    y = poisoned(LANES, 48)
    vec_reduce.interpret(v, y, grid=BLOCKS, DT=dt, N=n)
    for out, vec in zip(y, np.split(rnd(v, dt), LANES)):
        assert_same(out, np.repeat([vec.sum(), vec.max(), vec.min()], 16))


VEC_PROD_IR = """
func.func @k(%V: !tile.gl<?xf32>, %Y: !tile.gl<?xf32>) attributes {tkc.warps = 1 : i64} {
  %c0 = arith.constant 0 : i32
  %v = tile.load %V[%c0] : !tile.gl<?xf32> -> !tile.rv<32xbf16>
  %p = tile.vec_prod %v : !tile.rv<32xbf16>
  %m = tile.vec_max %v : !tile.rv<32xbf16>
  %z = tile.fill 0.0 : !tile.rv<16xf32>
  %y = tile.add %z, %p : !tile.rv<16xf32>, f32
  %w = tile.add %m, %z : f32, !tile.rv<16xf32>
  %one = arith.constant 1 : i32
  tile.store %y, %Y[%c0] : !tile.rv<16xf32> -> !tile.gl<?xf32>
  tile.store %w, %Y[%one] : !tile.rv<16xf32> -> !tile.gl<?xf32>
  func.return
}
"""


def test_vec_prod_ir() -> None:
    v = np.ones(32, np.float32)
    v[:10] = 3.0
    v[20] = -0.5  # the product, -3**10 / 2, is exact in f32 but not in bf16: the result is an f32 scalar
    y = poisoned(32)
    run_ir(VEC_PROD_IR, (v, y))
    assert_same(y[:16], np.full(16, np.prod(v.astype(np.float64))))
    assert_same(y[16:], np.full(16, v.max()))


# --------------------------------------------------------------------------------------------------------------
# Conversions, transpose, triangles


@tkc.kernel(warps=WARPS)
def converts(X: gl[f32, 2], Y: gl[f32, 3], V: gl[f32, 1], W: gl[f32, 2], SRC: const = f32, DST: const = bf16):
    i = lane()
    x = load(X, (i, 0), rt[SRC, 16, 32])
    store(Y, x.to(DST), (0, i, 0))
    store(Y, convert(x, DST), (1, i, 0))
    store(Y, convert(convert(x, DST), SRC), (2, i, 0))
    store(W, convert(load(V, (i,), rv[SRC, 32]), DST), (0, i))


@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES)
@few
@given(seed=seeds)
def test_convert(src: DType, dst: DType, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = normal(rng, LANES * 16, 32, scale=1e3)
    x[0, :4] = [1e5, -1e6, 3e-8, np.nan]  # past f16's range, below its subnormals
    v = normal(rng, LANES * 32)
    y, w = poisoned(3, LANES * 16, 32), poisoned(1, LANES * 32)
    converts.interpret(x, y, v, w, grid=BLOCKS, SRC=src, DST=dst)
    for k in (0, 1):
        assert_same(y[k], rnd(rnd(x, src), dst))
    assert_same(y[2], rnd(rnd(rnd(x, src), dst), src))
    assert_same(w[0], rnd(rnd(v, src), dst))


def test_convert_rounds_to_nearest_even() -> None:
    eps = 2.0**-8  # half a bf16 ulp at 1
    x = np.zeros((LANES * 16, 32), dtype=np.float32)
    x[0, :6] = [1 + eps, 1 + 3 * eps, -(1 + eps), 1 + eps + 2**-20, 2**-133, 3.0e38]
    y = poisoned(3, LANES * 16, 32)
    converts.interpret(x, y, np.zeros(LANES * 32, np.float32), poisoned(1, LANES * 32), grid=BLOCKS,
                       SRC=f32, DST=bf16)
    assert list(y[0, 0, :6]) == [1.0, 1 + 4 * eps, -1.0, 1 + 2 * eps, 2.0**-133, float(BF16.type(3.0e38))]


@tkc.kernel(warps=WARPS)
def transposes(X: gl[f32, 2], Y: gl[f32, 3], DT: const = f32, R: const = 16, C: const = 32):
    i = lane()
    x = load(X, (i, 0), rt[DT, R, C])
    store(Y, x.T, (0, i, 0))
    store(Y, transpose(transpose(x)).T, (1, i, 0))


@some
@given(dt=dtypes, r=sizes, c=sizes, seed=seeds)
def test_transpose(dt: DType, r: int, c: int, seed: int) -> None:
    x = normal(np.random.default_rng(seed), LANES * r, c)
    y = poisoned(2, LANES * c, r)
    transposes.interpret(x, y, grid=BLOCKS, DT=dt, R=r, C=c)
    for k in (0, 1):
        assert_same(y[k], np.concatenate([t.T for t in lane_tiles(rnd(x, dt), r)]))


@tkc.kernel(warps=WARPS)
def triangles(X: gl[f32, 2], Y: gl[f32, 3], d: int, DT: const = f32, R: const = 16, C: const = 32,
              FILL: const = 0.0):
    i = lane()
    x = load(X, (i, 0), rt[DT, R, C])
    diag = d + warp_id() * 3 - block_idx()[0]  # a different diagonal per lane
    store(Y, tril(x, diag, FILL), (0, i, 0))
    store(Y, triu(x, diag, FILL), (1, i, 0))
    store(Y, tril(x), (2, i, 0))
    store(Y, triu(x, fill=FILL), (3, i, 0))
    store(Y, make_causal(x), (4, i, 0))
    store(Y, keep_cols(x, diag, FILL), (5, i, 0))
    store(Y, keep_rows(x, diag, FILL), (6, i, 0))


@some
@given(dt=dtypes, r=sizes, c=sizes, d=hs.integers(-60, 60), fill=hs.sampled_from([0.0, -math.inf, 0.1, 7.0]),
       seed=seeds)
def test_tril_triu(dt: DType, r: int, c: int, d: int, fill: float, seed: int) -> None:
    x = normal(np.random.default_rng(seed), LANES * r, c)
    y = poisoned(7, LANES * r, c)
    triangles.interpret(x, y, d, grid=BLOCKS, DT=dt, R=r, C=c, FILL=fill)
    i, j = np.arange(r)[:, None], np.arange(c)[None, :]
    f = rnd(fill, dt)
    for n, tile in enumerate(lane_tiles(rnd(x, dt), r)):
        block, warp = divmod(n, WARPS)
        diag = d + warp * 3 - block
        rows = slice(n * r, (n + 1) * r)
        assert_same(y[0, rows], np.where(j <= i + diag, tile, f))
        assert_same(y[1, rows], np.where(j >= i + diag, tile, f))
        assert_same(y[2, rows], np.where(j <= i, tile, 0))
        assert_same(y[3, rows], np.where(j >= i, tile, f))
        assert_same(y[4, rows], np.where(j <= i, tile, -np.inf))
        assert_same(y[5, rows], np.where(j < diag, tile, f))
        assert_same(y[6, rows], np.where(i < diag, tile, f))


# --------------------------------------------------------------------------------------------------------------
# Matrix multiply


@functools.cache
def mma_kernel(name: str) -> tkc.Kernel:
    fn = globals()[name]
    ta, tb = "At" in name, name.endswith("Bt")

    @tkc.kernel(warps=WARPS)
    def mma(A: gl[f32, 3], B: gl[f32, 3], C: gl[f32, 3], D: gl[f32, 3], AB: const = bf16, M: const = 16,
            N: const = 16, K: const = 16):
        i = lane()
        a = load(A, (i, 0, 0), rt[AB, K, M] if ta else rt[AB, M, K])
        b = load(B, (i, 0, 0), rt[AB, N, K] if tb else rt[AB, K, N])
        if name.startswith("mma"):
            d = fn(a, b, load(C, (i, 0, 0), rt[f32, M, N]))
        else:
            d = fn(a, b)
        store(D, d, (i, 0, 0))

    return mma


MMAS = ["mma_AB", "mma_ABt", "mma_AtB", "mma_AtBt", "mm_AB", "mm_ABt", "mm_AtB", "mm_AtBt"]


@pytest.mark.parametrize("name", MMAS)
@few
@given(ab=hs.sampled_from([bf16, f16]), m=sizes, n=sizes, k=hs.sampled_from([16, 32, 64]), seed=seeds)
def test_mma(name: str, ab: DType, m: int, n: int, k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ta, tb = "At" in name, name.endswith("Bt")
    a = small_ints(rng, LANES, *((k, m) if ta else (m, k)))
    b = small_ints(rng, LANES, *((n, k) if tb else (k, n)))
    c = small_ints(rng, LANES, m, n, bound=100)
    d = poisoned(LANES, m, n)
    mma_kernel(name).interpret(a, b, c, d, grid=BLOCKS, AB=ab, M=m, N=n, K=k)
    op_a = np.swapaxes(a, -1, -2) if ta else a
    op_b = np.swapaxes(b, -1, -2) if tb else b
    expect = op_a.astype(np.float64) @ op_b + (c if name.startswith("mma") else 0)
    assert_same(d, expect)  # small integers: exact


def test_mma_accumulates_in_f32() -> None:
    """The accumulator and result stay f32: the error against float64 is f32-sized, not bf16-sized."""
    rng = np.random.default_rng(1)
    a, b, c = normal(rng, LANES, 32, 64), normal(rng, LANES, 64, 48), normal(rng, LANES, 32, 48)
    d = poisoned(LANES, 32, 48)
    mma_kernel("mma_AB").interpret(a, b, c, d, grid=BLOCKS, AB=bf16, M=32, N=48, K=64)
    expect = rnd(a, bf16).astype(np.float64) @ rnd(b, bf16) + c
    np.testing.assert_allclose(d, expect, rtol=0, atol=1e-4 * np.abs(expect).max())
    assert not np.array_equal(d, rnd(d, bf16))


# --------------------------------------------------------------------------------------------------------------
# Loads and stores: global ↔ registers, ragged edges, ranks 2 to 4


@tkc.kernel(warps=1)
def copy2d(X: gl[bf16, 2], Y: gl[bf16, 2], P: gl[f32, 2], R: const = 16, C: const = 16):
    bx, by, _ = block_idx()
    t = load(X, (by, bx), rt[f32, R, C])
    store(Y, t, (by, bx))
    store(P, t, (by, bx))


@settings(max_examples=15)
@given(m=hs.integers(1, 70), n=hs.integers(1, 70), tile=hs.sampled_from([(16, 16), (16, 32), (32, 16), (48, 64)]),
       seed=seeds)
def test_ragged_2d(m: int, n: int, tile: tuple[int, int], seed: int) -> None:
    """Past the end of X a load reads zeros (P shows them); past the end of Y stores are dropped, without
    wrapping into the next row."""
    r, c = tile
    gm, gn = -(-m // r), -(-n // c)
    x = normal(np.random.default_rng(seed), m, n).astype(BF16)
    y, p = poisoned(m, n, dtype=BF16), poisoned(gm * r, gn * c)
    copy2d.interpret(x, y, p, grid=(gn, gm), R=r, C=c)
    assert_same(y, x)
    padded = np.zeros_like(p)
    padded[:m, :n] = x
    assert_same(p, padded)


@tkc.kernel(warps=2)
def copy4d(X: gl[f32, 4], Y: gl[f32, 4], Z: gl[f32, 4]):
    """Grid (row tiles, B + 1, A): y runs one past X's second dimension."""
    i, b, a = block_idx()
    for j in range(cdiv(X.shape[3], 32)):
        t = load(X, (a, b, i * 2 + warp_id(), j), rt[bf16, 16, 32])
        store(Y, t, (a, b, i * 2 + warp_id(), j))
        store(Z, t, (a, b, i * 2 + warp_id(), j))


@some
@given(a=hs.integers(1, 2), b=hs.integers(1, 3), m=hs.integers(1, 40), n=hs.integers(1, 70), seed=seeds)
def test_rank4_and_leading_indices(a: int, b: int, m: int, n: int, seed: int) -> None:
    """Leading indices count elements; one past the end (b == B) reads zeros and its stores are dropped."""
    x = normal(np.random.default_rng(seed), a, b, m, n)
    y, z = poisoned(a, b, m, n), poisoned(a, b + 1, m, n)
    copy4d.interpret(x, y, z, grid=(-(-m // 32), b + 1, a))
    assert_same(y, rnd(x, bf16))
    assert_same(z[:, :b], rnd(x, bf16))
    assert_same(z[:, b], np.zeros((a, m, n)))


@tkc.kernel(warps=1)
def rank3(X: gl[f32, 3], Y: gl[f32, 3], V: gl[f32, 3]):
    """Grid (A, row tiles): a tile at (a, i, 0), and row 16·i of X[a] as a vector of length 32."""
    a, i, _ = block_idx()
    store(Y, load(X, (a, i, 0), rt[f32, 16, 32]), (a, i, 0))
    store(V, load(X, (a, i * 16, 0), rv[f32, 32]), (a, i, 0))


def test_rank3_tiles_and_vectors() -> None:
    x = normal(np.random.default_rng(2), 3, 40, 24)
    y, v = poisoned(3, 40, 24), poisoned(3, 3, 24)
    rank3.interpret(x, y, v, grid=(3, 3))
    assert_same(y, x)
    assert_same(v, x[:, [0, 16, 32], :])


# --------------------------------------------------------------------------------------------------------------
# Shared tiles and vectors


@tkc.kernel(warps=4)
def shared_subtiles(X: gl[bf16, 2], Y: gl[bf16, 2], DT: const = f32):
    """Each block stages a 64×32 tile in shared memory; each warp reads one 32×16 quarter of it."""
    bx, by, _ = block_idx()
    s = load(X, (by, bx), st[bf16, 64, 32])
    wm, wn = warp_id() // 2, warp_id() % 2
    store(Y, load(s, (wm, wn), rt[DT, 32, 16]), (by * 2 + wm, bx * 2 + wn))


@some
@given(m=hs.integers(1, 150), n=hs.integers(1, 80), dt=dtypes, seed=seeds)
def test_global_to_shared_to_registers(m: int, n: int, dt: DType, seed: int) -> None:
    x = normal(np.random.default_rng(seed), m, n).astype(BF16)
    y = poisoned(m, n, dtype=BF16)
    shared_subtiles.interpret(x, y, grid=(-(-n // 32), -(-m // 64)), DT=dt)
    assert_same(y, rnd(rnd(x, bf16), dt))


@tkc.kernel(warps=4)
def registers_to_shared(X: gl[f32, 2], Y: gl[bf16, 2], Z: gl[f32, 2]):
    """Each warp stores 2·(its 32×16 quarter) into an empty bf16 shared tile; the block writes it out. Z gets a
    tile whose right half nobody stored: it holds NaN."""
    bx, by, _ = block_idx()
    wm, wn = warp_id() // 2, warp_id() % 2
    s = empty(st[bf16, 64, 32])
    store(s, load(X, (by * 2 + wm, bx * 2 + wn), rt[f32, 32, 16]) * 2.0, (wm, wn))
    store(Y, s, (by, bx))
    half = empty(st[f32, 64, 32])
    half = store(half, load(s, (wm, 0), rt[f32, 32, 16]), (wm, 0))  # warps 2k and 2k+1 agree
    store(Z, half, (by, bx))


@some
@given(gm=hs.integers(1, 3), gn=hs.integers(1, 3), seed=seeds)
def test_registers_to_shared_to_global(gm: int, gn: int, seed: int) -> None:
    x = normal(np.random.default_rng(seed), 64 * gm, 32 * gn)
    y, z = poisoned(64 * gm, 32 * gn, dtype=BF16), poisoned(64 * gm, 32 * gn)
    registers_to_shared.interpret(x, y, z, grid=(gn, gm))
    assert_same(y, rnd(x * 2, bf16))  # rounded to the shared tile's dtype
    expect = np.full_like(z, np.nan)
    for j in range(gn):
        expect[:, 32 * j:32 * j + 16] = rnd(x * 2, bf16)[:, 32 * j:32 * j + 16]
    assert_same(z, expect)


@tkc.kernel(warps=1)
def empty_shared(Y: gl[f32, 2], V: gl[f32, 1]):
    s = empty(st[f32, 16, 32])
    store(Y, load(s) + 1.0, (0, 0))
    store(V, empty(sv[f32, 16]), (0,))


def test_empty_shared_holds_nan() -> None:
    y, v = np.zeros((16, 32), np.float32), np.zeros(16, np.float32)
    empty_shared.interpret(y, v, grid=1)
    assert np.isnan(y).all() and np.isnan(v).all()


@tkc.kernel(warps=4)
def vectors(V: gl[bf16, 1], Y: gl[f32, 1], Z: gl[bf16, 1], DT: const = f32):
    """gl → sv → rv (each warp a quarter of the block's 64 elements) → gl; and rv → sv → gl."""
    b = block_idx()[0]
    s = load(V, (b,), sv[bf16, 64])
    r = load(s, (warp_id(),), rv[DT, 16])
    store(Y, r, (b * 4 + warp_id(),))
    t = empty(sv[bf16, 64])
    t = store(t, r * 2.0, (3 - warp_id(),))  # reversed quarters
    store(Z, t, (b,))


@some
@given(n=hs.integers(1, 200), dt=dtypes, seed=seeds)
def test_vectors(n: int, dt: DType, seed: int) -> None:
    v = normal(np.random.default_rng(seed), n).astype(BF16)
    blocks = -(-n // 64)
    y, z = poisoned(n), poisoned(blocks * 64, dtype=BF16)
    vectors.interpret(v, y, z, grid=blocks, DT=dt)
    r = rnd(v, dt)
    assert_same(y, r)
    padded = np.zeros(blocks * 64, np.float32)
    padded[:n] = r
    expect = rnd(padded * 2, dt).reshape(blocks, 4, 16)[:, ::-1].reshape(-1)
    assert_same(z, rnd(expect, bf16))


# --------------------------------------------------------------------------------------------------------------
# Fills, grid indices, sizes


@tkc.kernel(warps=1)
def fills(Y: gl[f32, 3], V: gl[f32, 2], DT: const = bf16):
    store(Y, zeros(rt[DT, 16, 16]), (0, 0, 0))
    store(Y, ones(rt[DT, 16, 16]), (1, 0, 0))
    store(Y, neg_infty(rt[DT, 16, 16]), (2, 0, 0))
    store(Y, pos_infty(rt[DT, 16, 16]), (3, 0, 0))
    store(Y, full(rt[DT, 16, 16], 0.1), (4, 0, 0))
    store(Y, load(zeros(st[DT, 16, 16])), (5, 0, 0))  # shared fills, read back through registers
    store(Y, load(ones(st[DT, 16, 16])), (6, 0, 0))
    store(Y, load(neg_infty(st[DT, 16, 16])), (7, 0, 0))
    store(Y, load(pos_infty(st[DT, 16, 16])), (8, 0, 0))
    store(Y, load(full(st[DT, 32, 16], 0.1), (1, 0), rt[DT, 16, 16]), (9, 0, 0))
    store(V, full(rv[DT, 16], -1e6), (0, 0))
    store(V, load(full(sv[DT, 16], 3)), (1, 0))


@pytest.mark.parametrize("dt", DTYPES)
def test_fills(dt: DType) -> None:
    y, v = poisoned(10, 16, 16), poisoned(2, 16)
    fills.interpret(y, v, grid=1, DT=dt)
    for k in (0, 5):
        for i, value in enumerate((0.0, 1.0, -np.inf, np.inf, 0.1)):
            assert_same(y[k + i], np.full((16, 16), rnd(value, dt)))
    assert_same(v, [np.full(16, rnd(-1e6, dt)), np.full(16, 3.0)])


@tkc.kernel(warps=1)
def indices(Y: gl[f32, 3], A: gl[f32, 3], WARPS_PER_BLOCK: const = 1):
    bx, by, bz = block_idx()
    nx, ny, nz = num_blocks()
    w = warp_id()
    lane = ((bz * ny + by) * nx + bx) * WARPS_PER_BLOCK + w
    values = (bx, by, bz, nx, ny, nz, w, warpgroup_id(), A.shape[0], A.shape[1], A.shape[2], A.shape[-1])
    for k in range(len(values)):
        store(Y, zeros(rv[f32, 16]) + float(values[k]), (lane, k, 0))


@pytest.mark.parametrize("warps", [1, 3, 8])
@some
@given(grid=hs.lists(hs.integers(1, 3), min_size=1, max_size=3), shape=hs.tuples(*[hs.integers(1, 9)] * 3))
def test_grid_indices(warps: int, grid: list[int], shape: tuple[int, int, int]) -> None:
    """block_idx / num_blocks / warp_id / warpgroup_id / X.shape[k], for grids of 1 to 3 dimensions; lanes are
    numbered with x fastest."""
    kernel = tkc.kernel(warps=warps)(indices.fn)
    dims = tuple(grid) + (1,) * (3 - len(grid))
    lanes = dims[0] * dims[1] * dims[2] * warps
    y = poisoned(lanes, 12, 16)
    kernel.interpret(y, np.zeros(shape, np.float32), grid=tuple(grid) if len(grid) > 1 else grid[0],
                     WARPS_PER_BLOCK=warps)
    expect = []
    for bz in range(dims[2]):
        for by in range(dims[1]):
            for bx in range(dims[0]):
                for w in range(warps):
                    expect.append([bx, by, bz, *dims, w, w // 4, *shape, shape[-1]])
    assert_same(y, np.repeat(np.array(expect, np.float32)[:, :, None], 16, axis=2))
