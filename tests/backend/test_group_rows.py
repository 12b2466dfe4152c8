"""What a kernel over groups of rows needs (a grouped GEMM, a mixture of experts): an element of an int32 tensor as a
run-time int (`Offsets[g]`), and loads and stores cut short at a group's end (`rows(r, end)`, `rows_at(I, r, end)`).
The interpreter against numpy, the lowered PTX (simulated per thread) against the interpreter, and the oracle
failing where the lowering forgets the end."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_

import tkc
from tkc.backend import addressing
from tkc.backend.ptxas import assemble, find_ptxas
from tkc.backend.simulator import simulate
from tkc.compiler import compile_kernels, lower_kernel
from tkc.errors import TkcError
from tkc.lang import atomic_add, block_idx, const, f32, gl, i32, load, rows, rows_at, rt, rv, st, store, warp_id, zeros

ROWS = 48


@tkc.kernel(warps=2)
def scaled_groups(Offsets: gl[i32, 1], P: gl[i32, 1], X: gl[f32, 2], O: gl[f32, 2], S: gl[f32, 2],
                  GATHER: const = 0):
    """Block g takes rows Offsets[g] .. Offsets[g + 1] (each warp 16 of them; past the group's end nothing), scales
    them by g + 1 into the same rows of O and adds them into S; with GATHER, rows P[Offsets[g] ..] instead."""
    g = block_idx()[0]
    start, end = Offsets[g], Offsets[g + 1]
    r = start + 16 * warp_id()
    if GATHER:
        t = load(X, (rows_at(P, r, end), 0), rt[f32, 16, 16])
        store(O, t * (g + 1.0), (rows_at(P, r, end), 0))
        atomic_add(S, t, (rows_at(P, r, end), 0))
    else:
        t = load(X, (rows(r, end), 0), rt[f32, 16, 16])
        store(O, t * (g + 1.0), (rows(r, end), 0))
        atomic_add(S, t, (rows(r, end), 0))


def expected_groups(offsets: np.ndarray, positions: np.ndarray | None, x: np.ndarray):
    out, sums = np.full(x.shape, np.nan, np.float32), np.zeros(x.shape, np.float32)
    for g in range(len(offsets) - 1):
        for r in range(max(offsets[g], 0), min(offsets[g + 1], offsets[g] + 32)):
            row = r if positions is None else positions[r] if r < len(positions) else -1
            if 0 <= row < len(x):
                out[row] = x[row] * (g + 1)
                sums[row] += x[row]
    return out, sums


def run_both(offsets, positions, x, gather, target, grid=None):
    args = [offsets, positions, x, np.full(x.shape, np.nan, np.float32), np.zeros(x.shape, np.float32)]
    interp = [a.copy() for a in args]
    sim = [a.copy() for a in args]
    grid = grid or len(offsets) - 1
    scaled_groups.interpret(*interp, grid=grid, GATHER=gather)
    simulate(lower_kernel(scaled_groups, target, {"GATHER": gather}), "scaled_groups", sim, grid)
    return interp, sim


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("gather", [0, 1])
def test_groups_end_where_their_offsets_say(target: str, gather: int) -> None:
    """Groups of 5, 0, 32, 3 and 8 rows, each stored scaled by its own number: a row written past its group's end
    would carry the next group's value (and race with it). The index tensor (gathering) is a permutation."""
    rng = np.random.default_rng(gather)
    offsets = np.array([0, 5, 5, 37, 40, 48], dtype=np.int32)
    positions = rng.permutation(ROWS).astype(np.int32)
    x = rng.standard_normal((ROWS, 16)).astype(np.float32)
    interp, sim = run_both(offsets, positions, x, gather, target)
    out, sums = expected_groups(offsets, positions if gather else None, x)
    np.testing.assert_array_equal(interp[3], out)
    np.testing.assert_allclose(interp[4], sums, rtol=1e-6)
    np.testing.assert_array_equal(sim[3], interp[3])
    np.testing.assert_allclose(sim[4], interp[4], rtol=1e-6)


@settings(max_examples=12, deadline=None)
@given(seed=st_.integers(0, 2**31), sizes=st_.lists(st_.integers(0, 33), min_size=1, max_size=5),
       gather=st_.sampled_from([0, 1]))
def test_any_groups(seed: int, sizes: list[int], gather: int) -> None:
    """Random group sizes, offsets past the rows' end, row numbers out of range; and one block more than there are
    groups, whose end (read past the offsets tensor's end: 0) lies before its start: it takes nothing."""
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[rng.integers(0, 4)], rng.integers(0, 4) + np.cumsum(sizes)]).astype(np.int32)
    positions = rng.permutation(ROWS + 4).astype(np.int32) - 2  # distinct: -2, -1 and ROWS, ROWS + 1 fall outside
    x = rng.standard_normal((ROWS, 16)).astype(np.float32)
    interp, sim = run_both(offsets, positions, x, gather, "sm_80", grid=len(offsets))
    out, sums = expected_groups(offsets, positions if gather else None, x)
    np.testing.assert_array_equal(interp[3], out)
    np.testing.assert_allclose(interp[4], sums, rtol=1e-6)
    np.testing.assert_array_equal(sim[3], interp[3])
    np.testing.assert_allclose(sim[4], interp[4], rtol=1e-6)


