"""Every tile-level pass leaves the kernel's meaning unchanged: the interpreter gives the same answer before and
after it, on random inputs (hypothesis), for the shipped kernels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import poisoned, random_bf16

from tkc.kernels import attention_fwd, gemm_kernel, layernorm_kernel

from .helpers import before_and_after

PASSES = ["canonicalize,cse", "insert-async-pipeline{stages=2}", "insert-async-pipeline{stages=3}",
          "insert-async-pipeline{stages=4}", "assign-layouts", "assign-swizzles", "allocate-shared", "insert-barriers"]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.astype(np.float32), b.astype(np.float32), equal_nan=True)


@pytest.mark.parametrize("pipeline", PASSES)
@given(m=st.integers(1, 200), n=st.integers(1, 200), k=st.integers(1, 160), trans_b=st.booleans(), seed=st.integers(0, 2**31))
@settings(max_examples=5, deadline=None)
def test_gemm(pipeline: str, m: int, n: int, k: int, trans_b: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = random_bf16(rng, m, k)
    b = random_bf16(rng, *((n, k) if trans_b else (k, n)))
    before, after, _ = before_and_after(gemm_kernel, pipeline, [a, b, poisoned(m, n)], (-(-n // 128) * -(-m // 128),),
                                        {"TRANS_B": int(trans_b)})
    assert _same(before[2], after[2])


@pytest.mark.parametrize("pipeline", PASSES)
@given(blocks=st.integers(1, 5), causal=st.integers(0, 1), seed=st.integers(0, 2**31))
@settings(max_examples=4, deadline=None)
def test_attention(pipeline: str, blocks: int, causal: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 64 * blocks
    q, k, v = (random_bf16(rng, 1, 2, n, 64) for _ in range(3))
    before, after, _ = before_and_after(attention_fwd, pipeline, [q, k, v, poisoned(1, 2, n, 64), 0.125], (blocks, 2, 1),
                                        {"D": 64, "CAUSAL": causal})
    assert _same(before[3], after[3])


@pytest.mark.parametrize("pipeline", PASSES)
def test_layernorm(pipeline: str) -> None:
    rng = np.random.default_rng(0)
    rows, d = 7, 64
    args = [random_bf16(rng, rows, d), random_bf16(rng, rows, d), random_bf16(rng, d), random_bf16(rng, d),
            poisoned(rows, d), poisoned(rows, d), 1e-5]
    before, after, _ = before_and_after(layernorm_kernel, pipeline, args, (2,), {"D": d, "WARPS": 2})
    assert _same(before[4], after[4]) and _same(before[5], after[5])
