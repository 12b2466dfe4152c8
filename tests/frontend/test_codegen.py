"""What the frontend makes of a kernel: which Python runs at compile time, which becomes IR, and what that IR does.

Each test checks the IR (ops by name) and, where the semantics matter, runs the kernel with the interpreter on
small inputs against numpy.
"""

# ruff: noqa: F403, F405
from __future__ import annotations

from collections import Counter

import ml_dtypes
import numpy as np
import pytest
from xdsl.dialects import arith, scf
from xdsl.dialects.builtin import ModuleOp
from xdsl.dialects.builtin import f32 as F32
from xdsl.dialects.builtin import i32 as I32

import tkc
from tkc.ir.ops import InsertOp, LoadOp
from tkc.ir.types import RegTileType, SharedTileType
from tkc.lang import *

BF16 = np.dtype(ml_dtypes.bfloat16)


def op_names(module: ModuleOp) -> Counter[str]:
    return Counter(op.name for op in module.walk())


def ops_of(module: ModuleOp, cls: type) -> list:
    return [op for op in module.walk() if isinstance(op, cls)]


def f32_array(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------------------------------------------
# A run-time `for` is an scf.for carrying exactly the variables its body reassigns


@tkc.kernel(warps=1)
def running_sum(X: gl[f32, 2], O: gl[f32, 2], n: int):
    scale = 2.0  # read in the loop, never reassigned: not carried
    acc = zeros(rt[f32, 16, 16])
    count = 0  # a compile-time number reassigned in the loop: carried as an i32
    s = empty(st[f32, 16, 16])
    for i in range(n):
        t = load(X, (i, 0), rt[f32, 16, 16])  # bound only inside the body: not carried
        acc = acc + t * scale
        count += 1
        store(s, t)  # updates `s`: carried
    store(O, acc, (0, 0))
    store(O, zeros(rt[f32, 16, 16]) + count, (1, 0))
    store(O, load(s), (2, 0))


def test_runtime_for_carries_exactly_the_reassigned_variables() -> None:
    module = running_sum.build()
    (loop,) = ops_of(module, scf.ForOp)
    body = loop.body.block
    assert [a.name_hint for a in body.args] == ["i", "acc", "count", "s"]
    assert [r.type for r in loop.results] == [RegTileType(F32, 16, 16), I32, SharedTileType(F32, 16, 16)]
    assert isinstance(body.last_op, scf.YieldOp) and len(body.last_op.operands) == 3
    assert op_names(module)["tile.insert"] == 1

    rng = np.random.default_rng(0)
    x, o = f32_array(rng, 80, 16), np.full((48, 16), np.nan, np.float32)
    running_sum.interpret(x, o, 3, grid=1)
    np.testing.assert_allclose(o[:16], 2 * (x[:16] + x[16:32] + x[32:48]), rtol=1e-6)
    assert (o[16:32] == 3).all()
    np.testing.assert_array_equal(o[32:48], x[32:48])  # the last tile stored into `s`


@tkc.kernel(warps=1)
def read_only_loop(X: gl[f32, 2], O: gl[f32, 2], n: int):
    a = load(X, (0, 0), rt[f32, 16, 16])
    for i in range(1, n):
        if i % 2 == 1:
            store(O, a * i, (i, 0))  # a store into a global tensor rebinds nothing


def test_runtime_for_without_reassignments_carries_nothing() -> None:
    module = read_only_loop.build()
    (loop,) = ops_of(module, scf.ForOp)
    (branch,) = ops_of(module, scf.IfOp)
    assert len(loop.results) == 0 and len(loop.body.block.args) == 1
    assert len(branch.results) == 0
    x, o = np.ones((16, 16), np.float32), np.zeros((96, 16), np.float32)
    read_only_loop.interpret(x, o, 6, grid=1)
    assert [o[16 * i, 0] for i in range(6)] == [0, 1, 0, 3, 0, 5]


@tkc.kernel(warps=1)
def nested_loops(O: gl[f32, 1], n: int, m: int):
    total = 0.0
    for i in range(n):
        for j in range(m):
            total = total + i * 10 + j
    store(O, zeros(rv[f32, 16]) + total, (0,))


def test_nested_runtime_loops() -> None:
    module = nested_loops.build()
    assert op_names(module)["scf.for"] == 2
    o = np.zeros(16, np.float32)
    nested_loops.interpret(o, 3, 4, grid=1)
    assert o[0] == sum(i * 10 + j for i in range(3) for j in range(4))


@tkc.kernel(warps=1)
def branch_in_loop(X: gl[f32, 1], O: gl[f32, 1], n: int, RELOAD: const = 0):
    x = load(X, (0,), rv[f32, 16])
    total = zeros(rv[f32, 16])
    for i in range(n):
        if RELOAD:
            x = load(X, (0,), rv[f32, 16])
        total = total + x
    store(O, total, (0,))


@pytest.mark.parametrize("reload", [0, 1])
def test_variable_assigned_only_on_a_branch_not_taken_is_not_carried(reload: int) -> None:
    module = branch_in_loop.build(RELOAD=reload)
    (loop,) = [op for op in module.walk() if isinstance(op, scf.ForOp)]
    assert len(loop.results) == 1 + reload  # total, and x only where the loop body assigns it
    x = np.arange(16, dtype=np.float32)
    o = np.zeros(16, np.float32)
    branch_in_loop.interpret(x, o, 3, grid=1, RELOAD=reload)
    np.testing.assert_array_equal(o, 3 * x)


# --------------------------------------------------------------------------------------------------------------
# Compile-time loops and branches are unrolled and decided in Python


@tkc.kernel(warps=1)
def unrolled(X: gl[f32, 2], O: gl[f32, 2], STEPS: const = 3, MODE: const = "scale"):
    a = load(X, (0, 0), rt[f32, 16, 16])
    for k in range(STEPS):  # a constant bound: unrolled
        a = a + k
    for spec in (rv[f32, 16], rv[f32, 32]):  # a tuple of types: unrolled
        static_assert(spec.shape[0] % 16 == 0)
    if MODE == "scale":  # decided here: no scf.if
        a = a * 2.0
    else:
        a = exp(a)
    store(O, a, (0, 0))


@pytest.mark.parametrize("steps", [0, 1, 3])
def test_compile_time_loop_unrolls(steps: int) -> None:
    names = op_names(unrolled.build(STEPS=steps))
    assert "scf.for" not in names and "scf.if" not in names
    assert names["tile.add"] == steps
    assert names["tile.mul"] == 1 and "tile.exp" not in names
    x, o = np.ones((16, 16), np.float32), np.zeros((16, 16), np.float32)
    unrolled.interpret(x, o, grid=1, STEPS=steps)
    assert (o == 2 * (1 + sum(range(steps)))).all()


def test_compile_time_if_takes_one_branch() -> None:
    names = op_names(unrolled.build(MODE="exp"))
    assert names["tile.exp"] == 1 and "tile.mul" not in names and "scf.if" not in names


@tkc.kernel(warps=1)
def early_exit(O: gl[f32, 2], SKIP: const = 0):
    if SKIP:
        return  # a compile-time branch: the kernel ends here
    store(O, ones(rt[f32, 16, 16]), (0, 0))


def test_compile_time_return_ends_the_kernel() -> None:
    assert op_names(early_exit.build(SKIP=0))["tile.store"] == 1
    names = op_names(early_exit.build(SKIP=1))
    assert "tile.store" not in names and names["func.return"] == 1


# --------------------------------------------------------------------------------------------------------------
# A run-time `if` is an scf.if whose results are the variables either branch assigns


@tkc.kernel(warps=1)
def branchy(X: gl[f32, 2], O: gl[f32, 2]):
    bx = block_idx()[0]
    a = load(X, (bx, 0), rt[f32, 16, 16])
    same = 1
    if bx % 2 == 0:
        a = a * 2.0
        b = 1.0
        same = 1  # the same constant in both branches: not a result
    else:
        b = -1.0  # `a` keeps its value on this side
        same = 1
    store(O, a * b + same, (bx, 0))


def test_runtime_if_yields_the_assigned_variables() -> None:
    module = branchy.build()
    (branch,) = ops_of(module, scf.IfOp)
    assert [r.type for r in branch.results] == [RegTileType(F32, 16, 16), F32]
    rng = np.random.default_rng(1)
    x, o = f32_array(rng, 64, 16), np.zeros((64, 16), np.float32)
    branchy.interpret(x, o, grid=4)  # blocks 0 and 2 take the `then` branch, 1 and 3 the `else`
    for bx in range(4):
        tile = x[16 * bx : 16 * bx + 16]
        want = tile * 2 + 1 if bx % 2 == 0 else -tile + 1
        np.testing.assert_allclose(o[16 * bx : 16 * bx + 16], want, rtol=1e-6)


@tkc.kernel(warps=1)
def selects(O: gl[f32, 1], n: int, x: float):
    y = x if n > 0 and x < 10.0 else 0  # a run-time condition on scalars: arith.select, int promoted to float
    z = 5 if n > 3 or n < -3 else 7
    store(O, zeros(rv[f32, 16]) + y, (0,))
    store(O, zeros(rv[f32, 16]) + z, (1,))


@pytest.mark.parametrize(("n", "x"), [(1, 2.5), (0, 2.5), (5, 12.0), (-4, 1.0)])
def test_conditional_expression_and_boolean_operators(n: int, x: float) -> None:
    names = op_names(selects.build())
    assert names["arith.select"] == 2 and "scf.if" not in names
    assert names["arith.andi"] == 1 and names["arith.ori"] == 1
    o = np.zeros(32, np.float32)
    selects.interpret(o, n, x, grid=1)
    assert o[0] == (x if n > 0 and x < 10.0 else 0) and o[16] == (5 if n > 3 or n < -3 else 7)


# --------------------------------------------------------------------------------------------------------------
# @tkc.func helpers are inlined, return values included


@tkc.func
def softmax_rows(x):
    p = exp(sub_row(x, row_max(x)))
    return div_row(p, row_sum(p))


@tkc.func
def plus_minus(x, d=1):
    return x + d, x - d


@tkc.func
def zeros_like_rows(spec):
    rows, _ = spec.shape
    return zeros(rv[spec.dtype, rows])


@tkc.func
def twice_softmax(x):
    return softmax_rows(softmax_rows(x))


@tkc.kernel(warps=1)
def uses_helpers(X: gl[f32, 2], O: gl[f32, 2], V: gl[f32, 1], n: int):
    x = load(X, (0, 0), rt[f32, 16, 32])
    store(O, softmax_rows(x), (0, 0))
    store(O, twice_softmax(x), (1, 0))
    hi, lo = plus_minus(n, d=2)
    store(V, zeros_like_rows(rt[f32, 16, 32]) + hi * 100 + lo, (0,))


def test_helpers_are_inlined() -> None:
    module = uses_helpers.build()
    names = op_names(module)
    assert names["func.func"] == 1 and "func.call" not in names
    assert names["tile.row_max"] == 3  # one per inlined call of softmax_rows
    rng = np.random.default_rng(2)
    x, o, v = f32_array(rng, 16, 32), np.zeros((32, 32), np.float32), np.zeros(16, np.float32)
    uses_helpers.interpret(x, o, v, 5, grid=1)

    def softmax(a):
        e = np.exp(a - a.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    np.testing.assert_allclose(o[:16], softmax(x), rtol=1e-5)
    np.testing.assert_allclose(o[16:], softmax(softmax(x)), rtol=1e-5)
    assert (v == 7 * 100 + 3).all()


# --------------------------------------------------------------------------------------------------------------
# store(s, r) into a shared tile rebinds `s`


@tkc.kernel(warps=1)
def shared_roundtrip(X: gl[bf16, 2], O: gl[bf16, 2]):
    s = empty(st[bf16, 32, 32])
    for i in range(2):
        for j in range(2):
            store(s, load(X, (i, j), rt[bf16, 16, 16]) * 2.0, (j, i))  # a transposed tiling of the blocks
    r = store(s, zeros(rt[bf16, 16, 16]), (1, 1))  # store also returns the updated tile
    store(O, load(s), (0, 0))
    store(O, load(r, (0, 1), rt[bf16, 16, 16]), (2, 0))


def test_store_into_shared_tile_rebinds_it() -> None:
    module = shared_roundtrip.build()
    inserts = ops_of(module, InsertOp)
    assert len(inserts) == 5
    for previous, following in zip(inserts, inserts[1:]):
        assert following.operands[1] is previous.results[0]  # each store updates the tile the last one made
    reads = [op for op in ops_of(module, LoadOp) if op.operands[0] is inserts[-1].results[0]]
    assert len(reads) == 2  # `load(s)` and `load(r, ...)` both read the last update

    rng = np.random.default_rng(3)
    x, o = f32_array(rng, 32, 32).astype(BF16), np.zeros((48, 32), BF16)
    shared_roundtrip.interpret(x, o, grid=1)
    xf, of = x.astype(np.float32), o.astype(np.float32)
    want = np.zeros((32, 32), np.float32)
    for i in range(2):
        for j in range(2):
            want[16 * j : 16 * j + 16, 16 * i : 16 * i + 16] = 2 * xf[16 * i : 16 * i + 16, 16 * j : 16 * j + 16]
    want[16:, 16:] = 0
    np.testing.assert_array_equal(of[:32], want)
    np.testing.assert_array_equal(of[32:48, :16], want[:16, 16:])


# --------------------------------------------------------------------------------------------------------------
# int / float promotion


@tkc.kernel(warps=1)
def arithmetic(O: gl[f32, 1], n: int, x: float, D: const = 64):
    half = D // 2  # compile-time: stays a Python int
    static_assert(isinstance(half, int) and half == 32)
    results = (
        n + 1,  # i32
        n + 0.5,  # i32 → f32
        n / 2,  # true division of ints: f32
        n // 2,  # floor division
        n % 3,  # Python's modulo: the sign of the divisor
        n * x,  # i32 → f32
        x - n,
        n * n,
        -n,
        n << 2,
        n >> 1,
        n & 6 | 1,
        ~n,
        float(n),
        int(x),  # truncates toward zero, as Python's int()
        n * D**-0.5,  # a compile-time float constant
        1 if n > x else 0,  # cmpf, then select
    )
    z = zeros(rv[f32, 16])
    for k in range(len(results)):
        store(O, z + results[k], (k,))


def _expected(n: int, x: float, d: int = 64) -> list[float]:
    return [n + 1, n + 0.5, n / 2, n // 2, n % 3, n * x, x - n, n * n, -n, n << 2, n >> 1, n & 6 | 1, ~n, float(n),
            int(x), n * d**-0.5, int(n > x)]


@pytest.mark.parametrize(("n", "x"), [(7, 2.25), (-7, -2.75), (0, 0.5)])
def test_int_float_promotion(n: int, x: float) -> None:
    count = len(_expected(n, x))
    o = np.zeros(16 * count, np.float32)
    arithmetic.interpret(o, n, x, grid=1)
    np.testing.assert_allclose(o[::16], np.array(_expected(n, x), np.float32), rtol=1e-6)


@tkc.kernel(warps=1)
def signed_zeros(O: gl[f32, 1], x: float):
    z = zeros(rv[f32, 16])
    store(O, z + 1.0 / (x * 0.0), (0,))
    store(O, z + 1.0 / (x * -0.0), (1,))  # a constant of its own, not the 0.0 above


def test_constants_keep_the_sign_of_zero() -> None:
    floats = [op.value.value.data for op in ops_of(signed_zeros.build(), arith.ConstantOp) if op.result.type == F32]
    assert sorted(map(str, floats)) == ["-0.0", "0.0", "1.0"]
    o = np.zeros(32, np.float32)
    with np.errstate(divide="ignore"):
        signed_zeros.interpret(o, 2.0, grid=1)
    assert o[0] == np.inf and o[16] == -np.inf


def test_int_float_promotion_ops() -> None:
    names = op_names(arithmetic.build())
    assert names["arith.sitofp"] >= 5  # every int meeting a float is converted
    assert names["arith.divf"] == 1 and names["arith.floordivsi"] == 2  # `//` and `%`
    assert names["arith.fptosi"] == 1 and names["arith.cmpf"] == 1
    assert "arith.divsi" not in names and "arith.remsi" not in names


# --------------------------------------------------------------------------------------------------------------
# Python's max / min / abs / sum on tiles, vectors and scalars


@tkc.kernel(warps=1)
def builtins_(X: gl[f32, 2], Y: gl[f32, 2], O: gl[f32, 2], V: gl[f32, 1], n: int, x: float):
    a, b = load(X, (0, 0), rt[f32, 16, 32]), load(Y, (0, 0), rt[f32, 16, 32])
    store(O, max(a, b), (0, 0))  # tile, tile
    store(O, min(a, 0.0), (1, 0))  # tile, scalar
    store(O, abs(min(b, a, 0.25)), (2, 0))  # three arguments
    v = row_sum(a)
    store(V, abs(v), (0,))
    scalars = (max(v), min(v), sum(v), max(n, 3), min(x, n), abs(n), abs(x), max(2, 7), abs(-3))
    for k in range(len(scalars)):
        store(V, zeros(rv[f32, 16]) + scalars[k], (k + 1,))


def test_python_builtins_on_tiles_vectors_scalars() -> None:
    names = op_names(builtins_.build())
    assert names["tile.max"] == 1 and names["tile.min"] == 3
    assert names["tile.abs"] == 2
    assert names["tile.vec_max"] == 1 and names["tile.vec_min"] == 1 and names["tile.vec_sum"] == 1
    assert names["arith.maxsi"] == 1 and names["arith.minimumf"] == 1
    assert names["math.absi"] == 1 and names["math.absf"] == 1

    rng = np.random.default_rng(4)
    x, y = f32_array(rng, 16, 32), f32_array(rng, 16, 32)
    o, v = np.zeros((48, 32), np.float32), np.zeros(160, np.float32)
    n, s = -5, 2.5
    builtins_.interpret(x, y, o, v, n, s, grid=1)
    np.testing.assert_array_equal(o[:16], np.maximum(x, y))
    np.testing.assert_array_equal(o[16:32], np.minimum(x, 0))
    np.testing.assert_array_equal(o[32:], np.abs(np.minimum(np.minimum(y, x), 0.25)))
    rs = x.sum(1)
    np.testing.assert_allclose(v[:16], np.abs(rs), rtol=1e-5)
    want = [rs.max(), rs.min(), rs.sum(), max(n, 3), min(s, n), abs(n), abs(s), 7, 3]
    np.testing.assert_allclose(v[16::16], want, rtol=1e-5)


# --------------------------------------------------------------------------------------------------------------
# .to, .T, .shape, .dtype


@tkc.kernel(warps=1)
def attributes(X: gl[f32, 2], O: gl[f32, 2], B: gl[bf16, 2], S: gl[f32, 1]):
    a = load(X, (0, 0), rt[f32, 16, 32])
    rows, cols = a.shape  # compile-time
    static_assert((rows, cols) == (16, 32) and a.dtype == f32 and a.T.shape == (32, 16))
    store(O, a.T, (0, 0))
    store(B, a.to(bf16), (0, 0))
    store(O, a.to(bf16).to(f32), (2, 0))
    same = a.to(f32)  # no conversion: the same value
    store(S, zeros(rv[f32, 16]) + X.shape[0] * 1000 + X.shape[-1], (0,))  # run-time sizes
    store(O, same, (3, 0))


def test_to_T_shape_dtype() -> None:
    module = attributes.build()
    names = op_names(module)
    assert names["tile.transpose"] == 2  # `.T` in static_assert is an op too (dead, for cleanup passes)
    assert names["tile.convert"] == 3  # f32→bf16 twice, bf16→f32 once; `.to(f32)` of an f32 tile is free
    assert names["tile.dim"] == 2
    rng = np.random.default_rng(5)
    x = f32_array(rng, 16, 32)
    o, b, s = np.zeros((64, 32), np.float32), np.zeros((16, 32), BF16), np.zeros(16, np.float32)
    attributes.interpret(x, o, b, s, grid=1)
    np.testing.assert_array_equal(o[:32, :16], x.T)
    np.testing.assert_array_equal(b, x.astype(BF16))
    np.testing.assert_array_equal(o[32:48], x.astype(BF16).astype(np.float32))
    np.testing.assert_array_equal(o[48:64], x)
    assert s[0] == 16 * 1000 + 32