def test_a_forgotten_end_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lowering that ignores the end stores each group's rows into the next group's: the interpreter's result (which
    the simulation matches with the end) differs."""
    rng = np.random.default_rng(2)
    offsets = np.array([0, 5, 20], dtype=np.int32)  # without the end, block 1 writes rows 20 .. 36 too
    x = rng.standard_normal((ROWS, 16)).astype(np.float32)
    positions = np.arange(ROWS, dtype=np.int32)
    from tkc.backend import lower_copies, lower_memory  # (imported first: a first import under the patch would keep it)

    for module in (addressing, lower_copies, lower_memory):
        monkeypatch.setattr(module, "row_limit", lambda lw, size, end: size)
    args = [offsets, positions, x, np.full(x.shape, np.nan, np.float32), np.zeros(x.shape, np.float32)]
    simulate(lower_kernel(scaled_groups, "sm_80", {}), "scaled_groups", args, 2)
    out, _ = expected_groups(offsets, None, x)
    assert not np.array_equal(args[3], out, equal_nan=True)


@tkc.kernel(warps=1)
def read_elements(T: gl[i32, 2], O: gl[f32, 2]):
    """Block b: element (b - 1, b) of T (row -1 and rows past the end read 0) in every element of tile b."""
    b = block_idx()[0]
    v = T[b - 1, b]
    store(O, load(O, (b, 0), rt[f32, 16, 16]) * 0.0 + v, (b, 0))


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_reading_an_element(target: str) -> None:
    table = np.arange(1, 13, dtype=np.int32).reshape(3, 4) * 7
    out = np.zeros((16 * 5, 16), np.float32)
    interp = out.copy()
    read_elements.interpret(table, interp, grid=5)
    expected = [0, table[0, 1], table[1, 2], table[2, 3], 0]  # (-1, 0) and (3, 4) lie outside
    np.testing.assert_array_equal(interp.reshape(5, 16, 16)[:, 0, 0], expected)
    sim = out.copy()
    simulate(lower_kernel(read_elements, target, {}), "read_elements", [table, sim], 5)
    np.testing.assert_array_equal(sim, interp)


def test_element_reads_and_ends_are_checked() -> None:
    @tkc.kernel
    def float_element(X: gl[f32, 1], O: gl[f32, 2]):
        store(O, load(O, (0, 0), rt[f32, 16, 16]) * X[0], (0, 0))

    @tkc.kernel
    def one_index(T: gl[i32, 2], O: gl[f32, 2]):
        store(O, load(O, (T[0], 0), rt[f32, 16, 16]), (0, 0))

    @tkc.kernel
    def end_from_shared(X: gl[f32, 2], O: gl[f32, 2]):
        store(O, load(X, (0, 0), st[f32, 16, 16]), (rows(0, 5), 0))

    with pytest.raises(TkcError, match=r"only an int32 tensor's elements read as run-time ints"):
        compile_kernels([float_element], "sm_80", {})
    with pytest.raises(TkcError, match=r"reads one element: give 2 indices"):
        compile_kernels([one_index], "sm_80", {})
    with pytest.raises(TkcError, match=r"an end to the rows .* cuts a register tile's or vector's load or store, or a "
                                       r"load into a shared tile, short; not st\[f32, 16, 16\]'s"):
        compile_kernels([end_from_shared], "sm_80", {})


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed (pip install nvidia-cuda-nvcc==13.0.88)")
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_ptxas_accepts_group_rows(target: str) -> None:
    for kernel, constants in ((scaled_groups, {}), (scaled_groups, {"GATHER": 1}), (read_elements, {})):
        report = assemble(compile_kernels([kernel], target, constants), target)[kernel.name]
        assert report.spill_stores == 0


@pytest.mark.parametrize("kernel, target, config", [
    ("grouped_gemm_kernel", "sm_80", {"BM": 64, "BN": 64, "BK": 32, "WARPS": 4, "WARPS_N": 2, "STAGES": 2}),
    ("grouped_gemm_sm90_kernel", "sm_90a", {"BN": 64, "BK": 32, "WARPS": 4, "STAGES": 3, "LOADS": 8, "GROUP_N": 1}),
    ("grouped_gemm_sm90_kernel", "sm_90a", {"BN": 64, "BK": 32, "WARPS": 4, "STAGES": 3, "MIXED": 1})])
@pytest.mark.parametrize("gather, trans_b", [(0, 0), (1, 1), (1, 0)])
def test_grouped_gemm(kernel: str, target: str, config: dict, gather: int, trans_b: int) -> None:
    """tkc.kernels.grouped_gemm's kernels: groups of 40, 0, 100 and 1 rows (tiles cut short at each end; one block
    more than the groups' tiles, doing nothing), rows past the last offset left as they were, 3 steps of K; the
    interpreter against numpy, the PTX (a cp.async or TMA ring, mma.sync or wgmma) against the interpreter."""
    grouped = importlib.import_module("tkc.kernels.grouped_gemm")  # (tkc.kernels.grouped_gemm: the function)
    from reference import BF16, random_bf16, rel_err

    from tkc.compiler import tensor_alignment

    rng = np.random.default_rng(gather + 2 * trans_b)
    slots, k, n = 150, 96, 128
    x = random_bf16(rng, slots, k)
    w = random_bf16(rng, 4, *((n, k) if trans_b else (k, n)))
    offsets = np.array([40, 40, 140, 141], dtype=np.int32)
    rows_of_x = rng.permutation(slots + 4).astype(np.int32)[:slots] - 2  # some outside x
    source = np.where(((rows_of_x >= 0) & (rows_of_x < slots))[:, None], x.astype(np.float64)[np.clip(rows_of_x, 0, slots - 1)], 0.0) \
        if gather else x.astype(np.float64)
    expected = np.full((slots, n), np.nan)
    for g, (start, stop) in enumerate(zip([0, *offsets[:-1]], offsets)):
        weight = w[g].astype(np.float64)
        expected[start:stop] = source[start:stop] @ (weight.T if trans_b else weight)
    args = [x, w, offsets, rows_of_x, np.full((slots, n), np.nan, dtype=BF16)]
    constants = {"GATHER": gather, "TRANS_B": trans_b, **config}
    # the wgmma kernel on fewer blocks than tiles: each walks several (its ring running on across them)
    grid = (n // 64, -(-slots // config["BM"]) + 4) if "BM" in config else (5, 1)
    kernel_fn = getattr(grouped, kernel)
    interp = [a.copy() for a in args]
    kernel_fn.interpret(*interp, grid=grid, **constants)
    kept = ~np.isnan(expected)
    assert rel_err(interp[4].astype(np.float64)[kept], expected[kept]) < 1e-2
    assert np.isnan(interp[4].astype(np.float32)[~kept]).all()
    aligns = {p.name: tensor_alignment(a) for p, a in zip(kernel_fn.runtime_params, args) if p.kind == "tensor"}
    sim = [a.copy() for a in args]
    simulate(lower_kernel(kernel_fn, target, constants, aligns=aligns), kernel_fn.name, sim, grid)
    np.testing.assert_array_equal(sim[4].astype(np.float32), interp[4].astype(np.float32))


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed (pip install nvidia-cuda-nvcc==13.0.88)")
def test_ptxas_accepts_grouped_gemm() -> None:
    """The shipped configurations, rows gathered or not, both layouts of w, and the weight gradient's: no spills."""
    grouped = importlib.import_module("tkc.kernels.grouped_gemm")  # (tkc.kernels.grouped_gemm: the function)

    for kernel, target, config in ((grouped.grouped_gemm_kernel, "sm_80", grouped.CONFIG),
                                   (grouped.grouped_gemm_sm90_kernel, "sm_90a", grouped.CONFIG_SM90)):
        for gather in (0, 1):
            for trans_b in (0, 1):
                for scatter in ({}, {"SCATTER": 1, "YT": f32}) if not gather else ({},):
                    mixed = {"MIXED": 1} if gather and target == "sm_90a" else {}  # (gathered rows on W's TMA ring)
                    constants = {**config, "GATHER": gather, "TRANS_B": trans_b, **scatter, **mixed}
                    report = assemble(compile_kernels([kernel], target, constants), target)[kernel.name]
                    assert report.spill_stores == 0, (kernel.name, constants)
    for kernel, target, config in ((grouped.grouped_gemm_wgrad_kernel, "sm_80", grouped.CONFIG_WGRAD),
                                   (grouped.grouped_gemm_wgrad_sm90_kernel, "sm_90a", grouped.CONFIG_WGRAD_SM90)):
        for gathered in ({}, {"GATHER_A": 1}, {"GATHER_B": 1}):
            for mixed in ({}, {"MIXED": 1}) if target == "sm_90a" else ({},):
                constants = {**config, **gathered, **mixed}
                report = assemble(compile_kernels([kernel], target, constants), target)[kernel.name]
                assert report.spill_stores == 0, (kernel.name, constants)


