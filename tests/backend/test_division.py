"""Unsigned division and remainder by a constant lower to a multiply-high and a shift (ring stages: k // 3, k % 3),
not to `div.u32`, which ptxas expands through a float reciprocal. The magic numbers are exact for every u32; the
simulator runs `mul.hi.u32`; a wrong magic number breaks the TMA ring, and the PTX simulation catches it."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import attention_ref, poisoned, random_bf16, rel_err

from backend.test_simulate import run_both
from tkc.backend import lowering
from tkc.backend.simulator import SimulationError, execute
from tkc.compiler import compile_kernels
from tkc.kernels import attention_sm90


@given(divisor=st.integers(2, 5000), x=st.integers(0, 2**32 - 1))
@settings(max_examples=400, deadline=None)
def test_magic_division_is_exact(divisor: int, x: int) -> None:
    magic = lowering._division_magic(divisor)
    if magic is None:
        return
    m, extra = magic
    assert m < 2**32
    for value in (x, 2**32 - 1, divisor * (x // divisor), divisor * (x // divisor) - 1 if x >= divisor else 0):
        assert (value * m) >> (32 + extra) == value // divisor
        high = execute("mul.hi.u32", [np.array([value], dtype=np.uint32), np.array([m], dtype=np.uint32)])
        assert int(high[0]) >> extra == value // divisor


def test_tile_indices_divide_unsigned() -> None:
    """attention_sm90's tile loop splits its index (from block_idx by num_blocks) into query block, head and batch by
    floor divisions by tensor sizes: all non-negative, so one div.u32 each, without the signed fix-ups; only the
    ring's trip count (ub - lb, which may be negative) stays signed."""
    ptx = compile_kernels([attention_sm90], "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "STAGES": 3})
    assert ptx.count("div.s32") == 1 and ptx.count("rem.s32") == 1 and ptx.count("div.u32") >= 4


def test_causal_tile_order_divides_unsigned() -> None:
    """Causal, the tile loop also orders the tiles by groups of 8 heads (rank = tile % (8·q_blocks), then by the
    group's head count, ≥ 1): the compiler sees Python's % of non-negative values as non-negative, so those divide
    unsigned too (with the signed fix-ups the producer warpgroup of 24 registers spilled at D = 256)."""
    ptx = compile_kernels([attention_sm90], "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "STAGES": 3, "CAUSAL": 1})
    assert ptx.count("div.s32") == 1 and ptx.count("rem.s32") == 1 and ptx.count("div.u32") >= 10


def test_most_small_divisors_avoid_div() -> None:
    assert [d for d in range(2, 17) if lowering._division_magic(d) is None] == [7, 14]
    ptx = compile_kernels([attention_sm90], "sm_90a", {"D": 64, "KEYS": 64, "WARPS": 8, "STAGES": 3})
    # (the tile loop divides by run-time values: its tile index by the query blocks and heads, once per tile)
    assert not re.search(r"(div|rem)\.[us]32\s+%r\d+, %r\d+, -?\d+;", ptx) and "mul.hi.u32" in ptx


def _attention_simulated() -> tuple:
    rng = np.random.default_rng(3)
    nq, nk, d = 64, 520, 64  # 9 key blocks through a 3-stage ring
    args = [random_bf16(rng, 1, 1, nq, d), random_bf16(rng, 1, 1, nk, d), random_bf16(rng, 1, 1, nk, d),
            poisoned(1, 1, nq, d), poisoned(1, 1, nq, dtype=np.float32), d**-0.5]
    constants = {"D": d, "KEYS": 64, "WARPS": 4, "STAGES": 3, "LSE": 1}
    interp, sim = run_both(attention_sm90, args, (1, 1, 1), constants, target="sm_90a", order="shuffled")
    return args, interp, sim


def test_ring_with_three_stages_agrees() -> None:
    args, interp, sim = _attention_simulated()
    assert rel_err(interp[3], attention_ref(*args[:3], scale=64**-0.5)) < 2e-2
    assert rel_err(sim[3], interp[3]) < 2e-3


def test_a_wrong_magic_number_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = lowering._division_magic
    monkeypatch.setattr(lowering, "_division_magic", lambda d: (real(d)[0] - 1, real(d)[1]) if real(d) else None)
    try:
        _, interp, sim = _attention_simulated()
    except SimulationError:
        return
    assert not rel_err(sim[3], interp[3]) < 2e-3
