"""Control flow in the tile interpreter: run-time loops and ifs whose path differs between warps and blocks, and
the errors it reports (collective shared-memory ops under warp-divergent control flow, races, bad arguments)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import tkc
from tkc import TkcError
from tkc.errors import KernelArgumentError, KernelTypeError
from tkc.lang import *  # noqa: F403

from .helpers import BF16, assert_same, normal, poisoned

some = settings(max_examples=10)
DIVERGENT = "differs between the warps of a block"


def line_of(kernel: tkc.Kernel, text: str) -> int:
    """The line of `kernel`'s source file that holds `text` (errors must point at it)."""
    lines, first = inspect.getsourcelines(kernel.fn)
    for i, source in enumerate(lines):
        if text in source:
            return first + i
    raise AssertionError(f"{text!r} is not in the kernel")


def raises_at(kernel: tkc.Kernel, text: str, match: str, *args, **kwargs) -> TkcError:
    with pytest.raises(TkcError, match=match) as info:
        kernel.interpret(*args, **kwargs)
    assert info.value.loc is not None and info.value.loc.line == line_of(kernel, text), str(info.value)
    return info.value


# --------------------------------------------------------------------------------------------------------------
# Loops with trip counts that differ between lanes


@tkc.kernel(warps=4)
def lane_loops(Y: gl[f32, 2], C: gl[f32, 2], n: int):
    """Warp w of block b: acc = Σ_{k < w + n - 2b} (k + 1); cnt counts the iterations of a nested loop whose
    inner trip count depends on the block and the outer loop variable."""
    b = block_idx()[0]
    w = warp_id()
    acc = zeros(rt[f32, 16, 16])
    for k in range(w + n - 2 * b):  # zero or negative trip counts for some lanes
        acc = acc + float(k + 1)
    cnt = 0.0
    for i in range(b, w + 1):
        for j in range(i * b):
            cnt = cnt + 1.0
    store(Y, acc, (b * 4 + w, 0))
    store(C, zeros(rv[f32, 16]) + cnt, (b * 4 + w, 0))


@some
@given(blocks=hs.integers(1, 4), n=hs.integers(-3, 3))
def test_loops_with_lane_dependent_trip_counts(blocks: int, n: int) -> None:
    y, c = poisoned(blocks * 64, 16), poisoned(blocks * 4, 16)
    lane_loops.interpret(y, c, n, grid=blocks)
    for b in range(blocks):
        for w in range(4):
            trips = max(w + n - 2 * b, 0)
            assert_same(y[(b * 4 + w) * 16:(b * 4 + w + 1) * 16], np.full((16, 16), trips * (trips + 1) / 2))
            count = sum(i * b for i in range(b, w + 1))
            assert_same(c[b * 4 + w], np.full(16, count))