@pytest.mark.parametrize("kernel, target, config", [
    ("grouped_gemm_wgrad_kernel", "sm_80", {"BM": 64, "BN": 64, "BR": 32, "WARPS": 4, "WARPS_N": 2, "STAGES": 2}),
    ("grouped_gemm_wgrad_sm90_kernel", "sm_90a", {"BN": 64, "BR": 64, "WARPS": 4, "STAGES": 3}),
    ("grouped_gemm_wgrad_sm90_kernel", "sm_90a", {"BN": 64, "BR": 64, "WARPS": 4, "STAGES": 3, "MIXED": 1})])
@pytest.mark.parametrize("gather_a, gather_b", [(0, 0), (1, 0), (0, 1)])
def test_grouped_gemm_wgrad(kernel: str, target: str, config: dict, gather_a: int, gather_b: int) -> None:
    """grouped_gemm's weight gradient: C[g] = A_gᵀ · B_g over groups of 40, 0, 99 and 2 rows (the loop's last slice
    cut at each group's end: the next group's rows must not add in; the wgmma kernel on a persistent grid, its ring
    running across groups, the empty one's tiles too; MIXED=1: one side whole by TMA, the other cut), rows gathered
    on either side or none; the
    interpreter against numpy, the PTX against the interpreter (to one bf16 rounding: f32 sums in another order)."""
    grouped = importlib.import_module("tkc.kernels.grouped_gemm")
    from reference import BF16, random_bf16, rel_err

    from tkc.compiler import tensor_alignment

    rng = np.random.default_rng(3 * gather_a + gather_b)
    slots, m, n, groups = 150, 128, 64, 4
    a, b = random_bf16(rng, slots, m), random_bf16(rng, slots, n)
    offsets = np.array([40, 40, 139, 141], dtype=np.int32)
    rows_of = (rng.permutation(slots + 4)[:slots] - 2).astype(np.int32)  # some outside the tensors

    def side(t, gathered):
        if not gathered:
            return t.astype(np.float64)
        inside = (rows_of >= 0) & (rows_of < slots)
        return np.where(inside[:, None], t.astype(np.float64)[np.clip(rows_of, 0, slots - 1)], 0.0)

    sa, sb = side(a, gather_a), side(b, gather_b)
    expected = np.stack([sa[s:e].T @ sb[s:e] for s, e in zip([0, *offsets[:-1]], offsets)])
    args = [a, b, offsets, rows_of, np.full((groups, m, n), np.nan, dtype=BF16)]
    constants = {"GATHER_A": gather_a, "GATHER_B": gather_b, **config}
    tile_rows = config.get("BM", 16 * config["WARPS"])
    grid = (groups, -(-m // tile_rows) * -(-n // config["BN"]))
    if "BM" not in config:  # the wgmma kernel on fewer blocks than tiles: each walks several, its ring running on
        grid = (3, 1)
    kernel_fn = getattr(grouped, kernel)
    interp = [t.copy() for t in args]
    kernel_fn.interpret(*interp, grid=grid, **constants)
    assert rel_err(interp[4].astype(np.float64), expected) < 1e-2
    assert (interp[4][1].astype(np.float32) == 0).all()  # the empty group: zeros
    aligns = {p.name: tensor_alignment(t) for p, t in zip(kernel_fn.runtime_params, args) if p.kind == "tensor"}
    sim = [t.copy() for t in args]
    simulate(lower_kernel(kernel_fn, target, constants, aligns=aligns), kernel_fn.name, sim, grid)
    np.testing.assert_allclose(sim[4].astype(np.float32), interp[4].astype(np.float32), rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("kernel, target, config", [
    ("grouped_gemm_kernel", "sm_80", {"BM": 64, "BN": 64, "BK": 32, "WARPS": 4, "WARPS_N": 2, "STAGES": 2}),
    ("grouped_gemm_sm90_kernel", "sm_90a", {"BN": 64, "BK": 32, "WARPS": 4, "STAGES": 3})])
def test_grouped_gemm_scattered(kernel: str, target: str, config: dict) -> None:
    """A gathered product's x gradient: each product row added into x's row Rows[s] (f32 atomic adds: rows named twice
    get both, rows outside x and product rows past the last offset nothing), then cast_rows_kernel's bf16 copy."""
    grouped = importlib.import_module("tkc.kernels.grouped_gemm")
    from reference import BF16, random_bf16, rel_err

    from tkc.compiler import tensor_alignment

    rng = np.random.default_rng(11)
    slots, k, n, x_rows = 150, 96, 128, 70
    dy, w = random_bf16(rng, slots, k), random_bf16(rng, 4, k, n)
    offsets = np.array([40, 40, 140, 141], dtype=np.int32)
    rows_of = rng.integers(-2, x_rows + 2, size=slots).astype(np.int32)  # repeats, and some outside x
    expected = np.zeros((x_rows, n))
    for g, (start, stop) in enumerate(zip([0, *offsets[:-1]], offsets)):
        part = dy[start:stop].astype(np.float64) @ w[g].astype(np.float64)
        for s, row in zip(range(start, stop), part):
            if 0 <= rows_of[s] < x_rows:
                expected[rows_of[s]] += row
    args = [dy, w, offsets, rows_of, np.zeros((x_rows, n), dtype=np.float32)]
    constants = {"GATHER": 0, "SCATTER": 1, "YT": f32, **config}
    tiles = (n // 64, -(-slots // config.get("BM", 16 * config["WARPS"])) + 4)
    grid = tiles if "BM" in config else (tiles[0] * tiles[1], 1)  # the wgmma kernel: a block a tile
    kernel_fn = getattr(grouped, kernel)
    interp = [t.copy() for t in args]
    kernel_fn.interpret(*interp, grid=grid, **constants)
    assert rel_err(interp[4].astype(np.float64), expected) < 1e-5
    aligns = {p.name: tensor_alignment(t) for p, t in zip(kernel_fn.runtime_params, args) if p.kind == "tensor"}
    sim = [t.copy() for t in args]
    simulate(lower_kernel(kernel_fn, target, constants, aligns=aligns), kernel_fn.name, sim, grid)
    np.testing.assert_allclose(sim[4], interp[4], rtol=1e-5, atol=1e-4)
    cast = [interp[4], np.full((x_rows, n), np.nan, dtype=BF16)]
    simulate(lower_kernel(grouped.cast_rows_kernel, target, {}), "cast_rows_kernel", cast, (-(-x_rows // 64), n // 64))
    np.testing.assert_array_equal(cast[1].astype(np.float32), interp[4].astype(BF16).astype(np.float32))


@tkc.kernel(warps=4, min_target="sm_80")
def vector_rows(L: gl[f32, 3], M: gl[f32, 3], first: int, end: int):
    """Each warp's 16 values from row first + 16·w - 3 of M's second head (rows from `end` on read 0), plus 1, into
    rows first + 16·w .. of L (none from `end` on): rows(r, end) on a register vector's index."""
    values = load(M, (0, 1, rows(first + 16 * warp_id() - 3, end)), rv[f32, 16]) + 1.0
    store(L, values, (0, 0, rows(first + 16 * warp_id(), end)))


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("first, end", [(5, 40), (0, 100), (30, 31), (-7, 20), (90, 200)])
def test_vector_rows_cut_at_an_end(target: str, first: int, end: int) -> None:
    """rows(r, end) in a register vector's global load and store (a packed sequence's per-row values, as
    attention_varlen's log-sum-exps): any r (negative, unaligned), nothing read or written from `end` on or past
    the tensor; the interpreter against numpy, the simulated PTX against the interpreter."""
    m = np.arange(200, dtype=np.float32).reshape(1, 2, 100) + 0.5
    expected = np.full(100, np.nan, np.float32)
    for r in range(max(first, 0), min(first + 64, end, 100)):
        source = r - 3
        expected[r] = (m[0, 1, source] if 0 <= source < min(end, 100) else 0) + 1
    interpreted, simulated = (np.full((1, 1, 100), np.nan, np.float32) for _ in range(2))
    vector_rows.interpret(interpreted, m, first, end, grid=(1,))
    assert np.array_equal(interpreted[0, 0], expected, equal_nan=True)
    simulate(lower_kernel(vector_rows, target, {}), "vector_rows", [simulated, m, first, end], (1,))
    assert np.array_equal(simulated, interpreted, equal_nan=True)


def test_vector_rows_misuse_is_one_error() -> None:
    """rows(...) on a vector goes in its only index place; rows_at picks 2-D tiles' rows only."""
    @tkc.kernel
    def rows_in_the_head_place(L: gl[f32, 3]):
        store(L, zeros(rv[f32, 16]), (0, rows(3), 0))

    @tkc.kernel
    def vector_by_row_numbers(L: gl[f32, 2], I: gl[i32, 1]):
        store(L, zeros(rv[f32, 16]), (0, rows_at(I, 0)))

    with pytest.raises(TkcError, match=r"rows\(\.\.\.\) goes in the row place of a global tensor's index \(index 2\)"):
        compile_kernels([rows_in_the_head_place], "sm_80", {})
    with pytest.raises(TkcError, match=r"rows_at\(\.\.\.\) picks the rows of a register tile's"):
        compile_kernels([vector_by_row_numbers], "sm_80", {})


def test_a_forgotten_vector_end_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lowering that ignores a register vector's end writes rows past it: the simulation then differs from the
    interpreter's result (which test_vector_rows_cut_at_an_end matches with the end)."""
    from tkc.backend import lower_copies, lower_memory  # (imported first: a first import under the patch would keep it)

    m = np.arange(200, dtype=np.float32).reshape(1, 2, 100) + 0.5
    interpreted, simulated = (np.full((1, 1, 100), np.nan, np.float32) for _ in range(2))
    vector_rows.interpret(interpreted, m, 5, 40, grid=(1,))
    for module in (addressing, lower_copies, lower_memory):
        monkeypatch.setattr(module, "row_limit", lambda lw, size, end: size)
    simulate(lower_kernel(vector_rows, "sm_80", {}), "vector_rows", [simulated, m, 5, 40], (1,))
    assert not np.array_equal(simulated, interpreted, equal_nan=True)
    assert np.isfinite(simulated[0, 0, 40:69]).all()  # the rows from the end on, written
