"""Loads, stores and atomic adds whose rows an index tensor names (`rows_at`): the tile interpreter against numpy,
the lowered PTX (simulated per thread) against the interpreter in each layout such a tile can take, and the oracle
failing where the lowering drops a bounds check."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_
from reference import BF16, gathered_rows, random_bf16, row_numbers

import tkc
from tkc.backend import addressing
from tkc.backend.ptxas import assemble, find_ptxas
from tkc.backend.simulator import simulate
from tkc.compiler import compile_kernels, lower_kernel
from tkc.errors import TkcError
from tkc.lang import (atomic_add, bf16, block_idx, const, f32, gl, i32, i64, load, mma_AB, rotate_pairs, row_sum,
                      rows_at, rt, store, zeros)

ROWS = 40  # rows of the gathered table


@tkc.kernel(warps=1)
def scaled_rows(T: gl[f32, 2], P: gl["PT", 1], O: gl[f32, 2], PT: const = i64, REPEAT: const = 1):
    """O's tile b: rows P[16·b ..] of T, doubled (elementwise only: the linear layout); REPEAT=2 spreads each column
    of T over a pair and turns the pairs (the row layout)."""
    b = block_idx()[0]
    t = load(T, (rows_at(P, 16 * b), 0), rt[f32, 16, 64], repeat=REPEAT)
    if REPEAT == 2:
        t = rotate_pairs(t)
    store(O, t * 2.0, (b, 0))


@tkc.kernel(warps=1)
def gathered_products(A: gl[bf16, 2], T: gl[bf16, 2], P: gl["PT", 1], O: gl[f32, 2], S: gl[f32, 1],
                      PT: const = i32):
    """A (16, 16) times 16 gathered rows of T (an mma's B operand: the col layout), and the gathered rows' sums
    (a reduction: the row layout)."""
    b = block_idx()[0]
    rows = load(T, (rows_at(P, 16 * b), 0), rt[bf16, 16, 16])
    store(O, mma_AB(load(A, (0, 0), rt[bf16, 16, 16]), rows, zeros(rt[f32, 16, 16])), (b, 0))
    store(S, row_sum(load(T, (rows_at(P, 16 * b), 0), rt[f32, 16, 16])), (b,))


@tkc.kernel(warps=1)
def scattered_products(A: gl[bf16, 2], B: gl[bf16, 2], P: gl["PT", 1], O: gl[bf16, 2], S: gl[f32, 2],
                       PT: const = i64):
    """Tile b of A·B (an mma's accumulator: the row layout; stored as bf16 a quad's rows at a time) into rows
    P[16·b ..] of O, and added into rows P[16·b ..] of S (atomic_add: rows named twice get both)."""
    b = block_idx()[0]
    product = mma_AB(load(A, (b, 0), rt[bf16, 16, 16]), load(B, (0, 0), rt[bf16, 16, 32]), zeros(rt[f32, 16, 32]))
    store(O, product, (rows_at(P, 16 * b), 0))
    atomic_add(S, product, (rows_at(P, 16 * b), 0))


def _run_both(kernel, args, grid, constants, target):
    module = lower_kernel(kernel, target, constants)
    interp = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    sim = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    kernel.interpret(*interp, grid=grid, **constants)
    simulate(module, kernel.name, sim, grid)
    return interp, sim


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("index_type", ["i32", "i64"])
@pytest.mark.parametrize("repeat", [1, 2])
def test_gathered_rows(target: str, index_type: str, repeat: int) -> None:
    rng = np.random.default_rng(repeat)
    dtype = np.int64 if index_type == "i64" else np.int32
    table = rng.standard_normal((ROWS, 64 // repeat)).astype(np.float32)
    positions = row_numbers(rng, 29, dtype, ROWS)  # the second tile runs past the index's end
    out = np.full((32, 64), np.nan, dtype=np.float32)
    constants = {"PT": i64 if index_type == "i64" else i32, "REPEAT": repeat}
    interp, sim = _run_both(scaled_rows, [table, positions, out], 2, constants, target)
    ref = gathered_rows(table, positions, 32)
    if repeat == 2:
        ref = np.repeat(ref, 2, axis=1)
        ref[:, 0::2], ref[:, 1::2] = -ref[:, 1::2].copy(), ref[:, 0::2].copy()
    np.testing.assert_array_equal(interp[2], 2 * ref.astype(np.float32))
    np.testing.assert_array_equal(sim[2], interp[2])


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_gathered_mma_operand_and_sums(target: str) -> None:
    rng = np.random.default_rng(7)
    a, table = random_bf16(rng, 16, 16), random_bf16(rng, ROWS, 16)
    positions = row_numbers(rng, 32, np.int32, ROWS)
    out, sums = np.full((32, 16), np.nan, dtype=np.float32), np.full(32, np.nan, dtype=np.float32)
    interp, sim = _run_both(gathered_products, [a, table, positions, out, sums], 2, {}, target)
    rows = gathered_rows(table.astype(np.float32), positions, 32)
    expected = np.concatenate([a.astype(np.float64) @ rows[16 * b:16 * b + 16] for b in range(2)])
    np.testing.assert_allclose(interp[3], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(interp[4], rows.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(sim[3], interp[3])
    np.testing.assert_allclose(sim[4], interp[4], rtol=1e-6, atol=1e-6)


@settings(max_examples=12, deadline=None)
@given(seed=st_.integers(0, 2**31), count=st_.integers(0, 40), strided=st_.booleans())
def test_gathered_rows_any_positions(seed: int, count: int, strided: bool) -> None:
    """Random positions (any count, an index tensor read with a stride) give the interpreter's rows in the PTX."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((ROWS, 64)).astype(np.float32)
    backing = row_numbers(rng, 2 * count, np.int64, ROWS)
    positions = backing[::2] if strided else backing[:count]
    out = np.full((48, 64), np.nan, dtype=np.float32)
    interp, sim = _run_both(scaled_rows, [table, positions, out], 3, {"PT": i64}, "sm_80")
    np.testing.assert_array_equal(interp[2], 2 * gathered_rows(table, positions, 48).astype(np.float32))
    np.testing.assert_array_equal(sim[2], interp[2])


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_scattered_rows(target: str) -> None:
    """Rows stored and added by row numbers: distinct numbers for the store (some out of range: dropped), one
    repeated for the atomic add (both rows summed)."""
    rng = np.random.default_rng(5)
    a, b = random_bf16(rng, 32, 16), random_bf16(rng, 16, 32)
    positions = rng.permutation(ROWS)[:32].astype(np.int64)
    positions[[3, 17]] = [-1, (1 << 32) + 2]  # dropped
    out, sums = np.full((ROWS, 32), np.nan, dtype=BF16), np.zeros((ROWS, 32), dtype=np.float32)
    interp, sim = _run_both(scattered_products, [a, b, positions, out, sums], 2, {}, target)
    product = a.astype(np.float64) @ b.astype(np.float64)
    kept = (positions >= 0) & (positions < ROWS)
    expected = np.full((ROWS, 32), np.nan)
    expected[positions[kept]] = product[kept]
    np.testing.assert_allclose(interp[3].astype(np.float64), expected, rtol=1e-2, atol=1e-2)
    np.testing.assert_array_equal(sim[3].astype(np.float32), interp[3].astype(np.float32))
    np.testing.assert_allclose(sim[4], interp[4], rtol=1e-6, atol=1e-6)
    repeated = positions.copy()
    repeated[20] = repeated[4]  # row 4's and row 20's products into one row
    added = np.zeros((ROWS, 32))
    np.add.at(added, repeated[kept], product[kept])
    sums = np.zeros((ROWS, 32), dtype=np.float32)
    out = np.full((ROWS, 32), np.nan, dtype=BF16)
    with pytest.raises(TkcError, match="store"):  # the store of two rows into one is a race the interpreter reports
        scattered_products.interpret(a, b, repeated, out, sums, grid=2)
    module = lower_kernel(scattered_products, target, {})
    simulate(module, "scattered_products", [a, b, repeated, out, sums], 2)
    np.testing.assert_allclose(sums, added, rtol=1e-5, atol=1e-5)


def test_a_missing_high_word_check_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lowering that bounds an int64 row number by its low word alone reads row 3 for 2**32 + 3: the simulation
    differs from the interpreter (which it matches with the check)."""
    rng = np.random.default_rng(3)
    table = rng.standard_normal((ROWS, 64)).astype(np.float32)
    positions = np.array([(1 << 32) + 3, *range(15)], dtype=np.int64)
    out = np.full((16, 64), np.nan, dtype=np.float32)
    interp, sim = _run_both(scaled_rows, [table, positions, out], 1, {"PT": i64}, "sm_80")
    np.testing.assert_array_equal(sim[2], interp[2])
    within = addressing.rows_within
    monkeypatch.setattr(addressing, "rows_within", lambda lw, read, low, words, limit: within(lw, read, low, 1, limit))
    interp, sim = _run_both(scaled_rows, [table, positions, out], 1, {"PT": i64}, "sm_80")
    assert not np.array_equal(sim[2], interp[2])
    np.testing.assert_array_equal(sim[2][0], 2 * table[3])


def test_rows_at_needs_an_integer_index() -> None:
    with pytest.raises(TkcError, match="rows_at's index must be a global tensor gl\\[i32, 1\\] or gl\\[i64, 1\\]"):
        lower_kernel(scaled_rows, "sm_80", {"PT": f32})


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed (pip install nvidia-cuda-nvcc==13.0.88)")
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_ptxas_accepts_gathers(target: str) -> None:
    for kernel, constants in ((scaled_rows, {"PT": i64, "REPEAT": 2}), (scaled_rows, {"PT": i32}),
                              (gathered_products, {}), (scattered_products, {})):
        report = assemble(compile_kernels([kernel], target, constants), target)[kernel.name]
        assert report.spill_stores == 0


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_routed_rows_example(target: str) -> None:
    """tests/kernels/routed_rows.py (a mixture of experts' permute and combine) in the interpreter and the PTX
    simulation against numpy: int64 sources past X's end, negative int32 destinations, many entries into one row,
    the last warp's entries past the tables' end."""
    from kernels.routed_rows import routed_rows

    rng = np.random.default_rng(1)
    x, entries = random_bf16(rng, 500, 128), 300
    src = rng.integers(0, 520, entries).astype(np.int64)
    dst = rng.integers(-3, 200, entries).astype(np.int32)
    y, z = rng.standard_normal((200, 128)).astype(np.float32), np.full((entries, 128), np.nan, dtype=BF16)
    gathered = np.where((src < 500)[:, None], x.astype(np.float64)[np.minimum(src, 499)], 0)
    expected = y.astype(np.float64)
    np.add.at(expected, dst[dst >= 0], 2 * gathered[dst >= 0])
    interp, sim = _run_both(routed_rows, [x, src, dst, y, z], -(-entries // 64), {}, target)
    for got in (interp, sim):
        np.testing.assert_allclose(got[3], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[4].astype(np.float64), gathered)