@tkc.kernel(warps=4)
def persistent_divisions(Y: gl[f32, 2], n: int, d: int):
    """A persistent loop over n items whose divisor is zero just past the last one (n - i): the lanes that have
    finished (still computed beside the others) must not fail the division; `d` divides on every lane."""
    for i in range(block_idx()[0], n, num_blocks()[0]):
        store(Y, zeros(rt[f32, 16, 16]) + float(n // (n - i) + i // d), (i, 0))


def test_divisions_by_zero_only_on_running_lanes() -> None:
    y = poisoned(5 * 16, 16)
    persistent_divisions.interpret(y, 5, 1, grid=3)
    assert_same(y.reshape(5, 16, 16)[:, 0, 0], np.array([5 // (5 - i) + i for i in range(5)], dtype=np.float32))
    raises_at(persistent_divisions, "n // (n - i)", "integer division by zero", poisoned(5 * 16, 16), 5, 0, grid=3)


@tkc.kernel(warps=4)
def strided(X: gl[f32, 2], Y: gl[f32, 2], N: const = 6):
    """Warp w sums sub-tiles w, w+4, ... of a shared tile holding N of them: lanes that are done hold a loop
    variable past the end of the shared tile, which must not matter."""
    s = load(X, (0, 0), st[f32, 16 * N, 16])
    acc = zeros(rt[f32, 16, 16])
    for k in range(warp_id(), N, 4):
        acc = acc + load(s, (k, 0), rt[f32, 16, 16])
    store(Y, acc, (warp_id(), 0))


@pytest.mark.parametrize("n", [1, 3, 4, 6, 9])
def test_strided_loop_over_shared_subtiles(n: int) -> None:
    x = normal(np.random.default_rng(n), 16 * n, 16)
    y = poisoned(64, 16)
    strided.interpret(x, y, grid=1, N=n)
    tiles = x.reshape(n, 16, 16)
    for w in range(4):
        expect = np.zeros((16, 16), np.float32)
        for k in range(w, n, 4):
            expect = expect + tiles[k]
        assert_same(y[16 * w:16 * (w + 1)], expect)


@tkc.kernel(warps=2)
def block_loop_shared(X: gl[f32, 2], Y: gl[f32, 2], C: gl[f32, 1]):
    """Block b runs b iterations (block 0 none); each stages a tile in shared memory and accumulates it into a
    shared tile carried by the loop. All warps of a block agree, so the collective ops are allowed."""
    b = block_idx()[0]
    t = (b * 2 + warp_id()) // 2  # == b, but computed per warp: the loop mask has a warp axis
    acc_s = zeros(st[f32, 32, 16])
    count_s = zeros(sv[f32, 16])
    for k in range(t):
        x_s = load(X, (k, 0), st[f32, 32, 16])
        part = load(x_s, (warp_id(), 0), rt[f32, 16, 16]) + load(acc_s, (warp_id(), 0), rt[f32, 16, 16])
        barrier()
        acc_s = store(acc_s, part, (warp_id(), 0))
        count_s = store(count_s, load(count_s) + 1.0)  # the same value and index in every warp
    store(Y, acc_s, (b, 0))
    store(C, count_s, (b,))


def test_block_dependent_loop_with_shared_memory() -> None:
    x = normal(np.random.default_rng(0), 32 * 4, 16)
    y, c = poisoned(32 * 4, 16), poisoned(16 * 4)
    block_loop_shared.interpret(x, y, c, grid=4)
    tiles = x.reshape(4, 32, 16)
    for b in range(4):
        expect = np.zeros((32, 16), np.float32)
        for k in range(b):
            expect = expect + tiles[k]
        assert_same(y[32 * b:32 * (b + 1)], expect)
        assert_same(c[16 * b:16 * (b + 1)], np.full(16, b))


# --------------------------------------------------------------------------------------------------------------
# Ifs that differ between lanes


@tkc.kernel(warps=4)
def lane_ifs(X: gl[f32, 2], Y: gl[f32, 2], Z: gl[f32, 2], t: int):
    b = block_idx()[0]
    w = warp_id()
    x = load(X, (b * 4 + w, 0), rt[f32, 16, 16])
    y = x
    if w % 2 == 0:
        y = x * 2.0
        if b + w > t:  # nested, differs per block and warp
            y = y + 100.0
        else:
            y = -y
    elif w == 1:
        for k in range(b):  # a loop inside one branch
            y = y + 1.0
    if w == 3:  # only warp 3 of each block stores into Z (its own value, at one index per block)
        store(Z, y, (b, 0))
    store(Y, y, (b * 4 + w, 0))


@some
@given(blocks=hs.integers(1, 3), t=hs.integers(-1, 5), seed=hs.integers(0, 2**32 - 1))
def test_ifs_that_differ_between_lanes(blocks: int, t: int, seed: int) -> None:
    x = normal(np.random.default_rng(seed), blocks * 64, 16)
    y, z = poisoned(blocks * 64, 16), poisoned(blocks * 16, 16)
    lane_ifs.interpret(x, y, z, t, grid=blocks)
    for b in range(blocks):
        for w in range(4):
            rows = slice((b * 4 + w) * 16, (b * 4 + w + 1) * 16)
            xt = x[rows]
            if w % 2 == 0:
                expect = xt * 2 + 100 if b + w > t else -(xt * 2)
            elif w == 1:
                expect = xt
                for _ in range(b):
                    expect = expect + np.float32(1)
            else:
                expect = xt
            assert_same(y[rows], expect)
        assert_same(z[16 * b:16 * (b + 1)], x[(b * 4 + 3) * 16:(b * 4 + 4) * 16])


@tkc.kernel(warps=2)
def block_ifs(X: gl[bf16, 2], Y: gl[bf16, 2]):
    """Ifs that differ between blocks but not within one: shared memory and barriers are allowed in them."""
    b = block_idx()[0]
    s = empty(st[bf16, 32, 16])
    if b % 2 == 0:
        s = load(X, (b, 0), st[bf16, 32, 16])
        barrier()
    else:
        s = store(s, load(X, (b, 0), rt[f32, 32, 16]) * 3.0)
    if b < 2:
        store(Y, s, (b, 0))
    else:
        store(Y, load(s, (warp_id(), 0), rt[f32, 16, 16]) + 1.0, (b * 2 + warp_id(), 0))


def test_block_divergent_ifs_allow_shared_memory() -> None:
    x = normal(np.random.default_rng(1), 32 * 4, 16).astype(BF16)
    y = poisoned(32 * 4, 16, dtype=BF16)
    block_ifs.interpret(x, y, grid=4)
    xf = x.astype(np.float32)
    tiles = [xf[32 * b:32 * (b + 1)] for b in range(4)]
    expect = [tiles[0], tiles[1] * 3, tiles[2] + 1, tiles[3] * 3]
    expect = [e.astype(BF16).astype(np.float32) for e in expect]
    expect[3] = (expect[3] + 1).astype(BF16).astype(np.float32)
    assert_same(y, np.concatenate(expect))


@tkc.kernel(warps=4)
def early_exit(X: gl[f32, 2], Y: gl[f32, 2], limit: float):
    """Each warp adds tiles to its running sum until the sum of its row maxima passes `limit`: an `if` on a
    per-warp flag inside a run-time loop stands in for `break`."""
    w = warp_id()
    acc = zeros(rt[f32, 16, 16])
    done = 0
    for k in range(X.shape[0] // 64):
        if done == 0:
            acc = acc + load(X, (k * 4 + w, 0), rt[f32, 16, 16])
            if sum(row_max(acc)) > limit:
                done = 1
    store(Y, acc, (w, 0))


def test_per_warp_early_exit() -> None:
    x = np.abs(normal(np.random.default_rng(2), 16 * 16, 16)) + 0.1
    y = poisoned(64, 16)
    limit = 200.0
    early_exit.interpret(x, y, limit, grid=1)
    tiles = x.reshape(4, 4, 16, 16)
    for w in range(4):
        acc = np.zeros((16, 16), np.float32)
        for k in range(4):
            acc = acc + tiles[k, w]
            if acc.max(axis=1).sum() > limit:
                break
        assert_same(y[16 * w:16 * (w + 1)], acc)


# --------------------------------------------------------------------------------------------------------------
# Errors: collective ops under warp-divergent control flow


@tkc.kernel(warps=4)
def shared_load_in_warp_if(X: gl[f32, 2], Y: gl[f32, 2]):
    y = zeros(rt[f32, 16, 16])
    if warp_id() < 2:
        s = load(X, (0, 0), st[f32, 16, 16])
        y = load(s)
    store(Y, y, (warp_id(), 0))


@tkc.kernel(warps=4)
def shared_store_in_warp_if(X: gl[f32, 2], Y: gl[f32, 2]):
    s = zeros(st[f32, 64, 16])
    x = load(X, (warp_id(), 0), rt[f32, 16, 16])
    if warp_id() != 3:
        s = store(s, x, (warp_id(), 0))
    store(Y, s, (0, 0))


@tkc.kernel(warps=4)
def shared_to_global_in_warp_if(X: gl[f32, 2], Y: gl[f32, 2]):
    s = load(X, (0, 0), st[f32, 16, 16])
    if warp_id() == 0:
        store(Y, s, (0, 0))


@tkc.kernel(warps=2)
def barrier_in_warp_if(X: gl[f32, 2], Y: gl[f32, 2]):
    y = zeros(rt[f32, 16, 16])
    if warp_id() == 1:
        barrier()
        y = y + 1.0
    store(Y, y, (warp_id(), 0))


@tkc.kernel(warps=2)
def barrier_in_warp_loop(X: gl[f32, 2], Y: gl[f32, 2]):
    y = zeros(rt[f32, 16, 16])
    for k in range(warp_id() + 1):
        y = y + 1.0
        barrier()
    store(Y, y, (warp_id(), 0))


@tkc.kernel(warps=2)
def shared_fill_in_warp_loop(X: gl[f32, 2], Y: gl[f32, 2]):
    y = zeros(rt[f32, 16, 16])
    for k in range(warp_id()):
        y = y + load(ones(st[f32, 16, 16]))
    store(Y, y, (warp_id(), 0))


@tkc.kernel(warps=2)
def empty_in_warp_if(X: gl[f32, 2], Y: gl[f32, 2]):
    if warp_id() == 0:
        s = empty(st[f32, 16, 16])
        store(Y, load(s), (0, 0))


@pytest.mark.parametrize(
    "kernel, text, what",
    [
        (shared_load_in_warp_if, "s = load(X", "a load into shared memory"),
        (shared_store_in_warp_if, "s = store(s, x", "a store into shared memory"),
        (shared_to_global_in_warp_if, "store(Y, s", "a store from shared memory"),
        (barrier_in_warp_if, "barrier()", "a barrier"),
        (barrier_in_warp_loop, "barrier()", "a barrier"),
        (shared_fill_in_warp_loop, "ones(st", "a shared fill"),
        (empty_in_warp_if, "empty(st", "an empty shared tile"),
    ],
    ids=lambda v: v.name if isinstance(v, tkc.Kernel) else None,
)
def test_collective_op_under_warp_divergence(kernel: tkc.Kernel, text: str, what: str) -> None:
    x, y = normal(np.random.default_rng(0), 64, 16), poisoned(64, 16)
    raises_at(kernel, text, f"{what} runs under control flow that {DIVERGENT}", x, y, grid=2)


def test_collective_op_is_fine_when_the_divergence_is_between_blocks() -> None:
    """The same shapes of code as above, diverging on the block index instead: no error."""
    y = poisoned(64, 16)

    @tkc.kernel(warps=2)
    def per_block(X: gl[f32, 2], Y: gl[f32, 2]):
        b = block_idx()[0]
        y = zeros(rt[f32, 16, 16])
        for k in range(b):
            barrier()
            y = y + load(load(X, (k, 0), st[f32, 16, 16]))
        if b == 1:
            barrier()
        store(Y, y, (b * 2 + warp_id(), 0))

    x = normal(np.random.default_rng(0), 64, 16)
    per_block.interpret(x, y, grid=2)
    assert_same(y[:32], np.zeros((32, 16)))
    assert_same(y[32:], np.concatenate([x[:16], x[:16]]))


@tkc.kernel(warps=4)
def shared_load_per_warp_index(X: gl[f32, 2], Y: gl[f32, 2]):
    s = load(X, (warp_id(), 0), st[f32, 16, 16])
    store(Y, load(s), (warp_id(), 0))


@tkc.kernel(warps=2)
def shared_store_per_warp_index(X: gl[f32, 2], Y: gl[f32, 2]):
    s = load(X, (0, 0), st[f32, 16, 16])
    store(Y, s, (warp_id(), 0))


def test_shared_load_index_differs_between_warps() -> None:
    x, y = normal(np.random.default_rng(0), 64, 16), poisoned(64, 16)
    raises_at(shared_load_per_warp_index, "s = load(X", f"the index of a load into shared memory {DIVERGENT}",
              x, y, grid=1)
    raises_at(shared_store_per_warp_index, "store(Y, s", f"the index of a store from shared memory {DIVERGENT}",
              x, y, grid=1)


# --------------------------------------------------------------------------------------------------------------
# Errors: races


@tkc.kernel(warps=2)
def global_race(X: gl[f32, 2], Y: gl[f32, 2], SAME: const = 0):
    # with SAME, every lane loads tile 0, through an index computed per lane (so the value is held per lane)
    x = load(X, ((warp_id() + block_idx()[0]) * 0 if SAME else warp_id(), 0), rt[f32, 16, 16])
    store(Y, x, (0, 0))


@tkc.kernel(warps=1)
def block_race(X: gl[f32, 2], Y: gl[f32, 2]):
    x = load(X, (block_idx()[0], 0), rt[f32, 16, 16])
    store(Y, x, (block_idx()[0] // 2, 0))  # blocks 2k and 2k+1 write one tile


@tkc.kernel(warps=2)
def partial_race(X: gl[f32, 2], Y: gl[f32, 2]):
    """Both warps write one tile: warp 0 zeros above the diagonal, warp 1 keeps it. They race exactly when X
    has something above the diagonal."""
    x = load(X, (0, 0), rt[f32, 32, 16])
    store(Y, tril(x, warp_id() * 100), (0, 0))


@tkc.kernel(warps=2)
def shared_race(X: gl[f32, 2], Y: gl[f32, 2]):
    s = empty(st[f32, 32, 16])
    s = store(s, load(X, (warp_id(), 0), rt[f32, 16, 16]), (0, 0))
    store(Y, s, (0, 0))


def test_store_races() -> None:
    rng = np.random.default_rng(0)
    x, y = normal(rng, 64, 16), poisoned(64, 16)
    raises_at(global_race, "store(Y, x", "a store into `Y`: different warps write different values to the same "
              "element", x, y, grid=1)
    raises_at(block_race, "store(Y, x", "a store into `Y`: different warps write different values", x, y, grid=4)
    raises_at(shared_race, "s = store(s", "a store into a shared tile: different warps write different values",
              x, y, grid=1)
    raises_at(partial_race, "store(Y, tril", "different warps write different values", x, y, grid=1)
    lower = np.tril(x)
    partial_race.interpret(lower, y, grid=1)  # both warps write the same values: no race
    assert_same(y[:32], lower[:32])


def test_same_value_from_several_warps_is_not_a_race() -> None:
    x, y = normal(np.random.default_rng(0), 64, 16), poisoned(64, 16)
    global_race.interpret(x, y, grid=3, SAME=1)
    assert_same(y[:16], x[:16])
    assert np.isnan(y[16:]).all()
    x[:16] = np.nan  # NaN written by several warps is not a race either
    global_race.interpret(x, y, grid=3, SAME=1)
    assert np.isnan(y).all()


def test_masked_lanes_do_not_race() -> None:
    """Warp 3 alone stores its own tile at a fixed index (lane_ifs): the other warps hold different values there
    but are inactive."""
    x = normal(np.random.default_rng(3), 64, 16)
    y, z = poisoned(64, 16), poisoned(16, 16)
    lane_ifs.interpret(x, y, z, 0, grid=1)
    assert_same(z, x[48:])


# --------------------------------------------------------------------------------------------------------------
# Errors: arguments of interpret


@tkc.kernel(warps=1)
def takes_args(X: gl[bf16, 2], Y: gl[f32, 3], n: int, eps: float):
    store(Y, load(X, (0, 0), rt[f32, 16, 16]) * eps, (n, 0, 0))


def _good_args() -> list:
    return [np.zeros((16, 16), BF16), np.zeros((2, 16, 16), np.float32), 1, 0.5]


@pytest.mark.parametrize(
    "position, value, error, match",
    [
        (0, np.zeros((16, 16), np.float32), KernelArgumentError, r"argument `X` must hold bf16 \(bfloat16\), got float32"),
        (1, np.zeros((2, 16, 16), np.float64), KernelArgumentError, r"argument `Y` must hold f32 \(float32\), got float64"),
        (0, np.zeros((1, 16, 16), BF16), KernelArgumentError, r"argument `X` must have rank 2, got shape \(1, 16, 16\)"),
        (1, np.zeros((16, 16), np.float32), KernelArgumentError, r"argument `Y` must have rank 3, got shape \(16, 16\)"),
        (0, [[0.0] * 16] * 16, KernelTypeError, r"argument `X` must be a numpy array or a CPU torch tensor, got list"),
        (1, 3.0, KernelTypeError, r"argument `Y` must be a numpy array or a CPU torch tensor, got float"),
        (2, np.zeros(1), KernelTypeError, r"argument `n` must be a number, got ndarray"),
        (2, 1.5, KernelTypeError, r"argument `n` must be an int, got 1.5"),
        (3, "0.5", KernelTypeError, r"argument `eps` must be a number, got str"),
        (2, True, KernelTypeError, r"argument `n` must be a number, got bool"),
    ],
)
def test_interpret_argument_errors(position: int, value, error: type, match: str) -> None:
    args = _good_args()
    args[position] = value
    with pytest.raises(error, match=match):
        takes_args.interpret(*args, grid=1)


def test_interpret_argument_count_and_grid() -> None:
    with pytest.raises(KernelArgumentError, match=r"takes 4 arguments \(X, Y, n, eps\), got 3"):
        takes_args.interpret(*_good_args()[:3], grid=1)
    with pytest.raises(KernelArgumentError, match=r"takes 4 arguments \(X, Y, n, eps\), got 5"):
        takes_args.interpret(*_good_args(), 1, grid=1)
    for grid in (0, (1, 1, 1, 1), (2, -1), ()):
        with pytest.raises(KernelArgumentError, match="grid must be 1 to 3 positive integers"):
            takes_args.interpret(*_good_args(), grid=grid)
    args = _good_args()
    takes_args.interpret(*args, grid=(1, 1, 1))  # and the good arguments do run
    assert (args[1] == 0).all()


def test_torch_tensors_are_accepted_and_written() -> None:
    torch = pytest.importorskip("torch")
    x = torch.randn(16, 16).to(torch.bfloat16)
    y = torch.full((2, 16, 16), float("nan"))
    takes_args.interpret(x, y, 1, 2.0, grid=1)
    assert torch.equal(y[1], x.float() * 2)
    assert torch.isnan(y[0]).all()
