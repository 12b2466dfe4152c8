"""Kernels written as a user would (tests/kernels/), run by the tile interpreter against float64 references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kernels.gemm_bias_gelu import gemm_bias_gelu
from kernels.last_block_sum import last_block_sum
from kernels.row_softmax import WARPS, row_softmax
from kernels.sliding_window_attention import sliding_window_attention
from reference import BF16, attention_ref, f64, gelu_tanh, gemm_ref, poisoned, random_bf16, rel_err, softmax_ref

from tkc import TkcError

TOL = 1e-2


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@given(
    m=st.integers(1, 150),
    n=st.integers(1, 150),
    k=st.integers(1, 100),
    block=st.sampled_from([(64, 64, 32), (32, 64, 16), (64, 32, 64)]),
    seed=st.integers(0, 2**32 - 1),
)
def test_gemm_bias_gelu(m: int, n: int, k: int, block: tuple[int, int, int], seed: int) -> None:
    bm, bn, bk = block
    rng = np.random.default_rng(seed)
    # pre-activations of about unit size, as in a network: far below -5 the tanh form of GELU cancels (see below)
    a, b, bias = random_bf16(rng, m, k, scale=k**-0.5), random_bf16(rng, k, n), random_bf16(rng, n, scale=0.5)
    c = poisoned(m, n)
    gemm_bias_gelu.interpret(a, b, bias, c, grid=(cdiv(n, bn), cdiv(m, bm)), BM=bm, BN=bn, BK=bk)
    ref = gelu_tanh(gemm_ref(a, b) + f64(bias)[None, :])
    # all of a few outputs near zero (pre-activations near -5: GELU ~1e-7, where 1 + tanh cancels in f32) have no
    # meaningful relative error: there, an absolute one
    assert rel_err(c, ref) < TOL or np.abs(f64(c) - ref).max() < 1e-5


def test_gemm_bias_gelu_bias_is_per_column() -> None:
    """With A = 0 the output is gelu(bias) broadcast down the columns: catches a bias added along rows."""
    rng = np.random.default_rng(1)
    m, n, k = 40, 96, 16
    a, b, bias = np.zeros((m, k), dtype=BF16), random_bf16(rng, k, n), random_bf16(rng, n, scale=2)
    c = poisoned(m, n)
    gemm_bias_gelu.interpret(a, b, bias, c, grid=(cdiv(n, 64), cdiv(m, 64)))
    assert rel_err(c, np.broadcast_to(gelu_tanh(f64(bias)), (m, n))) < TOL


def test_gemm_bias_gelu_negative_tail() -> None:
    """Far below 0, 1 + tanh(z) cancels in f32: gelu(-7) ≈ -4e-16 comes out as -0, a relative error of 1 (and
    tanh.approx on the GPU fares no better). The absolute error stays at f32's epsilon times |x|."""
    m, n, k = 16, 64, 16
    a = np.zeros((m, k), dtype=BF16)
    a[:, 0] = 1
    b = np.zeros((k, n), dtype=BF16)
    b[0] = np.linspace(-8, 3, n)
    c = poisoned(m, n)
    gemm_bias_gelu.interpret(a, b, np.zeros(n, dtype=BF16), c, grid=(1, 1))
    ref = np.broadcast_to(gelu_tanh(f64(b[0])), (m, n))
    assert (np.abs(f64(c) - ref) <= 2**-8 * np.abs(ref) + 8 * 2**-22).all()  # bf16 rounding + f32 cancellation
    assert rel_err(c[:, n // 2:], ref[:, n // 2:]) < TOL  # x >= -2.4: accurate


@given(
    m=st.integers(1, 140),
    n=st.sampled_from([16, 48, 128, 7, 100, 200]),
    scale=st.sampled_from([0.1, 1.0, 8.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_row_softmax(m: int, n: int, scale: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = random_bf16(rng, m, n, scale=scale)
    y = poisoned(m, n)
    row_softmax.interpret(x, y, grid=(cdiv(m, 16 * WARPS),), N=n)
    assert rel_err(y, softmax_ref(x)) < TOL
    np.testing.assert_allclose(f64(y).sum(-1), 1.0, atol=2e-2)


def test_row_softmax_large_negative_rows() -> None:
    """Rows whose values are all far below 0: padding must not leak into the sum (it reads zeros)."""
    x = (np.random.default_rng(2).standard_normal((20, 100)) - 60.0).astype(BF16)
    y = poisoned(20, 100)
    row_softmax.interpret(x, y, grid=(1,), N=100)
    assert rel_err(y, softmax_ref(x)) < TOL


@pytest.mark.parametrize("window", [64, 128])
@given(
    batch=st.integers(1, 2),
    heads=st.integers(1, 2),
    blocks=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_sliding_window_attention(window: int, batch: int, heads: int, blocks: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 64 * blocks
    q, k, v = (random_bf16(rng, batch, heads, n, 64) for _ in range(3))
    o = poisoned(batch, heads, n, 64)
    sliding_window_attention.interpret(q, k, v, o, grid=(batch, heads, blocks), WINDOW=window)
    assert rel_err(o, attention_ref(q, k, v, causal=True, window=window)) < TOL


def test_sliding_window_attention_d128_and_wide_window() -> None:
    """D=128, and a window wider than the sequence (then it is plain causal attention)."""
    rng = np.random.default_rng(3)
    q, k, v = (random_bf16(rng, 1, 1, 192, 128) for _ in range(3))
    for window in (64, 256):
        o = poisoned(1, 1, 192, 128)
        sliding_window_attention.interpret(q, k, v, o, grid=(1, 1, 3), D=128, WINDOW=window)
        assert rel_err(o, attention_ref(q, k, v, causal=True, window=window)) < TOL


def test_sliding_window_attention_visits_only_the_window() -> None:
    """Keys outside every window of a block do not matter, even as NaN (so they were not loaded into the sum)."""
    rng = np.random.default_rng(4)
    q, k, v = (random_bf16(rng, 1, 1, 256, 64) for _ in range(3))
    ref = attention_ref(q, k, v, causal=True, window=64)
    k[..., :64, :] = np.nan  # block 0 of keys: only query block 0 and 1 may look at it
    v[..., :64, :] = np.nan
    o = poisoned(1, 1, 256, 64)
    sliding_window_attention.interpret(q, k, v, o, grid=(1, 1, 4), WINDOW=64)
    assert rel_err(o[..., 128:, :], ref[..., 128:, :]) < TOL


def test_sliding_window_attention_rejects_bad_window() -> None:
    q = random_bf16(np.random.default_rng(0), 1, 1, 64, 64)
    with pytest.raises(TkcError, match="WINDOW must be a positive multiple of 64"):
        sliding_window_attention.interpret(q, q, q, poisoned(1, 1, 64, 64), grid=(1, 1, 1), WINDOW=96)


@given(blocks=st.integers(1, 9), counters=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_last_block_sum(blocks: int, counters: int, seed: int) -> None:
    """arrive_last: the grid's last block to arrive sums the parts the others left, in one launch; the counter is
    back at 0 after each launch, so a second launch (on new inputs) finishes too."""
    rng = np.random.default_rng(seed)
    counter = np.zeros(counters, np.int32)
    for _ in range(2):
        x = rng.standard_normal((32 * blocks, 64)).astype(np.float32)
        parts, out = np.full_like(x, np.nan), np.full((32, 64), np.nan, np.float32)
        last_block_sum.interpret(x, parts, out, counter, grid=(blocks,), N=64)
        assert rel_err(out, x.reshape(blocks, 32, 64).astype(np.float64).sum(0)) < 1e-6
        assert not counter.any()
