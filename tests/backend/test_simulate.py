"""The lowered PTX (the `ptx` dialect, simulated per thread on the CPU) gives the tile interpreter's answer.

Random inputs, outputs poisoned with NaN first, warps scheduled in different orders between barriers (so a missing
barrier shows up), ragged shapes (so a missing bound check shows up as an illegal address or a wrong edge)."""

from __future__ import annotations

import numpy as np
import pytest
from reference import (attention_ref, f64, poisoned, random_bf16, rel_err, varlen_attention_backward_ref,
                       varlen_attention_ref)

import tkc
from tkc.backend.simulator import simulate
from tkc.compiler import compile_kernels, lower_kernel, tensor_alignment
from tkc.kernels import attention_fwd, attention_fwd_lse, gemm_kernel, layernorm_kernel, rotary_kernel
from tkc.kernels.attention import longest_first
from tkc.lang import (atomic_add, bf16, block_idx, const, empty, exp2, f32, gl, keep_cols, keep_rows, load, mma_AB, mma_ABt, mma_AtB, mma_AtBt,
                      num_blocks, rotate_pairs, row_max, rows, rt, rv, st, store, sub_row, sv, warp_id, zeros)

ORDERS = ["ascending", "descending", "shuffled"]


@tkc.kernel(warps=1, min_target="sm_80")
def shared_operand_mma(A: gl[bf16, 2], B: gl[bf16, 2], C: gl[f32, 2], VARIANT: const = "AB"):
    """One warp: both operands staged in shared memory and fed to the mma straight from there (streamed)."""
    a_s = load(A, (0, 0), st[bf16, 32, 32])
    b_s = load(B, (0, 0), st[bf16, 32, 32])
    if VARIANT == "AB":
        c = mma_AB(load(a_s), load(b_s), zeros(rt[f32, 32, 32]))
    elif VARIANT == "ABt":
        c = mma_ABt(load(a_s), load(b_s), zeros(rt[f32, 32, 32]))
    elif VARIANT == "AtB":
        c = mma_AtB(load(a_s), load(b_s), zeros(rt[f32, 32, 32]))
    else:
        c = mma_AtBt(load(a_s), load(b_s), zeros(rt[f32, 32, 32]))
    store(C, c, (0, 0))


UNREAD_LENGTHS = np.zeros(1, np.int32)  # the decoding kernels' Lengths, unread without LENGTHS
UNREAD_PAGES = np.zeros((1, 1), np.int32)  # and their Pages, unread without PAGED


def run_both(kernel, args, grid, constants=None, target="sm_80", order="ascending", tensors=None):
    """Interpret the tile IR and simulate the PTX on copies of the same arguments; return both results."""
    aligns = {p.name: tensor_alignment(a) for p, a in zip(kernel.runtime_params, args) if p.kind == "tensor"}
    module = lower_kernel(kernel, target, constants, aligns=aligns)
    interp_args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    sim_args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    kernel.interpret(*interp_args, grid=grid, **(constants or {}))
    simulate(module, kernel.name, sim_args, grid, order=order)
    return interp_args, sim_args


@pytest.mark.parametrize("variant", ["AB", "ABt", "AtB", "AtBt"])
def test_mma_operands_streamed_from_shared(variant: str) -> None:
    """Each operand role and layout takes its own ldmatrix matrix order (so the mma needs no register moves)."""
    rng = np.random.default_rng(len(variant))
    a, b = random_bf16(rng, 32, 32), random_bf16(rng, 32, 32)
    c = np.full((32, 32), np.nan, np.float32)
    interp, sim = run_both(shared_operand_mma, [a, b, c], (1,), {"VARIANT": variant})
    af, bf = a.astype(np.float64), b.astype(np.float64)
    af = af.T if "At" in variant else af
    bf = bf.T if variant.endswith("Bt") else bf
    assert rel_err(interp[2], af @ bf) < 1e-5
    assert rel_err(sim[2], interp[2]) < 1e-6


@pytest.mark.parametrize("m, n, k, trans_b, order", [
    (128, 128, 64, 0, "ascending"),
    (130, 70, 40, 0, "descending"),
    (64, 200, 96, 1, "shuffled"),
    (33, 17, 16, 1, "ascending"),
    (70, 33, 33, 0, "shuffled"),  # rows of 66 bytes: only 2-byte aligned, the element-by-element copy path
    (64, 64, 200, 0, "shuffled"),  # 7 steps of K through a 3-stage ring: every slot reused while others are read
    (64, 48, 232, 1, "descending"),
])
def test_gemm(m: int, n: int, k: int, trans_b: int, order: str) -> None:
    rng = np.random.default_rng(m * n + k)
    a = random_bf16(rng, m, k)
    b = random_bf16(rng, *((n, k) if trans_b else (k, n)))
    interp, sim = run_both(gemm_kernel, [a, b, poisoned(m, n)], (-(-n // 128) * -(-m // 128),), {"TRANS_B": trans_b},
                           order=order)
    assert rel_err(sim[2], interp[2]) < 2e-3


@pytest.mark.parametrize("d, causal, order, stages", [(64, 0, "shuffled", 3), (64, 1, "descending", 3),
                                                      (128, 1, "ascending", 3), (32, 1, "shuffled", 3),
                                                      (96, 0, "shuffled", 3), (256, 1, "shuffled", 3),
                                                      (256, 0, "sliced", 2)])
def test_attention(d: int, causal: int, order: str, stages: int) -> None:
    """attention_fwd with attention()'s constants for D (32, 96 and 256 too; 16 rows a warp; at D = 256 also in two
    stages, as on a card of 99 KB), against the interpreter and float64."""
    from tkc.kernels.attention import CONFIG

    rng = np.random.default_rng(d + causal)
    q, k, v = (random_bf16(rng, 1, 2, 128, d) for _ in range(3))
    rows, keys, q_in_shared = CONFIG[d]
    constants = {"D": d, "CAUSAL": causal, "ROWS": 16, "KEYS": keys, "Q_IN_SHARED": q_in_shared, "STAGES": stages}
    interp, sim = run_both(attention_fwd, [q, k, v, poisoned(1, 2, 128, d), d**-0.5], (2, 2, 1), constants,
                           order=order)
    assert rel_err(sim[3], interp[3]) < 2e-3
    assert rel_err(interp[3], attention_ref(q, k, v, causal=bool(causal))) < 1e-2


@tkc.kernel(warps=1, min_target="sm_80")
def causal_block_order(Out: gl[f32, 2], GROWS: const = 1, TOGETHER: const = 8):
    """Row L (the block of linear index L, the order the GPU starts blocks in) gets the (x, y, z) longest_first
    hands that block, as its linear index, and that x."""
    x, y, z = longest_first(GROWS, TOGETHER)
    nx, ny, _ = num_blocks()
    bx, by, bz = block_idx()
    linear = bx + nx * (by + ny * bz)
    store(Out, zeros(rv[f32, 16]) + (x + nx * (y + ny * z)), (linear, 0))
    store(Out, zeros(rv[f32, 16]) + x, (linear, 1))


@pytest.mark.parametrize("grows, together", [(0, 8), (1, 8), (1, 3)])
@pytest.mark.parametrize("grid", [(5, 7, 3), (4, 8, 2), (3, 2, 1), (1, 9, 1)])
def test_causal_blocks_longest_first(grid: tuple[int, int, int], grows: int, together: int) -> None:
    """longest_first (the causal sm_80 forward's block order) gives every block of the grid to exactly one block,
    and in launch order walks groups of `together` heads (the last one shorter), in each the longest blocks first
    (x = 0 where work falls with x, the last x where it grows): simulated and interpreted alike."""
    nx, ny, nz = grid
    out = np.full((nx * ny * nz, 32), np.nan, np.float32)
    interp, sim = run_both(causal_block_order, [out], grid, {"GROWS": grows, "TOGETHER": together}, order="shuffled")
    np.testing.assert_array_equal(sim[0], interp[0])
    taken, x = interp[0][:, 0].astype(int), interp[0][:, 16].astype(int)
    assert sorted(taken) == list(range(nx * ny * nz))
    length_rank = nx - 1 - x if grows else x                 # 0: a longest block
    heads = ny * nz
    for first in range(0, heads, together):
        group = slice(first * nx, min(first + together, heads) * nx)
        assert (np.diff(length_rank[group]) >= 0).all()
        assert set(taken[group] // nx) == set(range(first, min(first + together, heads)))


def test_attention_forward_lse() -> None:
    """attention_fwd_lse (the sm_80 forward for the backward): its log-sum-exp too, with the lazy rescale's lagging
    maximum (L = scale·m + ln l)."""
    rng = np.random.default_rng(5)
    q, k, v = (random_bf16(rng, 1, 2, 192, 64, scale=3.0) for _ in range(3))
    args = [q, k, v, poisoned(1, 2, 192, 64), poisoned(1, 2, 192, dtype=np.float32), 0.125]
    interp, sim = run_both(attention_fwd_lse, args, (3, 2, 1), {"D": 64, "CAUSAL": 1}, order="shuffled")
    out, lse = attention_ref(q, k, v, causal=True, scale=0.125, lse=True)
    assert rel_err(sim[3], out) < 1e-2 and rel_err(sim[4], lse) < 1e-5 and rel_err(interp[4], lse) < 1e-5


@pytest.mark.parametrize("d, causal, order, n", [(64, 1, "descending", 256), (128, 1, "shuffled", 160),
                                                  (64, 0, "shuffled", 200), (32, 1, "shuffled", 200),
                                                  (96, 0, "descending", 160)])
def test_attention_backward(d: int, causal: int, order: str, n: int) -> None:
    """attention_bwd_delta, _dkdv and _dq with attention_backward's constants: more query and key steps than
    pipeline stages, two heads, a length the steps do not divide (RAGGED); the simulation agrees with the
    interpreter, which agrees with float64."""
    from reference import attention_backward_ref

    from tkc.kernels.attention_bwd import CONFIG, attention_bwd_delta, attention_bwd_dkdv, attention_bwd_dq

    rng = np.random.default_rng(d + causal)
    q, k, v, do = (random_bf16(rng, 1, 2, n, d) for _ in range(4))
    out, lse, dq_ref, dk_ref, dv_ref = attention_backward_ref(q, k, v, do, bool(causal), 0.1)
    o, lse = out.astype(q.dtype), lse.astype(np.float32)
    grid, (dkdv, dq_cfg) = (-(-n // 64), 2, 1), ({**cfg, "RAGGED": int(n % 64 > 0)} for cfg in CONFIG[d])
    interp, sim = run_both(attention_bwd_delta, [o, do, lse, poisoned(1, 2, n, dtype=np.float32)], grid, {"D": d},
                           order=order)
    assert rel_err(sim[3], interp[3]) < 1e-6
    delta = sim[3]
    args = [q, k, v, do, lse, delta, poisoned(1, 2, n, d), poisoned(1, 2, n, d), 0.1]
    interp, sim = run_both(attention_bwd_dkdv, args, grid, {"D": d, "CAUSAL": causal, **dkdv}, order=order)
    assert rel_err(sim[6], interp[6]) < 2e-3 and rel_err(sim[7], interp[7]) < 2e-3
    assert rel_err(interp[6], dk_ref) < 1e-2 and rel_err(interp[7], dv_ref) < 1e-2
    args = [q, k, v, do, lse, delta, poisoned(1, 2, n, d), 0.1]
    interp, sim = run_both(attention_bwd_dq, args, grid, {"D": d, "CAUSAL": causal, **dq_cfg}, order=order)
    assert rel_err(sim[6], interp[6]) < 2e-3 and rel_err(interp[6], dq_ref) < 1e-2


@pytest.mark.parametrize("d, causal, rows, keys", [(128, 1, 32, 32), (64, 0, 16, 32)])
def test_attention_queries_in_shared(d: int, causal: int, rows: int, keys: int) -> None:
    rng = np.random.default_rng(rows + keys)
    n = 4 * rows * 2
    q, k, v = (random_bf16(rng, 1, 1, n, d) for _ in range(3))
    interp, sim = run_both(attention_fwd, [q, k, v, poisoned(1, 1, n, d), d**-0.5], (2, 1, 1),
                           {"D": d, "CAUSAL": causal, "ROWS": rows, "KEYS": keys, "Q_IN_SHARED": 1}, order="shuffled")
    assert rel_err(sim[3], interp[3]) < 2e-3
    assert rel_err(interp[3], attention_ref(q, k, v, causal=bool(causal), scale=d**-0.5)) < 2e-2


def test_attention_pipeline_runs_more_iterations_than_stages() -> None:
    rng = np.random.default_rng(5)
    q, k, v = (random_bf16(rng, 1, 1, 320, 64) for _ in range(3))  # 5 key blocks, 3 stages
    interp, sim = run_both(attention_fwd, [q, k, v, poisoned(1, 1, 320, 64), 0.125], (5, 1, 1), {"D": 64, "CAUSAL": 0},
                           order="shuffled")
    assert rel_err(sim[3], interp[3]) < 2e-3


@pytest.mark.parametrize("rows, d, warps", [(9, 256, 4), (4, 16, 1), (5, 96, 3), (11, 64, 2), (7, 1024, 4)])
def test_layernorm(rows: int, d: int, warps: int) -> None:
    rng = np.random.default_rng(rows)
    args = [random_bf16(rng, rows, d), random_bf16(rng, rows, d), random_bf16(rng, d), random_bf16(rng, d),
            poisoned(rows, d), poisoned(rows, d), 1e-5]
    interp, sim = run_both(layernorm_kernel, args, (2,), {"D": d, "WARPS": warps}, order="descending")
    assert rel_err(sim[4], interp[4]) < 2e-3
    assert rel_err(sim[5], interp[5]) < 2e-3


@pytest.mark.parametrize("residual, rms, warps", [(0, 0, 2), (1, 1, 4), (0, 1, 1)])
def test_layernorm_variants(residual: int, rms: int, warps: int) -> None:
    """Without the residual (x alone: Residual not read, OutResidual not written) and RMSNorm (Bias not read): the
    simulation agrees with the interpreter, which agrees with float64; the unread inputs are NaN."""
    from reference import layernorm_ref

    rng = np.random.default_rng(residual + 2 * rms)
    x, r, w, b = random_bf16(rng, 9, 256), random_bf16(rng, 9, 256), random_bf16(rng, 256), random_bf16(rng, 256)
    args = [x, r if residual else poisoned(9, 256), w, poisoned(256) if rms else b, poisoned(9, 256),
            poisoned(9, 256), 1e-5]
    interp, sim = run_both(layernorm_kernel, args, (2,), {"D": 256, "WARPS": warps, "RESIDUAL": residual, "RMS": rms},
                           order="shuffled")
    ref, resid = layernorm_ref(x, r if residual else None, w, b, 1e-5, rms=bool(rms))
    assert rel_err(interp[4], ref) < 1e-2 and rel_err(sim[4], interp[4]) < 2e-3
    assert rel_err(sim[5], resid) < 1e-2 if residual else np.isnan(sim[5].astype(np.float32)).all()


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_layernorm_f16(target: str) -> None:
    """layernorm_kernel with DT=f16: f16 rows in and out, against float64 (f16's 11 bits) and the interpreter."""
    from reference import f64

    from tkc.lang import f16

    rng = np.random.default_rng(3)
    rows, d = 6, 512
    x, r, w, b = (rng.standard_normal(shape).astype(np.float16) for shape in ((rows, d), (rows, d), (d,), (d,)))
    out, out_res = (np.full((rows, d), np.nan, dtype=np.float16) for _ in range(2))
    interp, sim = run_both(layernorm_kernel, [x, r, w, b, out, out_res, 1e-5], (4,), {"D": d, "WARPS": 2, "DT": f16},
                           target=target, order="shuffled")
    s = f64(x) + f64(r)
    ref = (s - s.mean(-1, keepdims=True)) / np.sqrt(s.var(-1, keepdims=True) + 1e-5) * f64(w) + f64(b)
    assert sim[4].dtype == np.float16 and rel_err(sim[4], ref) < 2e-3 and rel_err(sim[5], s) < 1e-3
    assert rel_err(sim[4], interp[4]) < 1e-3


@tkc.kernel(warps=2, min_target="sm_80")
def turned_pairs(X: gl[bf16, 2], C: gl["CT", 2], Y: gl[bf16, 2], Z: gl[f32, 2], CT: const = f32):
    """x·c + rotate_pairs(x) with c's columns each spread over a pair (repeat=2), in the linear layout (elementwise
    only), and the same product through a row max (the row layout)."""
    x = load(X, (warp_id(), 0), rt[f32, 16, 64])
    c = load(C, (rows(3 + 16 * warp_id()), 0), rt[f32, 16, 64], repeat=2)
    store(Y, x * c + rotate_pairs(x), (warp_id(), 0))
    r = rotate_pairs(x) * load(C, (warp_id(), 0), rt[f32, 16, 64], repeat=2)
    store(Z, sub_row(r, row_max(r)), (warp_id(), 0))


@pytest.mark.parametrize("table, target", [("f32", "sm_80"), ("bf16", "sm_90a"), ("f32", "sm_90a")])
def test_rotate_pairs_and_repeated_columns(table: str, target: str) -> None:
    """rotate_pairs ((a, b) → (−b, a) each pair of columns) and a load whose columns each fill a pair, in the linear
    and row layouts: the simulated PTX against the interpreter, the interpreter against numpy; rows past the end
    of the tensors (30 of the tile's 32) read zeros and are not written."""
    from reference import BF16

    from tkc import lang

    rng = np.random.default_rng(len(table))
    x = random_bf16(rng, 30, 64)
    c = rng.uniform(-1, 1, (40, 32)).astype(BF16 if table == "bf16" else np.float32)
    y, z = poisoned(30, 64), np.full((30, 64), np.nan, np.float32)
    interp, sim = run_both(turned_pairs, [x, c, y, z], (1,), {"CT": getattr(lang, table)}, target=target,
                           order="shuffled")
    xf, cf = x.astype(np.float64), np.repeat(c.astype(np.float64), 2, axis=1)
    turned = np.stack([-xf[:, 1::2], xf[:, ::2]], axis=-1).reshape(30, 64)
    assert rel_err(interp[2], xf * cf[3:33] + turned) < 1e-2
    r = turned * cf[:30]
    assert rel_err(interp[3], r - r.max(axis=1, keepdims=True)) < 1e-5
    assert rel_err(sim[2], interp[2]) == 0 and rel_err(sim[3], interp[3]) < 1e-6


@pytest.mark.parametrize("shape, r, constants, bshd, target", [
    ((2, 5, 37, 128), 128, {}, False, "sm_90a"),
    ((1, 2, 70, 64), 64, {"WARPS": 2}, False, "sm_80"),
    ((1, 3, 20, 128), 64, {"HEADS": 2, "CONJUGATE": 1}, True, "sm_80"),
    ((2, 2, 9, 96), 32, {"WARPS": 1, "HEADS": 1}, False, "sm_80"),
    ((1, 4, 16, 64), 64, {"COPY_REST": 0, "CT": "bf16"}, True, "sm_90a"),
    ((1, 2, 12, 128), 96, {"COPY_REST": 0, "DT": "f16", "CT": "f16"}, False, "sm_80"),
    ((2, 3, 40, 128), 128, {"INTERLEAVED": 1}, True, "sm_90a"),
    ((1, 3, 20, 160), 64, {"INTERLEAVED": 1, "CONJUGATE": 1, "HEADS": 1, "CT": "bf16"}, False, "sm_80"),
    ((2, 3, 37, 128), 128, {"POSITIONS": 1, "PT": "i64"}, True, "sm_80"),
    ((2, 2, 20, 128), 64, {"POSITIONS": 1, "PT": "i32", "INTERLEAVED": 1, "HEADS": 1}, False, "sm_90a"),
])
def test_rotary(shape: tuple[int, ...], r: int, constants: dict, bshd: bool, target: str) -> None:
    """rotary_kernel's PTX against the interpreter and float64: strided (B, N, H, D) rows, partial rotary (R < D:
    the rest copied, or with COPY_REST=0 left as it was, NaN here), bf16 / f16 cos and sin, the conjugate turn,
    rotate-half and interleaved pairs, positions gathered by an index tensor (one row of it a batch)."""
    from reference import BF16, rotary_ref

    from tkc import lang

    numpy_types = {"bf16": BF16, "f16": np.float16, "f32": np.float32}
    element, cos_type = (numpy_types[constants.get(k, default)] for k, default in (("DT", "bf16"), ("CT", "f32")))
    constants = {k: getattr(lang, v) if k in ("CT", "DT", "PT") else v for k, v in constants.items()}
    batch, heads, n, d = shape
    rng = np.random.default_rng(n)
    x = rng.standard_normal((batch, n, heads, d) if bshd else shape).astype(element)
    x = x.transpose(0, 2, 1, 3) if bshd else x
    angles = rng.uniform(0, 2 * np.pi, (n + 5, r // 2))
    cos, sin = np.cos(angles).astype(cos_type), np.sin(angles).astype(cos_type)
    out = np.full(shape, np.nan, dtype=element)
    heads_a_warp, warps = (constants.get(k, v) for k, v in (("HEADS", 2), ("WARPS", 4)))
    grid = (-(-n // (16 * warps)), batch, -(-heads // heads_a_warp))
    where = rng.integers(0, n + 5, size=(batch, n)).astype(np.int64 if constants.get("PT") is lang.i64 else np.int32)
    index, offset, stride = (where.reshape(-1), 0, n) if constants.get("POSITIONS") else (where[0, :1], 3, 0)
    interp, sim = run_both(rotary_kernel, [x, cos, sin, out, x, out, index, offset, stride], grid,
                           {"D": d, "R": r, **constants}, target=target, order="shuffled")
    ref = rotary_ref(x, cos, sin, offset, bool(constants.get("CONJUGATE")), bool(constants.get("INTERLEAVED")),
                     positions=where if constants.get("POSITIONS") else None)
    if constants.get("COPY_REST") == 0:
        assert np.isnan(sim[3][..., r:].astype(np.float32)).all()
        sim[3][..., r:], interp[3][..., r:] = x[..., r:], x[..., r:]
    assert rel_err(interp[3], ref) < 1e-2 and rel_err(sim[3], interp[3]) < 1e-6


@pytest.mark.parametrize("target, interleaved", [("sm_80", 0), ("sm_90a", 1)])
def test_rotary_q_and_k_in_one_launch(target: str, interleaved: int) -> None:
    """PAIR=1: the blocks past q's head groups turn k (fewer heads, grouped-query), in the same launch; both against
    float64, ragged positions and heads."""
    from reference import rotary_ref

    rng = np.random.default_rng(11 + interleaved)
    q, k = random_bf16(rng, 2, 5, 37, 128), random_bf16(rng, 2, 3, 37, 128)
    angles = rng.uniform(0, 2 * np.pi, (45, 64))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    q_out, k_out = poisoned(2, 5, 37, 128), poisoned(2, 3, 37, 128)
    grid = (1, 2, 3 + 2)  # 64 positions a block; q's 5 heads in 3 groups of two, k's 3 in 2
    no_positions = np.zeros(1, dtype=np.int32)
    interp, sim = run_both(rotary_kernel, [q, cos, sin, q_out, k, k_out, no_positions, 4, 0], grid,
                           {"PAIR": 1, "INTERLEAVED": interleaved}, target=target, order="shuffled")
    for got, x in ((interp[3], q), (interp[5], k)):
        assert rel_err(got, rotary_ref(x, cos, sin, 4, interleaved=bool(interleaved))) < 1e-2
    assert rel_err(sim[3], interp[3]) == 0 and rel_err(sim[5], interp[5]) == 0


def test_user_gemm_bias_gelu() -> None:
    from kernels.gemm_bias_gelu import gemm_bias_gelu

    rng = np.random.default_rng(11)
    m, n, k = 70, 96, 48
    args = [random_bf16(rng, m, k, scale=0.3), random_bf16(rng, k, n, scale=0.3), random_bf16(rng, n), poisoned(m, n)]
    interp, sim = run_both(gemm_bias_gelu, args, (-(-n // 64), -(-m // 64)), order="shuffled")
    assert rel_err(sim[3], interp[3]) < 2e-3


def test_user_row_softmax() -> None:
    from kernels.row_softmax import WARPS, row_softmax

    rng = np.random.default_rng(12)
    m, n = 100, 100
    interp, sim = run_both(row_softmax, [random_bf16(rng, m, n), poisoned(m, n)], (-(-m // (16 * WARPS)),), {"N": n},
                           order="descending")
    assert rel_err(sim[1], interp[1]) < 2e-3


def test_user_sliding_window_attention() -> None:
    from kernels.sliding_window_attention import sliding_window_attention

    rng = np.random.default_rng(13)
    q, k, v = (random_bf16(rng, 1, 1, 256, 64) for _ in range(3))
    interp, sim = run_both(sliding_window_attention, [q, k, v, poisoned(1, 1, 256, 64)], (1, 1, 4), {"WINDOW": 128},
                           order="shuffled")
    assert rel_err(sim[3], interp[3]) < 2e-3


@tkc.kernel(warps=2, min_target="sm_80")
def masked_columns(X: gl[f32, 2], Y: gl[f32, 2], n: int):
    """Each warp keeps the first n - 5·warp columns of its 16×64 tile (keys past a sequence's end)."""
    store(Y, keep_cols(load(X, (warp_id(), 0), rt[f32, 16, 64]), n - 5 * warp_id()), (warp_id(), 0))


@pytest.mark.parametrize("n", [0, 1, 17, 33, 64, 70, -3])
def test_keep_cols_simulated(n: int) -> None:
    rng = np.random.default_rng(n + 100)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    interp, sim = run_both(masked_columns, [x, np.full((32, 64), np.nan, np.float32), n], (1,))
    np.testing.assert_array_equal(sim[1], interp[1])
    j = np.arange(64)[None, :]
    for w in range(2):
        kept = np.broadcast_to(j < n - 5 * w, (16, 64))
        rows = interp[1][16 * w:16 * w + 16]
        assert np.isneginf(rows[~kept]).all() and (rows[kept] == x[16 * w:16 * w + 16][kept]).all()


@tkc.kernel(warps=2, min_target="sm_80")
def masked_rows(X: gl[f32, 2], A: gl[bf16, 2], V: gl[bf16, 2], Y: gl[f32, 2], P: gl[f32, 2], n: int):
    """Each warp keeps the first n - 5·warp rows of its 16×64 f32 tile (row layout), and of its 16×64 bf16 tile of
    V as the B operand of A·V (col layout; the rows past a cache's length)."""
    store(Y, keep_rows(load(X, (warp_id(), 0), rt[f32, 16, 64]), n - 5 * warp_id()), (warp_id(), 0))
    v = keep_rows(load(load(V, (0, 0), st[bf16, 32, 64]), (warp_id(), 0), rt[bf16, 16, 64]), n - 5 * warp_id())
    store(P, mma_AB(load(A, (0, 0), rt[bf16, 16, 16]), v, zeros(rt[f32, 16, 64])), (warp_id(), 0))


@pytest.mark.parametrize("n", [0, 1, 9, 16, 17, -3])
def test_keep_rows_simulated(n: int) -> None:
    """keep_rows in the accumulator's layout and in an mma B operand's: the rows past n are zeros, even where they
    held NaN (what the mask is for), in the interpreter and the simulated PTX alike."""
    rng = np.random.default_rng(n + 200)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    a, v = random_bf16(rng, 16, 16), random_bf16(rng, 32, 64)
    v[np.arange(32) % 16 >= 7] = np.nan  # (rows 7.. of each warp's tile: masked only where n - 5·warp ≤ 7)
    interp, sim = run_both(masked_rows, [x, a, v, np.full((32, 64), np.nan, np.float32),
                                         np.full((32, 64), np.nan, np.float32), n], (1,))
    np.testing.assert_array_equal(sim[3], interp[3])
    i = np.arange(16)[:, None]
    for w in range(2):
        keep = min(max(n - 5 * w, 0), 16)
        rows = interp[3][16 * w:16 * w + 16]
        assert (rows[keep:] == 0).all() and (rows[:keep] == x[16 * w:16 * w + keep]).all()
        kept_v = np.where(i < keep, v[16 * w:16 * w + 16].astype(np.float64), 0.0)
        want = a.astype(np.float64) @ kept_v
        if keep <= 7:
            assert rel_err(interp[4][16 * w:16 * w + 16], want) < 1e-5
            assert rel_err(sim[4][16 * w:16 * w + 16], want) < 1e-5
        else:  # NaN rows kept: NaN out, both alike
            assert np.isnan(interp[4][16 * w:16 * w + 16]).any() and np.isnan(sim[4][16 * w:16 * w + 16]).any()


@tkc.kernel(warps=4, min_target="sm_80")
def rows_shifted_copy(X: gl[bf16, 2], Y: gl[bf16, 2], Z: gl[f32, 2], shift: int):
    """Block i copies rows 64·i − shift .. 64·i − shift + 63 of X (through shared memory, `rows(r)`) into Y at the
    same rows, and each warp its 16 of them straight from registers into Z: rows outside the tensors read zeros and
    are not written."""
    first = block_idx()[0] * 64 - shift
    tile = load(X, (rows(first), 0), st[bf16, 64, 64])
    store(Y, load(tile, (warp_id(), 0), rt[bf16, 16, 64]), (rows(first + 16 * warp_id()), 0))
    store(Z, load(X, (rows(first + 16 * warp_id()), 0), rt[f32, 16, 64]), (rows(first + 16 * warp_id()), 0))


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("m, shift", [(100, 0), (100, 28), (128, 64), (70, 3), (64, -5)])
def test_row_index_in_rows(m: int, shift: int, target: str) -> None:
    """`rows(r)`: tiles at any row, also partly before row 0 or past the end, in the interpreter (against numpy)
    and in the simulated PTX."""
    rng = np.random.default_rng(m + shift)
    x = random_bf16(rng, m, 64)
    blocks = -(-(m + max(shift, 0)) // 64)
    args = [x, poisoned(m, 64), poisoned(m, 64).astype(np.float32), shift]
    interp, sim = run_both(rows_shifted_copy, args, (blocks,), target=target, order="shuffled")
    covered = np.zeros(m, dtype=bool)
    covered[max(0, -shift): min(m, blocks * 64 - shift)] = True
    want = np.where(covered[:, None], x, np.nan)
    for result in (interp, sim):
        np.testing.assert_array_equal(result[1], want)
        np.testing.assert_array_equal(result[2], want)


def test_rows_index_mutation_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lowering that forgets that a row index counts rows (the mutation: it multiplies by the tile's height as for
    a tile index) writes other rows than the interpreter: caught."""
    from tkc.backend import lower_memory

    monkeypatch.setattr(lower_memory, "global_coords", lambda lw, op: [lw.value(i) for i in op.indices])
    rng = np.random.default_rng(5)
    x = random_bf16(rng, 100, 64)
    args = [x, poisoned(100, 64), poisoned(100, 64).astype(np.float32), 28]
    interp, sim = run_both(rows_shifted_copy, args, (3,), target="sm_80")
    assert not np.array_equal(sim[1], interp[1], equal_nan=True)


@tkc.kernel(warps=2, min_target="sm_80")
def bf16_tile_out(X: gl[f32, 2], Y: gl[bf16, 2]):
    """Each warp converts its 32×96 rows, less each row's largest, to bf16 and stores them from registers (the
    quad-transposed wide store of a row-layout tile: the row max keeps it in that layout)."""
    x = load(X, (warp_id(), 0), rt[f32, 32, 96])
    store(Y, sub_row(x, row_max(x)).to(bf16), (warp_id(), 0))


@tkc.kernel(warps=2, min_target="sm_80")
def bf16_tile_scaled(X: gl[bf16, 2], Y: gl[bf16, 2]):
    """Each warp scales its 32×96 rows: a tile that meets only global memory and elementwise ops (linear layout)."""
    store(Y, load(X, (warp_id(), 0), rt[f32, 32, 96]) * 3.0, (warp_id(), 0))


def test_linear_tiles_move_16_bytes_a_lane_without_exchanges() -> None:
    """The linear layout: 16-byte loads and stores, no shuffles; the simulated PTX writes what the interpreter does,
    rows past the end not at all."""
    from tkc.compiler import compile_for_launch

    x = random_bf16(np.random.default_rng(5), 50, 96)
    interp, sim = run_both(bf16_tile_scaled, [x, poisoned(50, 96)], (1,), order="shuffled")
    np.testing.assert_array_equal(sim[1], interp[1])
    assert np.isfinite(sim[1][:50]).all()
    ptx_text = compile_for_launch(bf16_tile_scaled, "sm_80", {}, {"X": 16, "Y": 16}).ptx
    assert ptx_text.count("ld.global.v4.b32") == 12 and ptx_text.count("st.global.v4.b32") == 12
    assert "shfl" not in ptx_text


@pytest.mark.parametrize("m", [64, 50, 33])
def test_bf16_store_is_quad_transposed(m: int) -> None:
    """A 16-bit row-layout tile goes to global memory 16 bytes a lane (st.global.v4, the quad's words exchanged by
    shuffles first); the simulated PTX writes what the interpreter writes, rows past the end not at all."""
    from tkc.compiler import compile_for_launch

    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, 96)).astype(np.float32)
    interp, sim = run_both(bf16_tile_out, [x, poisoned(m, 96)], (1,), order="shuffled")
    np.testing.assert_array_equal(sim[1], interp[1])
    assert np.isfinite(sim[1]).all()
    ptx_text = compile_for_launch(bf16_tile_out, "sm_80", {}, {"X": 16, "Y": 16}).ptx
    assert ptx_text.count("st.global.v4.b32") == 12 and "st.global.b32" not in ptx_text


@pytest.mark.parametrize("stage", [0, 1])
def test_quad_transpose_mutation_is_caught(monkeypatch: pytest.MonkeyPatch, stage: int) -> None:
    """A quad transpose whose butterfly stage keeps the lane's own word where it should take the partner's: the
    simulated store differs from the interpreter."""
    from tkc.backend import lower_memory

    real_op = lower_memory.KernelLowering.op
    seen = []

    def op(self, opcode, cls, *operands, **kw):
        if opcode.startswith("shfl.sync.bfly") and operands[1].value in (2, 1):
            seen.append(operands[1].value)
            if seen.count(operands[1].value) == 1 and operands[1].value == 2 - stage:
                return operands[0]  # the mutation: no exchange
        return real_op(self, opcode, cls, *operands, **kw)

    monkeypatch.setattr(lower_memory.KernelLowering, "op", op)
    x = np.random.default_rng(7).standard_normal((64, 96)).astype(np.float32)
    interp, sim = run_both(bf16_tile_out, [x, poisoned(64, 96)], (1,))
    assert not np.array_equal(sim[1], interp[1], equal_nan=True)


@tkc.kernel(warps=1, min_target="sm_80", exp2_poly="EVERY")
def exp2_tile(X: gl[f32, 2], Y: gl[f32, 2], EVERY: const = 1):
    store(Y, exp2(load(X, (0, 0), rt[f32, 16, 64])), (0, 0))


@pytest.mark.parametrize("every", [1, 3, 0])
def test_exp2_on_the_fma_pipe(every: int) -> None:
    """exp2_poly=N: every N-th slot's exp2 is a cubic on the FMA pipe (add.rm for the floor, an integer multiply-add
    into the exponent), within 2e-4 of exp2 down to 2^-126; -inf and inputs below -127 give (about) zero."""
    from tkc.compiler import compile_for_launch

    rng = np.random.default_rng(every)
    x = (rng.standard_normal((16, 64)) * 30).astype(np.float32)
    x[0, :8] = [-np.inf, -200, -127, -126.5, 0, 7.99, 8, -1e-30]
    y = np.full((16, 64), np.nan, np.float32)
    simulate(lower_kernel(exp2_tile, "sm_80", {"EVERY": every}), "exp2_tile", [x, y], (1,))
    ref = np.exp2(x.astype(np.float64))
    normal = ref > 2.0**-126
    assert (np.abs(y[normal] / ref[normal] - 1) < 2e-4).all()
    assert (np.abs(y[~normal]) < 1e-37).all()
    ptx_text = compile_for_launch(exp2_tile, "sm_80", {"EVERY": every}, {"X": 16, "Y": 16}).ptx
    on_fma = 0 if every == 0 else 32 // every
    assert ptx_text.count("add.rm.f32") == on_fma and ptx_text.count("ex2.approx") == 32 - on_fma


@tkc.kernel(warps=2, min_target="sm_80")
def two_scratch_vectors(X: gl[f32, 1], Out: gl[f32, 2], MAKE: const = "empty"):
    """Two shared vectors made alike (empty, zeros, or loaded from the same place), then written differently and
    both read back: two buffers, not one."""
    if MAKE == "empty":
        first, second = empty(sv[f32, 32]), empty(sv[f32, 32])
    elif MAKE == "zeros":
        first, second = zeros(sv[f32, 32]), zeros(sv[f32, 32])
    else:
        first, second = load(X, (0,), sv[f32, 32]), load(X, (0,), sv[f32, 32])
    a = store(first, load(X, (warp_id(),), rv[f32, 16]), (warp_id(),))
    b = store(second, load(X, (warp_id(),), rv[f32, 16]) * 2.0, (warp_id(),))
    store(Out, load(a, (0,), rv[f32, 32]), (0, 0))
    store(Out, load(b, (0,), rv[f32, 32]), (1, 0))


@pytest.mark.parametrize("make", ["empty", "zeros", "load"])
def test_allocations_of_one_type_are_distinct_buffers(make: str) -> None:
    """`empty`, `zeros` into a shared vector and a load from global memory into one allocate: two alike are never
    merged into one buffer (CSE of ops marked pure did that, and the second vector's stores overwrote the first's)."""
    x = np.arange(32, dtype=np.float32) + 1
    interp, sim = run_both(two_scratch_vectors, [x, np.full((2, 32), np.nan, np.float32)], (1,), {"MAKE": make})
    np.testing.assert_array_equal(interp[1], np.stack([x, 2 * x]))
    np.testing.assert_array_equal(sim[1], interp[1])


@pytest.mark.parametrize("d, causal, warps, producer, n", [(128, 0, 8, 0, 256), (64, 1, 4, 0, 256), (128, 1, 8, 1, 256),
                                                            (64, 0, 8, 0, 300), (96, 0, 8, 1, 200)])
def test_attention_backward_on_wgmma(d: int, causal: int, warps: int, producer: int, n: int) -> None:
    """attention_bwd_dkdv_sm90 and attention_bwd_dq_sm90 with attention_backward's Hopper constants (and a producer
    warpgroup, and a length the steps do not divide): two heads, more steps than stages, warps handed over every
    few instructions; the simulation agrees with float64."""
    from reference import attention_backward_ref

    from tkc.kernels.attention_bwd import CONFIG_SM90, attention_bwd_dkdv_sm90, attention_bwd_dq_sm90

    rng = np.random.default_rng(d + causal)
    q, k, v, do = (random_bf16(rng, 1, 2, n, d) for _ in range(4))
    out, lse, dq_ref, dk_ref, dv_ref = attention_backward_ref(q, k, v, do, bool(causal), 0.1)
    delta = (do.astype(np.float64) * out.astype(q.dtype).astype(np.float64)).sum(-1).astype(np.float32)
    dkdv, dq_cfg = ({**cfg, "WARPS": warps, "PRODUCER": producer, "RAGGED": int(n % 64 > 0)} for cfg in CONFIG_SM90[d])
    grid = (-(-n // (16 * warps)), 2, 1)
    args = [q, k, v, do, lse.astype(np.float32), delta, poisoned(1, 2, n, d), poisoned(1, 2, n, d), 0.1]
    _, sim = run_both(attention_bwd_dkdv_sm90, args, grid, {"D": d, "CAUSAL": causal, **dkdv}, target="sm_90a",
                      order="sliced")
    assert rel_err(sim[6], dk_ref) < 1e-2 and rel_err(sim[7], dv_ref) < 1e-2
    args = [q, k, v, do, lse.astype(np.float32), delta, poisoned(1, 2, n, d), 0.1]
    _, sim = run_both(attention_bwd_dq_sm90, args, grid, {"D": d, "CAUSAL": causal, **dq_cfg}, target="sm_90a",
                      order="sliced")
    assert rel_err(sim[6], dq_ref) < 1e-2


@pytest.mark.parametrize("causal, n, target, stages", [(0, 200, "sm_90a", 0), (1, 160, "sm_90a", 0),
                                                      (0, 128, "sm_80", 3), (1, 128, "sm_80", 3), (1, 128, "sm_80", 2)])
def test_attention_backward_head_dim_256(causal: int, n: int, target: str, stages: int) -> None:
    """D = 256 with attention_backward's constants: the wgmma kernels (dK and dV in halves of 128 columns, two
    warpgroups on the same 64 keys, each its half of Sᵀ's and dPᵀ's sums passed to the other through shared memory;
    dQ whole) and the mma.sync ones (two blocks a key block, each all of Sᵀ and dPᵀ; dQ in halves too; dK/dV also
    in two stages, as on a card of 99 KB); more query and key steps than stages, on Hopper a
    length the steps do not divide; the simulation and the interpreter agree with float64."""
    from reference import attention_backward_ref

    from tkc.kernels import attention_bwd as bwd

    d = 256
    rng = np.random.default_rng(causal)
    q, k, v, do = (random_bf16(rng, 1, 1, n, d) for _ in range(4))
    out, lse, dq_ref, dk_ref, dv_ref = attention_backward_ref(q, k, v, do, bool(causal), 0.1)
    delta = (do.astype(np.float64) * out.astype(q.dtype).astype(np.float64)).sum(-1).astype(np.float32)
    if target == "sm_90a":
        (dkdv, dq_cfg), kernels = bwd.CONFIG_SM90[d], (bwd.attention_bwd_dkdv_sm90, bwd.attention_bwd_dq_sm90)
    else:
        (dkdv, dq_cfg), kernels = bwd.CONFIG[d], (bwd.attention_bwd_dkdv, bwd.attention_bwd_dq)
        dkdv, dq_cfg = {"WARPS": 4, **dkdv, "STAGES": stages}, {"WARPS": 4, **dq_cfg}
    dkdv = {**dkdv, "RAGGED": int(n % dkdv["QUERIES"] > 0)}
    dq_cfg = {**dq_cfg, "RAGGED": int(n % dq_cfg["KEYS"] > 0)}
    grid = (bwd.dkdv_blocks(n, d, dkdv), 1, 1)
    args = [q, k, v, do, lse.astype(np.float32), delta, poisoned(1, 1, n, d), poisoned(1, 1, n, d), 0.1]
    interp, sim = run_both(kernels[0], args, grid, {"D": d, "CAUSAL": causal, **dkdv}, target=target, order="sliced")
    for got in (interp, sim):
        assert rel_err(got[6], dk_ref) < 1e-2 and rel_err(got[7], dv_ref) < 1e-2
    args = [q, k, v, do, lse.astype(np.float32), delta, poisoned(1, 1, n, d), 0.1]
    grid = (-(-n // (16 * dq_cfg["WARPS"])) * (d // dq_cfg.get("COLS", d)), 1, 1)
    interp, sim = run_both(kernels[1], args, grid, {"D": d, "CAUSAL": causal, **dq_cfg}, target=target, order="sliced")
    assert rel_err(interp[6], dq_ref) < 1e-2 and rel_err(sim[6], dq_ref) < 1e-2


# D = 256's dK/dV block before HALVES=2: each warpgroup half of Sᵀ's and dPᵀ's sums, 32-query steps in three stages
HALVES_1 = {"WARPS": 8, "HALVES": 1, "STAGES": 3, "QUERIES": 32, "PRODUCER": 1}


@pytest.mark.parametrize("halves", [1, 2])
@pytest.mark.parametrize("mutated", [False, True])
def test_dkdv_halves_exchange(monkeypatch: pytest.MonkeyPatch, mutated: bool, halves: int) -> None:
    """D = 256's dK/dV block of two warpgroups on the same keys (HALVES), which pass their partial sums of Sᵀ and dPᵀ
    (HALVES=2: all of Sᵀ one way, all of dPᵀ the other) to each other through two buffers a step: with the steps all
    in the first buffer (mutated), a warpgroup run ahead overwrites sums the other has yet to read, and the
    simulated gradients come out wrong."""
    from reference import attention_backward_ref

    from tkc.backend import lower_memory
    from tkc.kernels import attention_bwd as bwd

    d, n = 256, 128
    rng = np.random.default_rng(3)
    q, k, v, do = (random_bf16(rng, 1, 1, n, d) for _ in range(4))
    out, lse, _, dk_ref, dv_ref = attention_backward_ref(q, k, v, do, False, 0.1)
    delta = (do.astype(np.float64) * out.astype(q.dtype).astype(np.float64)).sum(-1).astype(np.float32)
    if mutated:
        monkeypatch.setattr(lower_memory, "this_steps_buffer", lambda lw, op, base: base)
    args = [q, k, v, do, lse.astype(np.float32), delta, poisoned(1, 1, n, d), poisoned(1, 1, n, d), 0.1]
    _, sim = run_both(bwd.attention_bwd_dkdv_sm90, args, (2, 1, 1), {"D": d, **HALVES_1, "HALVES": halves},
                      target="sm_90a", order="descending")
    assert (rel_err(sim[6], dk_ref) < 1e-2 and rel_err(sim[7], dv_ref) < 1e-2) != mutated


@pytest.mark.parametrize("causal, n, cfg", [(0, 104, {"QUERIES": 32, "STAGES": 3}),
                                            (1, 160, {"QUERIES": 64, "STAGES": 2, "PRODUCER": 2, "EXCHANGE_BUFFERS": 1})])
def test_dkdv_halves_by_product(causal: int, n: int, cfg: dict) -> None:
    """HALVES=2: warpgroup 0 computes all of Sᵀ, warpgroup 1 all of dPᵀ, each reads both through one shared tile;
    more steps than stages, a length the steps do not divide, a producer; the simulation agrees with float64."""
    from tkc.kernels import attention_bwd as bwd

    d = 256
    inputs, (_, dk_ref, dv_ref) = _backward_case(d, causal, n)
    dkdv = {**HALVES_1, "HALVES": 2, **cfg, "RAGGED": int(n % cfg["QUERIES"] > 0)}
    args = [*inputs, poisoned(1, 2, n, d), poisoned(1, 2, n, d), 0.1]
    _, sim = run_both(bwd.attention_bwd_dkdv_sm90, args, (-(-n // 64), 2, 1), {"D": d, "CAUSAL": causal, **dkdv},
                      target="sm_90a", order="sliced")
    assert rel_err(sim[6], dk_ref) < 1e-2 and rel_err(sim[7], dv_ref) < 1e-2


@pytest.mark.parametrize("d, causal, warps, queries, n", [(128, 0, 8, 32, 200), (64, 1, 4, 64, 256),
                                                           (96, 1, 8, 64, 160)])
def test_dkdv_deferred_on_wgmma(d: int, causal: int, warps: int, queries: int, n: int) -> None:
    """attention_bwd_dkdv_sm90 with DEFER=1 (D ≤ 128): each step takes Sᵀ and dPᵀ first, and its dV and dK products
    run in the next step under the softmax (defer-wgmma, two A operands carried); more steps than stages, lengths the
    steps do not divide; the simulation agrees with float64."""
    from reference import attention_backward_ref

    from tkc.kernels.attention_bwd import attention_bwd_dkdv_sm90

    rng = np.random.default_rng(d + causal)
    q, k, v, do = (random_bf16(rng, 1, 2, n, d) for _ in range(4))
    out, lse, _, dk_ref, dv_ref = attention_backward_ref(q, k, v, do, bool(causal), 0.1)
    delta = (do.astype(np.float64) * out.astype(q.dtype).astype(np.float64)).sum(-1).astype(np.float32)
    dkdv = {"WARPS": warps, "QUERIES": queries, "STAGES": 3, "DEFER": 1, "RAGGED": int(n % queries > 0)}
    args = [q, k, v, do, lse.astype(np.float32), delta, poisoned(1, 2, n, d), poisoned(1, 2, n, d), 0.1]
    _, sim = run_both(attention_bwd_dkdv_sm90, args, (-(-n // (16 * warps)), 2, 1), {"D": d, "CAUSAL": causal, **dkdv},
                      target="sm_90a", order="sliced")
    assert rel_err(sim[6], dk_ref) < 1e-2 and rel_err(sim[7], dv_ref) < 1e-2


def _backward_case(d: int, causal: int, n: int) -> tuple[list, tuple]:
    """Two heads of n queries and keys at head dim d: the backward kernels' inputs (q, k, v, dO, L, Δ) and float64's
    (dQ, dK, dV)."""
    from reference import attention_backward_ref

    rng = np.random.default_rng(d + causal)
    q, k, v, do = (random_bf16(rng, 1, 2, n, d) for _ in range(4))
    out, lse, dq_ref, dk_ref, dv_ref = attention_backward_ref(q, k, v, do, bool(causal), 0.1)
    delta = (do.astype(np.float64) * out.astype(q.dtype).astype(np.float64)).sum(-1).astype(np.float32)
    return [q, k, v, do, lse.astype(np.float32), delta], (dq_ref, dk_ref, dv_ref)


def _dq_on_wgmma_error(d: int, causal: int, n: int, cfg: dict) -> float:
    """attention_bwd_dq_sm90 with `cfg` (eight warps unless it says; RAGGED where its steps do not divide n) on two
    heads of n queries and keys, simulated (and interpreted): its dQ's error against float64."""
    from tkc.kernels.attention_bwd import attention_bwd_dq_sm90

    inputs, (dq_ref, _, _) = _backward_case(d, causal, n)
    cfg = {"WARPS": 8, **cfg, "RAGGED": int(n % cfg.get("KEYS", 64) > 0)}
    grid = (-(-n // (16 * cfg["WARPS"])), 2, 1)
    _, sim = run_both(attention_bwd_dq_sm90, [*inputs, poisoned(1, 2, n, d), 0.1], grid,
                      {"D": d, "CAUSAL": causal, **cfg}, target="sm_90a", order="sliced")
    return rel_err(sim[6], dq_ref)


@pytest.mark.parametrize("d, causal, n, constants", [(256, 0, 200, {"WARPS": 4, "KEYS": 64, "STAGES": 2}),
                                                      (128, 1, 160, {"STAGES": 3}), (64, 1, 300, {"STAGES": 3})])
def test_dq_deferred_on_wgmma(d: int, causal: int, n: int, constants: dict) -> None:
    """attention_bwd_dq_sm90 with DEFER=1: S and dP first, each step's dQ product run in the next step under the
    softmax; more steps than stages, lengths the steps do not divide; the simulation agrees with float64."""
    assert _dq_on_wgmma_error(d, causal, n, {**constants, "DEFER": 1}) < 1e-2


@pytest.mark.parametrize("d, causal, n, constants, mutated", [
    (256, 0, 200, {"WARPS": 4, "KEYS": 64, "STAGES": 2}, False),
    (256, 1, 300, {"WARPS": 4, "KEYS": 64, "STAGES": 2, "PRODUCER": 1}, False),
    (128, 1, 160, {"STAGES": 3, "PRODUCER": 1}, False), (256, 0, 200, {"WARPS": 4, "KEYS": 64, "STAGES": 2}, True)])
def test_dq_split_ring_on_wgmma(monkeypatch: pytest.MonkeyPatch, d: int, causal: int, n: int, constants: dict,
                                mutated: bool) -> None:
    """attention_bwd_dq_sm90 with SPLIT_RING=1 (K and V their own barriers: V released once dP is done, the previous
    step's K once this step's S is waited for, which leaves the previous dQ product done): more steps than stages,
    lengths the steps do not divide; the simulation agrees with float64. The mutation releases K before the S wgmma
    is issued (so before anything waits for the previous dQ product): the refill lands under that product."""
    from tkc.backend.simulator import SimulationError
    from tkc.ir import ops as t
    from tkc.passes import insert_tma_pipeline

    cfg = {**constants, "SPLIT_RING": 1}
    if not mutated:
        assert _dq_on_wgmma_error(d, causal, n, cfg) < 1e-2
        return
    monkeypatch.setattr(insert_tma_pipeline, "_after_an_earlier_wgmma",  # (the op before S = Q·Kᵀ)
                        lambda body, lasting: next(op for op in body.ops if isinstance(op, t.WgmmaOp)).prev_op)
    with pytest.raises(SimulationError, match="writes shared memory that a wgmma"):
        _dq_on_wgmma_error(d, causal, n, cfg)


@pytest.mark.parametrize("d, causal, n, constants", [
    (64, 0, 300, {"WARPS": 4, "STAGES": 3, "BLOCKS": 3}),
    (64, 1, 260, {"WARPS": 4, "STAGES": 3, "BLOCKS": 2, "PRODUCER": 1}), (128, 1, 200, {"STAGES": 3, "PRODUCER": 1})])
def test_dkdv_split_ring_on_wgmma(d: int, causal: int, n: int, constants: dict) -> None:
    """attention_bwd_dkdv_sm90 with SPLIT_RING=1 (Q and dO their own barriers, each step k - 1's stages released once
    step k's Sᵀ is in): more steps than stages, lengths the steps do not divide; the simulation agrees with
    float64."""
    from tkc.kernels.attention_bwd import attention_bwd_dkdv_sm90

    inputs, (_, dk_ref, dv_ref) = _backward_case(d, causal, n)
    cfg = {"WARPS": 8, **constants, "SPLIT_RING": 1, "RAGGED": int(n % 64 > 0)}
    args = [*inputs, poisoned(1, 2, n, d), poisoned(1, 2, n, d), 0.1]
    _, sim = run_both(attention_bwd_dkdv_sm90, args, (-(-n // (16 * cfg["WARPS"])), 2, 1),
                      {"D": d, "CAUSAL": causal, **cfg}, target="sm_90a", order="sliced")
    assert rel_err(sim[6], dk_ref) < 1e-2 and rel_err(sim[7], dv_ref) < 1e-2


@pytest.mark.parametrize("causal, n, mutated", [(1, 136, False), (0, 136, True)])
def test_dkdv_halves_deferred(monkeypatch: pytest.MonkeyPatch, causal: int, n: int, mutated: bool) -> None:
    """HALVES with DEFER=1: defer-wgmma issues each step's dV and dK products (two A operands, P and dS, carried;
    B views of the Q and dO ring stages) in the next step behind its Sᵀ and dPᵀ parts and waits for those alone;
    more steps than stages, a ragged last step. The mutation waits for two groups fewer: the partial sums are stored
    before their wgmmas are done, and the simulated gradients come out wrong."""
    from reference import attention_backward_ref

    from tkc.ir import ops as t
    from tkc.kernels import attention_bwd as bwd
    from tkc.passes import defer_wgmma

    if mutated:
        wait = t.WgmmaWaitOp
        monkeypatch.setattr(defer_wgmma.t, "WgmmaWaitOp", lambda pending: wait(pending + 2 if pending else 0))
    d = 256
    rng = np.random.default_rng(causal)
    q, k, v, do = (random_bf16(rng, 1, 1, n, d) for _ in range(4))
    out, lse, _, dk_ref, dv_ref = attention_backward_ref(q, k, v, do, bool(causal), 0.1)
    delta = (do.astype(np.float64) * out.astype(q.dtype).astype(np.float64)).sum(-1).astype(np.float32)
    dkdv = {**HALVES_1, "DEFER": 1, "RAGGED": int(n % 32 > 0)}
    args = [q, k, v, do, lse.astype(np.float32), delta, poisoned(1, 1, n, d), poisoned(1, 1, n, d), 0.1]
    _, sim = run_both(bwd.attention_bwd_dkdv_sm90, args, (bwd.dkdv_blocks(n, d, dkdv), 1, 1),
                      {"D": d, "CAUSAL": causal, **dkdv}, target="sm_90a", order="sliced")
    assert (rel_err(sim[6], dk_ref) < 1e-2 and rel_err(sim[7], dv_ref) < 1e-2) != mutated


@pytest.mark.parametrize("path", ["sm_80", "sm_90a", "fused"])
def test_attention_backward_f16(path: str) -> None:
    """The backward kernels with DT=f16 (f16 q, k, v, dO and gradients; P and dS rounded to f16): Δ, then dK/dV and
    dQ (the mma.sync kernels, the wgmma ones, or the fused kernel with dQ by atomics and its scale), against
    float64."""
    from reference import attention_backward_ref

    from tkc.kernels import attention_bwd as bwd
    from tkc.lang import f16

    d, causal, n = 64, 1, 192
    rng = np.random.default_rng(4)
    q, k, v, do = (rng.standard_normal((1, 2, n, d)).astype(np.float16) for _ in range(4))
    out, lse, dq_ref, dk_ref, dv_ref = attention_backward_ref(q, k, v, do, bool(causal), 0.1)
    lse = lse.astype(np.float32)
    grid = (n // 64, 2, 1)
    _, sim = run_both(bwd.attention_bwd_delta, [out.astype(np.float16), do, lse, np.full((1, 2, n), np.nan, np.float32)],
                      grid, {"D": d, "DT": f16})
    delta = sim[3]
    dk, dv, dq = (np.full((1, 2, n, d), np.nan, np.float16) for _ in range(3))
    common = {"D": d, "CAUSAL": causal, "DT": f16}
    if path == "fused":
        dq_sum = np.zeros((1, 2, n, d), np.float32)
        _, sim = run_both(bwd.attention_bwd_sm90, [q, k, v, do, lse, delta, dk, dv, dq_sum, 0.1], (2, n // 64, 1),
                          {**common, "WARPS": 4, "STAGES": 3}, target="sm_90a", order="sliced")
        dk, dv = sim[6], sim[7]
        _, sim = run_both(bwd.attention_bwd_dq_scale, [sim[8], dq, 0.1], grid, {"D": d, "DT": f16})
        dq = sim[1]
    else:
        kernels = ((bwd.attention_bwd_dkdv, bwd.attention_bwd_dq) if path == "sm_80"
                   else (bwd.attention_bwd_dkdv_sm90, bwd.attention_bwd_dq_sm90))
        configs = bwd.CONFIG[d] if path == "sm_80" else ({**bwd.CONFIG_SM90[d][0]}, {**bwd.CONFIG_SM90[d][1], "WARPS": 4})
        _, sim = run_both(kernels[0], [q, k, v, do, lse, delta, dk, dv, 0.1], grid, {**common, **configs[0]},
                          target=path, order="shuffled")
        dk, dv = sim[6], sim[7]
        _, sim = run_both(kernels[1], [q, k, v, do, lse, delta, dq, 0.1], grid, {**common, **configs[1]},
                          target=path, order="shuffled")
        dq = sim[6]
    assert dq.dtype == dk.dtype == dv.dtype == np.float16
    assert rel_err(dq, dq_ref) < 2e-3 and rel_err(dk, dk_ref) < 2e-3 and rel_err(dv, dv_ref) < 2e-3  # f16: 3e-4


@tkc.kernel(warps=4, min_target="sm_80")
def two_sizes_summed(X: gl[f32, 2], Y: gl[f32, 2], Z: gl[f32, 2]):
    """Atomic adds of two widths, twice each: X's 16×64 tiles into Y's tile warp % 2, 16×32 ones into Z's."""
    x, x_half = load(X, (warp_id(), 0), rt[f32, 16, 64]), load(X, (warp_id(), 1), rt[f32, 16, 32])
    atomic_add(Y, x, (warp_id() % 2, 0))
    atomic_add(Z, x_half, (warp_id(), 0))
    atomic_add(Y, x, (warp_id() % 2, 0))
    atomic_add(Z, x_half, (warp_id(), 0))


def test_tma_reductions_share_one_staging_buffer() -> None:
    """A kernel's four TMA reductions of two tile sizes share one staging buffer, a warp's tile at the larger one's
    stride (16 KB, not 48); with the warps' steps interleaved a few instructions at a time every addend lands."""
    from tkc.compiler import compile_for_launch

    launch = compile_for_launch(two_sizes_summed, "sm_90a", {}, {"X": 16, "Y": 16, "Z": 16})
    assert launch.ptx.count("cp.reduce.async.bulk.tensor") == 6 and launch.meta()["shared_bytes"] <= 16 * 1024 + 1024
    rng = np.random.default_rng(11)
    x, y, z = (rng.standard_normal(s).astype(np.float32) for s in ((64, 64), (32, 64), (64, 32)))
    interp, sim = run_both(two_sizes_summed, [x, y, z], (3,), target="sm_90a", order="sliced")
    np.testing.assert_allclose(sim[1], y + 6 * (x[:32] + x[32:]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sim[2], z + 6 * x[:, 32:], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(interp[2], sim[2], rtol=1e-5, atol=1e-5)


def test_staging_stride_mutation_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lowering that places each warp's staging tile at its own tile's size (not the buffer's stride) writes
    over a neighbouring warp's tile that a TMA reduction still reads: the simulation reports it."""
    from tkc.backend.simulator import SimulationError
    from tkc.passes import allocate_shared

    monkeypatch.setattr(allocate_shared, "staging_stride", allocate_shared._staging_tile_bytes)
    x, y, z = (np.ones(s, np.float32) for s in ((64, 64), (32, 64), (64, 32)))
    with pytest.raises(SimulationError, match="still reads"):
        run_both(two_sizes_summed, [x, y, z], (3,), target="sm_90a", order="sliced")


@pytest.mark.parametrize("target, pitch", [("sm_80", 64), ("sm_90a", 64), ("sm_90a", 66)])
def test_atomic_add_mutation_is_caught(monkeypatch: pytest.MonkeyPatch, target: str, pitch: int) -> None:
    """Lowerings that write where they should add (red.global without `.add`: st.global; a TMA reduction as a plain
    TMA store) leave one addend per element, not the sum: the simulation disagrees with the interpreter."""
    from tkc.backend import ptx

    for op in (ptx.StoreOp, ptx.TmaStoreOp):
        init = op.__init__
        monkeypatch.setattr(op, "__init__", lambda self, *a, _init=init, reduce=None, **k: _init(self, *a, **k))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    y = rng.standard_normal((32, pitch)).astype(np.float32)[:, :64]
    interp, sim = run_both(tiles_summed, [x, y], (3,), target=target)
    assert not np.allclose(sim[1], interp[1], rtol=1e-3)


# the fused kernel is not what attention_backward() launches: one case per option (the producer, 128-query steps in
# panels of rows, DEFER_DQ with two dS buffers, one warpgroup)
@pytest.mark.parametrize("d, causal, warps, queries, producer, n, defer, ds_buffers", [
    (64, 1, 4, 64, 0, 256, 0, 1), (128, 1, 8, 64, 1, 200, 0, 1), (64, 0, 8, 128, 0, 300, 0, 1),
    (128, 1, 8, 64, 0, 200, 1, 2)])
def test_fused_attention_backward_on_wgmma(d: int, causal: int, warps: int, queries: int, producer: int,
                                           n: int, defer: int, ds_buffers: int) -> None:
    """attention_bwd_sm90 (dK, dV, and dQ by atomics: each step's dSᵀ through shared memory into a transposed-A
    wgmma, TMA reductions into dQ_sum; with two warpgroups each one 64×64 panel of the block's dQ; with DEFER_DQ
    each step's dQ added in the next; with DS_BUFFERS=2 dSᵀ in two buffers, no write-after-read barrier) then
    attention_bwd_dq_scale: the simulation agrees with float64."""
    from reference import attention_backward_ref

    from tkc.kernels.attention_bwd import attention_bwd_dq_scale, attention_bwd_sm90

    rng = np.random.default_rng(d + causal + 7)
    q, k, v, do = (random_bf16(rng, 1, 2, n, d) for _ in range(4))
    out, lse, dq_ref, dk_ref, dv_ref = attention_backward_ref(q, k, v, do, bool(causal), 0.1)
    delta = (do.astype(np.float64) * out.astype(q.dtype).astype(np.float64)).sum(-1).astype(np.float32)
    constants = {"D": d, "CAUSAL": causal, "WARPS": warps, "QUERIES": queries, "STAGES": 2, "PRODUCER": producer,
                 "RAGGED": int(n % queries > 0), "DEFER_DQ": defer, "DS_BUFFERS": ds_buffers}
    args = [q, k, v, do, lse.astype(np.float32), delta, poisoned(1, 2, n, d), poisoned(1, 2, n, d),
            np.zeros((1, 2, n, d), np.float32), 0.1]
    interp, sim = run_both(attention_bwd_sm90, args, (2, -(-n // (16 * warps)), 1), constants, target="sm_90a",
                           order="sliced")
    for got in (interp, sim):
        assert rel_err(got[6], dk_ref) < 1e-2 and rel_err(got[7], dv_ref) < 1e-2
    _, dq = run_both(attention_bwd_dq_scale, [sim[8], poisoned(1, 2, n, d), 0.1], (-(-n // 64), 2, 1), {"D": d})
    assert rel_err(dq[1], dq_ref) < 1e-2


@pytest.mark.parametrize("mutated", [False, True])
def test_streamed_loads_stay_before_a_stage_release(monkeypatch: pytest.MonkeyPatch, mutated: bool) -> None:
    """attention_bwd_dq built for sm_90a (K and V on a TMA ring): the mma.sync operands loaded from a stage are read
    before the stage is released, not streamed into the mmas behind the release (where the next TMA load may already
    be refilling it: wrong dq on the H200). With the warps handed over every few instructions the simulation
    reports the mutated lowering (streaming past the release) and agrees with float64 without it."""
    from reference import attention_backward_ref

    from tkc.backend.simulator import SimulationError
    from tkc.ir import tma_ops
    from tkc.kernels.attention_bwd import attention_bwd_dq
    from tkc.passes import util

    if mutated:
        monkeypatch.setattr(util, "SHARED_WRITERS", tuple(w for w in util.SHARED_WRITERS
                                                          if w is not tma_ops.StageReleaseOp))
    rng = np.random.default_rng(3)
    n = 512
    q, k, v, do = (random_bf16(rng, 1, 1, n, 64) for _ in range(4))
    out, lse, dq_ref, _, _ = attention_backward_ref(q, k, v, do, False, 0.125)
    delta = (do.astype(np.float64) * out.astype(q.dtype).astype(np.float64)).sum(-1).astype(np.float32)
    args = [q, k, v, do, lse.astype(np.float32), delta, poisoned(1, 1, n, 64), 0.125]
    aligns = {p.name: tensor_alignment(a) for p, a in zip(attention_bwd_dq.runtime_params, args) if p.kind == "tensor"}
    module = lower_kernel(attention_bwd_dq, "sm_90a", {"D": 64, "KEYS": 64}, aligns=aligns)
    if mutated:
        with pytest.raises(SimulationError, match="an ldmatrix of warp . may not have read yet"):
            simulate(module, "attention_bwd_dq", args, (n // 64, 1, 1), order="sliced", seed=0)
    else:
        simulate(module, "attention_bwd_dq", args, (n // 64, 1, 1), order="sliced", seed=0)
        assert rel_err(args[6], dq_ref) < 1e-2


@tkc.kernel(warps=4, min_target="sm_80")
def rows_passed_on(X: gl[f32, 3], Y: gl[f32, 3], BUFFERS: const = 2):
    """Each step every warp writes its 16 rows of X[j] into a shared tile and copies the next warp's into Y[j]."""
    for j in range(X.shape[0]):
        s = store(empty(st[f32, 64, 64], buffers=BUFFERS), load(X, (j, warp_id(), 0), rt[f32, 16, 64]), (warp_id(), 0))
        store(Y, load(s, ((warp_id() + 1) % 4, 0), rt[f32, 16, 64]), (j, warp_id(), 0))


@pytest.mark.filterwarnings("ignore:.*bank conflict")  # f32 rows in an unswizzled tile: beside the point here
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("mutated", [False, True])
def test_double_buffered_tile(monkeypatch: pytest.MonkeyPatch, target: str, mutated: bool) -> None:
    """A shared tile made in a loop with buffers=2: one barrier a step (read after write) where one buffer needs two,
    the steps alternating between its buffers. With the steps all in the first buffer (mutated), a warp run ahead
    to the next barrier (the simulation runs the last warp first) overwrites rows the one before it has yet to
    read: the simulated copy comes out wrong."""
    from tkc.backend import lower_memory

    barriers = [compile_kernels([rows_passed_on], target, {"BUFFERS": b}).split("$LOOP")[1].count("bar.sync")
                for b in (1, 2)]
    assert barriers == [2, 1]
    if mutated:
        monkeypatch.setattr(lower_memory, "this_steps_buffer", lambda lw, op, base: base)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 64, 64)).astype(np.float32)
    ref = np.roll(x, -16, axis=1)
    interp, sim = run_both(rows_passed_on, [x, np.full_like(x, np.nan)], (1,), target=target, order="descending")
    np.testing.assert_array_equal(interp[1], ref)
    assert np.array_equal(sim[1], ref) != mutated


@tkc.kernel(warps=4, min_target="sm_80")
def tiles_summed(X: gl[f32, 2], Y: gl[f32, 2]):
    """Every warp of every block adds twice its 16×64 tile of X into tile warp % 2 of Y (rows past Y's end dropped)."""
    atomic_add(Y, load(X, (warp_id(), 0), rt[f32, 16, 64]) * 2.0, (warp_id() % 2, 0))


@pytest.mark.parametrize("target, pitch", [("sm_80", 64), ("sm_90a", 64), ("sm_90a", 66)])
@pytest.mark.parametrize("rows", [32, 21])
def test_atomic_add_simulated(target: str, pitch: int, rows: int) -> None:
    """Warps and blocks summing into the same elements end with every addend: red.global.add on sm_80, a TMA
    reduction on sm_90a, red.global.add.v2 there where rows are 8- but not 16-byte aligned (a pitch of 66)."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    y = rng.standard_normal((rows, pitch)).astype(np.float32)[:, :64]
    interp, sim = run_both(tiles_summed, [x, y], (3,), target=target)
    ref = y + 6 * (x[:32] + x[32:])[:rows]
    np.testing.assert_allclose(interp[1], ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sim[1], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("d, causal, target", [(64, 1, "sm_80"), (128, 0, "sm_80"), (64, 0, "sm_90a"),
                                               (128, 1, "sm_90a"), (96, 1, "sm_80"), (32, 0, "sm_80")])
def test_grouped_query_attention_simulated(d: int, causal: int, target: str) -> None:
    """Two query heads reading one K/V head (GROUP=2): the forward, and dK/dV, whose one loop runs over both query
    heads' steps (its pipeline, cp.async or TMA, runs on from one head into the next); the simulation agrees with
    the interpreter, which agrees with float64."""
    from reference import attention_backward_ref

    from tkc.kernels import attention_sm90
    from tkc.kernels.attention_bwd import CONFIG, CONFIG_SM90, attention_bwd_dkdv, attention_bwd_dkdv_sm90

    rng = np.random.default_rng(d + causal)
    n = 128
    q, do = (random_bf16(rng, 1, 2, n, d) for _ in range(2))
    k, v = (random_bf16(rng, 1, 1, n, d) for _ in range(2))
    out, lse, _, dk_ref, dv_ref = attention_backward_ref(q, k, v, do, bool(causal), 0.1)
    if target == "sm_80":
        fwd, fwd_grid, fwd_args, fwd_cfg = attention_fwd, (2, 2, 1), [q, k, v, poisoned(1, 2, n, d), 0.1], {}
        dkdv_kernel, dkdv_cfg = attention_bwd_dkdv, {**CONFIG[d][0], "WARPS": 4}
    else:
        fwd, fwd_grid, fwd_cfg = attention_sm90, (2,), {"WARPS": 8}
        fwd_args = [q, k, v, poisoned(1, 2, n, d), poisoned(1, 1, 1, dtype=np.float32), 0.1]
        dkdv_kernel, dkdv_cfg = attention_bwd_dkdv_sm90, {"WARPS": 8 if d == 128 else 4, **CONFIG_SM90[d][0]}
    interp, sim = run_both(fwd, fwd_args, fwd_grid, {"D": d, "CAUSAL": causal, "GROUP": 2, **fwd_cfg}, target=target,
                           order="shuffled")
    assert rel_err(interp[3], out) < 1e-2 and rel_err(sim[3], interp[3]) < 2e-3
    delta = ((out * do.astype(np.float64)).sum(-1)).astype(np.float32)
    args = [q, k, v, do, lse.astype(np.float32), delta, poisoned(1, 1, n, d), poisoned(1, 1, n, d), 0.1]
    grid = (-(-n // (16 * dkdv_cfg["WARPS"])), 1, 1)
    interp, sim = run_both(dkdv_kernel, args, grid, {"D": d, "CAUSAL": causal, "GROUP": 2, **dkdv_cfg}, target=target,
                           order="shuffled")
    assert rel_err(interp[6], dk_ref) < 1e-2 and rel_err(interp[7], dv_ref) < 1e-2
    assert rel_err(sim[6], interp[6]) < 2e-3 and rel_err(sim[7], interp[7]) < 2e-3


@pytest.mark.parametrize("d, causal", [(128, 0), (128, 1), (64, 0), (96, 1)])
def test_grouped_query_attention_as_attention_launches_it(d: int, causal: int) -> None:
    """attention_sm90 with GROUP=2 in attention()'s configuration (D=128 and 96: the tile loop rotated, the next tile's
    first Q·Kᵀ issued under this one's epilogue; a producer warpgroup; D=96 rows of three 64-byte panels) on a grid of a third of the tiles, so that
    each block walks on into query heads of another K/V head: the simulated PTX (after every pass) against float64."""
    from tkc.kernels import attention_sm90
    from tkc.kernels.attention import sm90_blocks, sm90_config, sm90_constants

    batch, heads, n = 1, 4, 300
    cfg = sm90_config(d, n, n, bool(causal))
    constants = {"D": d, **sm90_constants(cfg), "CAUSAL": causal, "LSE": 1, "GROUP": 2}
    rng = np.random.default_rng(d + causal)
    q = random_bf16(rng, batch, heads, n, d)
    k, v = (random_bf16(rng, batch, heads // 2, n, d) for _ in range(2))
    args = [q, k, v, poisoned(batch, heads, n, d), poisoned(batch, heads, n, dtype=np.float32), d**-0.5]
    module = lower_kernel(attention_sm90, "sm_90a", constants,
                          aligns={"Q": 16, "K": 16, "V": 16, "O": 16, "L": 4})
    simulate(module, "attention_sm90", args, (sm90_blocks(batch, heads, n, cfg["WARPS"], 3),), order="shuffled")
    out, lse = attention_ref(q, k, v, causal=bool(causal), scale=d**-0.5, lse=True)
    assert rel_err(args[3], out) < 2e-2 and rel_err(args[4], lse) < 1e-4


@pytest.mark.parametrize("causal, n, grid, group, long", [(0, 200, 3, 1, 0), (1, 300, 2, 2, 0), (1, 300, 3, 1, 1)])
def test_attention_head_dim_256_as_attention_launches_it(causal: int, n: int, grid: int, group: int,
                                                         long: int) -> None:
    """attention_sm90 at D = 256 in attention()'s configuration (two stages, K and V in rings apart, a producer;
    80-key steps not causal and causal from LONG_KEYS keys on (`long`), else 64; rows of four 128-byte swizzled
    panels) on a grid of fewer blocks than tiles, so that each block takes several, at a length its steps do not
    divide (and two query heads a K/V head): the simulated PTX (after every pass) against float64, with the log-sum-exp."""
    from tkc.kernels import attention_sm90
    from tkc.kernels.attention import LONG_KEYS, sm90_config, sm90_constants

    batch, heads, d = 1, 2, 256
    cfg = sm90_config(d, n, LONG_KEYS if long else n, bool(causal))
    assert cfg["KEYS"] == (80 if long or not causal else 64) and cfg["SPLIT_RING"] == 1
    constants = {"D": d, **sm90_constants(cfg), "CAUSAL": causal, "LSE": 1, **({"GROUP": group} if group > 1 else {})}
    rng = np.random.default_rng(causal)
    q = random_bf16(rng, batch, heads, n, d)
    k, v = (random_bf16(rng, batch, heads // group, n, d) for _ in range(2))
    args = [q, k, v, poisoned(batch, heads, n, d), poisoned(batch, heads, n, dtype=np.float32), d**-0.5]
    module = lower_kernel(attention_sm90, "sm_90a", constants, aligns={"Q": 16, "K": 16, "V": 16, "O": 16, "L": 4})
    simulate(module, "attention_sm90", args, (grid,), order="shuffled")
    out, lse = attention_ref(q, k, v, causal=bool(causal), scale=d**-0.5, lse=True)
    assert rel_err(args[3], out) < 2e-2 and rel_err(args[4], lse) < 1e-4


@pytest.mark.parametrize("causal, keys, stages", [(0, 64, 3), (1, 64, 3), (1, 80, 2)])
def test_attention_head_dim_256_half_the_queries_in_registers(causal: int, keys: int, stages: int) -> None:
    """attention_sm90 at D = 256 with Q_REGS=2: each warp's 16 rows of the first 128 columns of Q loaded from global
    memory into registers (causal: the first block's rows before row 0 masked), the other 128 a shared tile of their
    own read by every Q·Kᵀ (beside a column view of the K stage), held to the tile's end; three stages of 64 keys
    (which fit beside the half tile) or two of 80; two tiles a block, a length the steps do not divide: the
    simulated PTX against float64."""
    from hopper_kernels import simulated_attention_sm90_error

    constants = {"D": 256, "KEYS": keys, "WARPS": 8, "STAGES": stages, "DEFER": 1, "PRODUCER": 2, "Q_REGS": 2,
                 "CAUSAL": causal}
    assert simulated_attention_sm90_error(constants, 200, seed=causal) < 2e-2


@pytest.mark.parametrize("d, causal, keys, producer, mutated", [
    (256, 0, 80, 2, False), (256, 1, 64, 1, False), (128, 0, 128, 0, False), (256, 0, 80, 2, True)])
def test_attention_split_ring(monkeypatch: pytest.MonkeyPatch, d: int, causal: int, keys: int, producer: int,
                              mutated: bool) -> None:
    """SPLIT_RING=1 (DEFER=2, two stages): K and V with barriers of their own, K released once Q·Kᵀ is waited for
    and refilled a step ahead, V waited for at the end of its step and released a step late, after the deferred P·V
    that reads it; with a producer warpgroup (which fills both) or without; more steps than stages, two tiles a
    block, a ragged length. The mutation releases V at once as well: the refill lands in the stage the deferred P·V
    still reads, and the simulated output comes out wrong."""
    from hopper_kernels import simulated_attention_sm90_error

    from tkc.backend.simulator import SimulationError
    from tkc.passes import insert_tma_pipeline as pipeline

    if mutated:
        monkeypatch.setattr(pipeline, "_read_by_a_lasting_wgmma", lambda stage, loop: False)
    constants = {"D": d, "KEYS": keys, "WARPS": 8, "STAGES": 2, "DEFER": 2, "PRODUCER": producer, "SPLIT_RING": 1,
                 "CAUSAL": causal}
    try:
        ok = simulated_attention_sm90_error(constants, 400, seed=d + causal) < 2e-2
    except SimulationError:  # (the simulator may also report the race itself)
        ok = False
    assert ok != mutated


@pytest.mark.parametrize("d, causal, target", [(128, 1, "sm_80"), (64, 0, "sm_90a"), (256, 1, "sm_90a")])
def test_grouped_dkdv_in_parts_simulated(d: int, causal: int, target: str) -> None:
    """Four query heads a K/V head split into two parts (SPLIT=2: a block each, two query heads' steps in its loop),
    each storing its partial dK and dV at part·B + b (at D = 256 in halves of columns too), then
    attention_bwd_sum_parts: the simulated PTX agrees with the interpreter, and their sums with float64."""
    from reference import attention_backward_ref

    from tkc.kernels.attention_bwd import CONFIG, CONFIG_SM90, attention_bwd_dkdv, attention_bwd_dkdv_sm90
    from tkc.kernels.attention_bwd import attention_bwd_sum_parts, dkdv_blocks

    rng = np.random.default_rng(d + causal + 7)
    n = 128
    q, do = (random_bf16(rng, 1, 4, n, d) for _ in range(2))
    k, v = (random_bf16(rng, 1, 1, n, d) for _ in range(2))
    out, lse, _, dk_ref, dv_ref = attention_backward_ref(q, k, v, do, bool(causal), 0.1)
    delta = ((out * do.astype(np.float64)).sum(-1)).astype(np.float32)
    if target == "sm_80":
        kernel, cfg = attention_bwd_dkdv, {**CONFIG[d][0], "WARPS": 4}
    else:
        kernel, cfg = attention_bwd_dkdv_sm90, {"WARPS": 4, **CONFIG_SM90[d][0]}
    args = [q, k, v, do, lse.astype(np.float32), delta, poisoned(2, 1, n, d), poisoned(2, 1, n, d), 0.1]
    grid = (dkdv_blocks(n, d, cfg), 2, 1)  # D = 256: dK, dV in halves
    interp, sim = run_both(kernel, args, grid, {"D": d, "CAUSAL": causal, "GROUP": 4, "SPLIT": 2, **cfg},
                           target=target, order="shuffled")
    assert rel_err(sim[6], interp[6]) < 2e-3 and rel_err(sim[7], interp[7]) < 2e-3
    for part, ref in ((sim[6], dk_ref), (sim[7], dv_ref)):
        interp_sum, sim_sum = run_both(attention_bwd_sum_parts, [part.reshape(2, n, d), poisoned(n, d)], (2,),
                                       {"D": d}, order="shuffled")
        assert rel_err(sim_sum[1], interp_sum[1]) < 1e-6 and rel_err(sim_sum[1], ref[0, 0]) < 1e-2


@pytest.mark.parametrize("d, target, nk, f16", [(64, "sm_80", 300, 0), (128, "sm_90a", 300, 0), (128, "sm_80", 40, 0),
                                                (64, "sm_90a", 1000, 1), (256, "sm_90a", 300, 0)])
def test_decode_attention_simulated(d: int, target: str, nk: int, f16: int) -> None:
    """attention_decode over keys split into parts (its loop over a part's key steps through the cp.async / TMA
    ring, the last step past Nk; at Nk = 40 and 300 some warps see only keys past the end), then the four warps'
    results weighed in shared memory, and attention_decode_combine: the simulated PTX agrees with the interpreter,
    and with float64; bf16, and f16 (DT)."""
    from tkc.kernels.attention_decode import CONFIG, CONFIG_SM80, attention_decode, attention_decode_combine
    from tkc.lang import f16 as f16_type

    rng = np.random.default_rng(d + nk)
    batch, heads, kv_heads, nq = 1, 6, 2, 3
    rows = heads // kv_heads * nq
    dtype = {"DT": f16_type} if f16 else {}
    cast = (lambda a: a.astype(np.float16)) if f16 else (lambda a: a)
    q = cast(random_bf16(rng, batch, heads, nq, d))
    k, v = (cast(random_bf16(rng, batch, kv_heads, nk, d)) for _ in range(2))
    keys, stages, _ = (CONFIG if target == "sm_90a" else CONFIG_SM80)[d]  # what attention() launches on each path
    steps = -(-nk // (4 * keys))
    per_part = -(-steps // 2)
    parts = -(-steps // per_part)
    args = [q.reshape(batch, kv_heads, rows, d), k, v, UNREAD_LENGTHS, UNREAD_PAGES,
            poisoned(parts * batch, kv_heads, rows, d, dtype=np.float32),
            poisoned(parts * batch, kv_heads, rows, dtype=np.float32), 0.1, per_part]
    interp, sim = run_both(attention_decode, args, (parts, kv_heads, batch),
                           {"D": d, "KEYS": keys, "STAGES": stages, **dtype}, target=target, order="shuffled")
    assert rel_err(sim[5], interp[5]) < 1e-4 and np.abs(sim[6] - interp[6]).max() < 1e-4
    flat = batch * heads * nq
    args = [sim[5].reshape(parts, flat, d), sim[6].reshape(parts, flat), cast(poisoned(flat, d)),
            poisoned(flat, dtype=np.float32)]
    interp, sim = run_both(attention_decode_combine, args, (-(-flat // 16), d // 32), {"LSE": 1, **dtype},
                           target=target)
    ref, ref_lse = attention_ref(q, k, v, scale=0.1, lse=True)
    assert rel_err(sim[2], interp[2]) < 1e-6 and rel_err(sim[2].reshape(q.shape), ref) < 1e-2
    assert np.abs(sim[3].reshape(ref_lse.shape) - ref_lse).max() < 1e-4


def decoding_split(d: int, nk: int, parts: int, rows: int) -> tuple:
    """One query row a head of 2 K/V heads (batch 1, `rows` rows a K/V head), nk keys, and CONFIG[d]'s split of them
    into exactly `parts` parts: (q, k, v, keys a warp and step, stages, steps a part)."""
    from tkc.kernels.attention_decode import CONFIG

    rng = np.random.default_rng(d + nk)
    q = random_bf16(rng, 1, 2 * rows, 1, d)
    k, v = (random_bf16(rng, 1, 2, nk, d) for _ in range(2))
    keys, stages, _ = CONFIG[d]
    steps = -(-nk // (4 * keys))
    per_part = -(-steps // parts)
    assert -(-steps // per_part) == parts
    return q, k, v, keys, stages, per_part


@pytest.mark.parametrize("d, nk, parts, rows", [(128, 300, 3, 12), (64, 4000, 8, 20), (64, 4000, 16, 5),
                                                  (256, 100, 1, 3), (128, 4000, 16, 5), (256, 300, 3, 3)])
def test_decode_attention_in_clusters_simulated(d: int, nk: int, parts: int, rows: int) -> None:
    """attention_decode_cluster (Hopper's one-launch decoding): each block its part of the keys, then after a cluster
    barrier each warp of the cluster weighs its 16 columns of the parts out of the blocks' shared memory (mapa +
    ld.shared::cluster); the blocks simulated together, in shuffled order: agrees with the interpreter and with
    float64, out and log-sum-exp (rows 20: two row tiles, two clusters a K/V head; parts 16: a non-portable cluster;
    parts 1: no cluster, each warp four of D = 256's 16 column tiles; D = 256 over 3 parts: 16 column tiles for 12
    warps, some take two)."""
    from tkc.kernels.attention_decode import attention_decode_cluster

    batch, kv_heads = 1, 2
    q, k, v, keys, stages, per_part = decoding_split(d, nk, parts, rows)
    args = [q.reshape(batch, kv_heads, rows, d), k, v, UNREAD_LENGTHS, UNREAD_PAGES, poisoned(batch, kv_heads, rows, d),
            poisoned(batch, kv_heads, rows, dtype=np.float32), 0.1, per_part]
    interp, sim = run_both(attention_decode_cluster, args, (parts * -(-rows // 16), kv_heads, batch),
                           {"D": d, "KEYS": keys, "STAGES": stages, "CLUSTER": parts, "LSE": 1}, target="sm_90a",
                           order="shuffled")
    ref, ref_lse = attention_ref(q, k, v, scale=0.1, lse=True)
    assert rel_err(sim[5], interp[5]) < 1e-2 and rel_err(sim[5].reshape(q.shape), ref) < 1e-2
    assert np.abs(sim[6].reshape(ref_lse.shape) - ref_lse).max() < 1e-4


@pytest.mark.parametrize("parts, rows, d, target", [(1, 20, 64, "sm_80"), (6, 16, 128, "sm_90a"),
                                                    (13, 40, 64, "sm_90a")])
def test_decode_combine_simulated(parts: int, rows: int, d: int, target: str) -> None:
    """attention_decode_combine alone over parts' outputs and log-sum-exps far apart (some -inf: a part that saw no
    key weighs nothing): each warp's every fourth part (none for some warps at 1 part; 4 in flight past 13), then
    the warps' results in shared memory, against float64."""
    from tkc.kernels.attention_decode import attention_decode_combine

    rng = np.random.default_rng(parts + rows)
    o_parts = rng.standard_normal((parts, rows, d)).astype(np.float32)
    l_parts = rng.uniform(-30, 30, (parts, rows)).astype(np.float32)
    if parts > 1:
        l_parts[rng.integers(1, parts), :rows // 2] = -np.inf
    args = [o_parts, l_parts, poisoned(rows, d), poisoned(rows, dtype=np.float32)]
    interp, sim = run_both(attention_decode_combine, args, (-(-rows // 16), d // 32), {"LSE": 1}, target=target)
    lse = np.logaddexp.reduce(l_parts.astype(np.float64), axis=0)
    ref = (np.exp(l_parts - lse)[:, :, None] * o_parts).sum(axis=0)
    assert rel_err(sim[2], interp[2]) < 1e-6 and rel_err(sim[2], ref) < 1e-2
    assert np.abs(sim[3] - lse).max() < 1e-4 and np.abs(interp[3] - lse).max() < 1e-4


@pytest.mark.parametrize("rows, cols, target", [(300, 80, "sm_80"), (17, 32, "sm_90a")])
def test_column_sums_simulated(rows: int, cols: int, target: str) -> None:
    """column_sums_kernel over more rows than its 16 warps take in one step of 8 (300: three steps, the last short)
    and a column block past the last column (80), into bf16: the simulated PTX agrees with the interpreter and
    with float64."""
    from tkc.kernels.layernorm_bwd import column_sums_kernel
    from tkc.lang import bf16

    rows_in = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32)
    interp, sim = run_both(column_sums_kernel, [rows_in, poisoned(cols)], (-(-cols // 32),), {"DT": bf16},
                           target=target)
    assert rel_err(sim[1], interp[1]) < 1e-6 and rel_err(sim[1], rows_in.astype(np.float64).sum(axis=0)) < 1e-2


@pytest.mark.parametrize("d, rms, target", [(64, 0, "sm_80"), (1024, 1, "sm_90a"), (2048, 0, "sm_80")])
def test_layernorm_backward_simulated(d: int, rms: int, target: str) -> None:
    """layernorm_bwd_kernel in backward_layout(D) (D = 64, 1024: a row a warp, each block's warps over every 3rd
    group of rows, their partial sums added in shared memory; 2048: each block over every 3rd row, its sums
    exchanged through shared memory), the next row's loads ahead and the new residual's gradient added, and
    column_sums_kernel over its partial dweight / dbias: the simulated PTX agrees with the interpreter, and with
    float64."""
    from reference import layernorm_backward_ref

    from tkc.kernels.layernorm_bwd import backward_layout, column_sums_kernel, layernorm_bwd_kernel
    from tkc.lang import bf16

    rng = np.random.default_rng(d + rms)
    rows = 7
    s, dy, grad_s = (random_bf16(rng, rows, d) for _ in range(3))
    w = random_bf16(rng, d)
    width = d if rms else 2 * d  # dy·x̂'s partial sums, then dy's
    args = [s, dy, grad_s, w, poisoned(rows, d), poisoned(3, width, dtype=np.float32), 1e-5]
    warps, split = backward_layout(d)
    interp, sim = run_both(layernorm_bwd_kernel, args, (3,), {"D": d, "WARPS": warps, "SPLIT": split, "RMS": rms,
                                                              "DS_IN": 1}, target=target, order="shuffled")
    ref = layernorm_backward_ref(s, dy, grad_s, w, 1e-5, rms=bool(rms))
    assert rel_err(sim[4], interp[4]) < 1e-2 and rel_err(sim[4], ref[0]) < 1e-2
    assert rel_err(sim[5], interp[5]) < 1e-5
    _, summed = run_both(column_sums_kernel, [sim[5], poisoned(width)], (-(-width // 32),), {"DT": bf16},
                         target=target)
    assert rel_err(summed[1][:d], ref[1]) < 1e-2 and (rms or rel_err(summed[1][d:], ref[2]) < 1e-2)


@tkc.kernel(warps="WARPS", min_target="sm_80")
def copy_tile(A: gl[bf16, 2], B: gl[bf16, 2], C: gl[bf16, 2], ROWS: const = 32, COLS: const = 96, WARPS: const = 4):
    """A's tile b into shared memory (the block's threads each copying chunks of it), then to B's tile b straight
    from shared memory, and to C's through registers (warp w its 16-row slices w, w + WARPS, ...)."""
    s = load(A, (block_idx()[0], 0), st[bf16, ROWS, COLS])
    store(B, s, (block_idx()[0], 0))
    for i in range(warp_id(), ROWS // 16, WARPS):
        store(C, load(s, (i, 0), rt[bf16, 16, COLS]), (block_idx()[0] * (ROWS // 16) + i, 0))


@pytest.mark.parametrize("rows, cols, warps, pad", [(32, 96, 4, 0), (16, 80, 3, 0), (16, 1040, 4, 0), (32, 96, 4, 2),
                                                    (32, 64, 4, 0)])
def test_tile_copies_whose_rows_do_not_divide_the_threads(rows: int, cols: int, warps: int, pad: int) -> None:
    """A tile's collective copies (cp.async into shared memory, and shared to global) when its rows of 16-byte
    chunks do not divide the block's threads: 12 chunks a row over 128 threads (10 rows a pass), 10 over 96,
    130 over 128 (two passes a row), and 4-byte chunks where the tensor's rows are 2 elements off 16 bytes; the
    last tile partly outside the tensor (its rows read zeros, its writes dropped)."""
    rng = np.random.default_rng(cols + pad)
    n = rows + rows // 2 + 3  # two tiles, the second cut short
    a = random_bf16(rng, n, cols + pad)[:, :cols]
    b, c = poisoned(n, cols), poisoned(n, cols)
    interp, sim = run_both(copy_tile, [a, b, c], (2,), {"ROWS": rows, "COLS": cols, "WARPS": warps}, order="shuffled")
    for got in (sim[1], sim[2], interp[1], interp[2]):
        np.testing.assert_array_equal(got.astype(np.float32), a.astype(np.float32))


@pytest.mark.parametrize("blocks, order", [(1, "ascending"), (4, "descending"), (7, "shuffled")])
def test_last_block_sum_simulated(blocks: int, order: str) -> None:
    """arrive_last in PTX (fence, bar.sync, one thread's atom.acq_rel.gpu.global.add.u32, the reset by a guarded
    st.global, bar.red.or.pred to give warp 1 the verdict of thread 0): the last block to arrive sums the parts the
    other blocks left, as in the interpreter, and leaves the counter at 0 for the next launch."""
    from kernels.last_block_sum import last_block_sum

    rng = np.random.default_rng(blocks)
    counter = np.zeros(2, np.int32)
    for _ in range(2):
        x = rng.standard_normal((32 * blocks, 64)).astype(np.float32)
        parts, out = np.full_like(x, np.nan), np.full((32, 64), np.nan, np.float32)
        interp, sim = run_both(last_block_sum, [x, parts, out, counter], (blocks,), {"N": 64}, order=order)
        assert rel_err(sim[2], x.reshape(blocks, 32, 64).astype(np.float64).sum(0)) < 1e-6
        assert rel_err(sim[2], interp[2]) < 1e-6 and not sim[3].any() and not interp[3].any()


@pytest.mark.parametrize("d, nk, parts, rows, target", [(128, 300, 3, 12, "sm_90a"), (64, 1000, 4, 20, "sm_80")])
def test_decode_attention_last_block_weighs_simulated(d: int, nk: int, parts: int, rows: int, target: str) -> None:
    """attention_decode_last in PTX: each block's part to global memory, its arrival at the row tile's counter, and
    the last part weighing all of them (two row tiles at rows 20): agrees with the interpreter and with float64, out
    and log-sum-exp, the counters back at 0."""
    from tkc.kernels.attention_decode import attention_decode_last

    batch, kv_heads, tiles = 1, 2, -(-rows // 16)
    q, k, v, keys, stages, per_part = decoding_split(d, nk, parts, rows)
    args = [q.reshape(batch, kv_heads, rows, d), k, v, UNREAD_LENGTHS, UNREAD_PAGES,
            poisoned(parts * batch, kv_heads, rows, d, dtype=np.float32),
            poisoned(parts * batch, kv_heads, rows, dtype=np.float32), poisoned(batch, kv_heads, rows, d),
            poisoned(batch, kv_heads, rows, dtype=np.float32), np.zeros(kv_heads * tiles, np.int32), 0.1, per_part]
    interp, sim = run_both(attention_decode_last, args, (parts * tiles, kv_heads, batch),
                           {"D": d, "KEYS": keys, "STAGES": stages, "LSE": 1}, target=target, order="shuffled")
    ref, ref_lse = attention_ref(q, k, v, scale=0.1, lse=True)
    assert rel_err(sim[7], interp[7]) < 1e-2 and rel_err(sim[7].reshape(q.shape), ref) < 1e-2
    assert np.abs(sim[8].reshape(ref_lse.shape) - ref_lse).max() < 1e-4 and not sim[9].any()


@pytest.mark.parametrize("kernel, d, target, paged", [("decode", 128, "sm_80", 0), ("decode", 64, "sm_90a", 1),
                                                      ("last", 64, "sm_80", 1), ("cluster", 128, "sm_90a", 0),
                                                      ("cluster", 128, "sm_90a", 1), ("cluster", 256, "sm_90a", 0)])
def test_decode_attention_over_cache_lengths_simulated(kernel: str, d: int, target: str, paged: int) -> None:
    """The decoding kernels built with LENGTHS (attention_kvcache): each batch over its own first Lengths[b] keys of
    the cache (0: zero rows and lse -inf; past Nk: all of them; parts past a batch's keys empty), three parts a row
    tile, the cache's rows past each length NaN (never written: masked, not multiplied by 0); with PAGED, the cache
    in pages of one or two key steps scattered over a pool by a page table: the simulated PTX against the
    interpreter, and against float64 per batch."""
    from reference import kvcache_ref, nan_past, paged_cache

    from tkc.kernels.attention_decode import (CONFIG, CONFIG_SM80, attention_decode, attention_decode_cluster,
                                              attention_decode_combine, attention_decode_last)

    rng = np.random.default_rng(d + paged)
    batch, kv_heads, rows, nk = 4, 2, 6, 700
    q = random_bf16(rng, batch, 2 * rows, 1, d)
    lengths = np.array([0, 333, 1, nk if paged else nk + 50], np.int32)
    k, v = (nan_past(random_bf16(rng, batch, kv_heads, nk, d), lengths) for _ in range(2))
    keys, stages, _ = (CONFIG if target == "sm_90a" else CONFIG_SM80)[d]
    steps = -(-nk // (4 * keys))
    per_part = -(-steps // 3)
    parts = -(-steps // per_part)
    constants = {"D": d, "KEYS": keys, "STAGES": stages, "LENGTHS": 1}
    pages = UNREAD_PAGES
    k_arg, v_arg = k, v
    if paged:  # pages of one key step (D = 64 on the sm_80 path: two), the pool in shuffled order, two pages unnamed
        page = 4 * keys * (2 if target == "sm_80" else 1)
        per_batch = -(-nk // page)
        pages = rng.permutation(batch * per_batch + 2)[:batch * per_batch].reshape(batch, per_batch).astype(np.int32)
        k_arg, v_arg = (paged_cache(rng, x, pages, page, batch * per_batch + 2) for x in (k, v))
        constants["PAGED"] = 1
    q_rows = q.reshape(batch, kv_heads, rows, d)
    grid = (parts, kv_heads, batch)
    out, lse = poisoned(batch, kv_heads, rows, d), poisoned(batch, kv_heads, rows, dtype=np.float32)
    if kernel == "cluster":
        interp, sim = run_both(attention_decode_cluster, [q_rows, k_arg, v_arg, lengths, pages, out, lse, 0.1,
                                                          per_part], grid, {**constants, "CLUSTER": parts, "LSE": 1},
                               target, "shuffled")
        results = [(r[5], r[6]) for r in (interp, sim)]
    else:
        o_parts = poisoned(parts * batch, kv_heads, rows, d, dtype=np.float32)
        l_parts = poisoned(parts * batch, kv_heads, rows, dtype=np.float32)
        if kernel == "last":
            counter = np.zeros(batch * kv_heads, np.int32)
            interp, sim = run_both(attention_decode_last, [q_rows, k_arg, v_arg, lengths, pages, o_parts, l_parts,
                                                           out, lse, counter, 0.1, per_part], grid,
                                   {**constants, "LSE": 1}, target, "shuffled")
            results = [(r[7], r[8]) for r in (interp, sim)]
        else:
            interp, sim = run_both(attention_decode, [q_rows, k_arg, v_arg, lengths, pages, o_parts, l_parts, 0.1,
                                                      per_part], grid, constants, target, "shuffled")
            flat = batch * 2 * rows
            results = []
            for r in (interp, sim):
                combined = run_both(attention_decode_combine, [r[5].reshape(parts, flat, d),
                                                               r[6].reshape(parts, flat), poisoned(flat, d),
                                                               poisoned(flat, dtype=np.float32)],
                                    (-(-flat // 16), d // 32), {"LSE": 1}, target)[1]
                results.append((combined[2], combined[3]))
    ref, ref_lse = kvcache_ref(q, k, v, lengths, 0.1)
    (got, got_lse), (simulated, sim_lse) = ((o.reshape(q.shape), lse.reshape(ref_lse.shape)) for o, lse in results)
    assert rel_err(got, ref) < 1e-2 and rel_err(simulated, got) < 1e-2 and not f64(simulated[0]).any()
    finite = np.isfinite(ref_lse)
    for l_got in (got_lse, sim_lse):
        assert (np.isneginf(l_got) == ~finite).all() and np.abs(l_got[finite] - ref_lse[finite]).max() < 1e-4


@pytest.mark.parametrize("lengths, key_lengths, heads, kv_heads, d, causal, order", [
    ([70, 130, 5, 200], None, 2, 2, 64, 0, "shuffled"),
    ([70, 130, 5, 200], None, 2, 1, 128, 1, "descending"),
    ([0, 1, 300, 0, 17], None, 2, 2, 96, 1, "shuffled"),  # empty sequences; one of three query blocks
    ([40, 129], [300, 2], 4, 2, 64, 1, "ascending"),  # keys of other lengths (several steps, and one key)
    ([140, 60], [140, 0], 2, 2, 64, 0, "shuffled"),  # a sequence with no keys: zero rows (as FlashAttention's)
    ([100, 37], None, 2, 2, 32, 1, "shuffled"),  # D = 32 and 256: the sm_80 kernel on every GPU
    ([50, 0, 81], [70, 5, 81], 2, 1, 256, 1, "descending"),
])
@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
# (the interpreter runs a loop for every block at once: the blocks past the last sequence, whose loop runs no step,
# compute -inf - -inf there on lanes it then leaves inactive)
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_attention_varlen_simulated(lengths, key_lengths, heads, kv_heads, d, causal, order, target) -> None:
    """attention_varlen_sm90 (producer warpgroup, deferred P·V) and attention_varlen_fwd (sm_80: mma.sync, a cp.async
    ring; attention()'s tiles for the head dim) over packed sequences: the interpreter against the float64
    reference per sequence, the simulated PTX against the interpreter; the rows past the last sequence are left as
    they were (poisoned)."""
    from tkc.kernels.attention import CONFIG
    from tkc.kernels.attention_varlen import HOPPER_DIMS, attention_varlen_fwd, attention_varlen_sm90

    if target == "sm_90a" and d not in HOPPER_DIMS:
        pytest.skip(f"D = {d} runs attention_varlen_fwd on every GPU")
    rng = np.random.default_rng(sum(lengths) + d)
    ends = np.cumsum(lengths).astype(np.int32)
    key_ends = np.cumsum(key_lengths).astype(np.int32) if key_lengths else ends
    total, total_k = int(ends[-1]) + 3, int(key_ends[-1])  # 3 rows of q past the last sequence
    q = random_bf16(rng, total, heads, d)
    k, v = random_bf16(rng, total_k, kv_heads, d), random_bf16(rng, total_k, kv_heads, d)
    packed = lambda t: t[None].transpose(0, 2, 1, 3)  # noqa: E731  (1, H, total, D), as attention_varlen's views
    out, lse = poisoned(total, heads, d), np.full((1, heads, total), np.nan, np.float32)
    constants = {"D": d, "CAUSAL": causal, "LSE": 1, **({"GROUP": heads // kv_heads} if heads != kv_heads else {})}
    kernel, grid = attention_varlen_sm90, ((-(-total // 128) + len(lengths)) * heads,)
    if target == "sm_90a":
        constants["LATE_PV"] = int(d == 64)  # (as attention_varlen launches it)
    if target == "sm_80":
        rows, keys, q_in_shared = CONFIG[d]
        constants.update(ROWS=rows, KEYS=keys, Q_IN_SHARED=q_in_shared)
        kernel, grid = attention_varlen_fwd, (-(-total // (4 * rows)) + len(lengths), heads)
    interp, sim = run_both(kernel, [packed(q), packed(k), packed(v), packed(out), lse, ends, key_ends, 0.1], grid,
                           constants, target, order)
    got, simulated = interp[3][0].transpose(1, 0, 2), sim[3][0].transpose(1, 0, 2)
    assert np.isnan(f64(got[ends[-1]:])).all() and np.isnan(f64(simulated[ends[-1]:])).all()
    assert np.isnan(interp[4][..., ends[-1]:]).all() and np.isnan(sim[4][..., ends[-1]:]).all()
    ref, ref_lse = varlen_attention_ref(q, k, v, ends, key_ends, bool(causal), 0.1)
    assert rel_err(got[:ends[-1]], ref[:ends[-1]]) < 1e-2  # (a sequence with no keys: zeros, as the reference's)
    assert np.array_equal(np.isinf(interp[4][0, :, :ends[-1]]), np.isinf(ref_lse[:, :ends[-1]]))  # (no keys: -inf)
    finite = np.isfinite(ref_lse[:, :ends[-1]])
    assert rel_err(interp[4][0, :, :ends[-1]][finite], ref_lse[:, :ends[-1]][finite]) < 1e-4
    assert rel_err(sim[4][0, :, :ends[-1]][finite], interp[4][0, :, :ends[-1]][finite]) < 1e-5
    assert rel_err(simulated[:ends[-1]], got[:ends[-1]]) < 2e-3  # (exp2 rounding, as the other attention kernels)


@pytest.mark.parametrize("rows_q, end, rows_k, key_end, d", [(200, 137, 130, 64, 64), (64, 64, 64, 64, 128),
                                                              (130, 0, 200, 3, 32), (100, 30, 100, 100, 96)])
def test_attention_varlen_zero_tail_simulated(rows_q, end, rows_k, key_end, d) -> None:
    """attention_varlen_zero_tail: zeros in dQ's rows from Ends[-1] on and in dK's and dV's from EndsK[-1] on (fewer
    K/V heads, other row counts), the rows before left as they were (a 16-row tile across the end starts at it), in
    the interpreter and the simulated PTX."""
    from tkc.kernels.attention_varlen import attention_varlen_zero_tail

    dq, dk, dv = poisoned(1, 4, rows_q, d), poisoned(1, 2, rows_k, d), poisoned(1, 2, rows_k, d)
    ends, key_ends = np.array([end // 2, end], np.int32), np.array([key_end // 3, key_end], np.int32)
    interp, sim = run_both(attention_varlen_zero_tail, [dq, dk, dv, ends, key_ends],
                           (-(-max(rows_q, rows_k) // 64), 4, 1), {"D": d}, "sm_80", "shuffled")
    for result in (interp, sim):
        for got, last in ((result[0], end), (result[1], key_end), (result[2], key_end)):
            assert np.isnan(f64(got[:, :, :last])).all() and (f64(got[:, :, last:]) == 0).all()


@pytest.mark.parametrize("lengths, key_lengths, heads, kv_heads, d, causal, order", [
    ([70, 130, 5, 200], None, 2, 2, 64, 0, "shuffled"),
    ([70, 0, 1, 150], None, 4, 2, 64, 1, "descending"),  # grouped-query: dK, dV summed over two query heads
    ([40, 129], [100, 3], 2, 1, 128, 1, "ascending"),  # keys of other lengths
    ([90, 33], [90, 0], 2, 2, 96, 0, "shuffled"),  # a sequence with no keys: no gradient for its queries
    ([65, 130], None, 4, 1, 32, 1, "shuffled"),
    ([130, 0, 3, 70], [70, 0, 200, 70], 4, 2, 128, 1, "descending"),  # more keys than queries, causal
    ([70, 131, 5, 198], None, 2, 1, 64, 1, "shuffled"),  # sequences from odd rows
])
@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_attention_varlen_backward_simulated(lengths, key_lengths, heads, kv_heads, d, causal, order, target) -> None:
    """attention_varlen_backward's dK/dV and dQ kernels with its constants (Hopper's wgmma ones, or the mma.sync
    ones' sm_80 build), after attention_bwd_delta on the packed views: the interpreter against the float64 gradients
    per sequence, the simulated PTX against the interpreter; rows past the last sequence's keys / queries left
    (poisoned)."""
    from tkc.kernels import attention_bwd_delta
    from tkc.kernels.attention_varlen import BACKWARD_SM90, backward_kernels

    if target == "sm_90a" and d not in BACKWARD_SM90:
        pytest.skip(f"D = {d}'s backward runs the sm_80 kernels on every GPU")
    rng = np.random.default_rng(sum(lengths) * d)
    ends = np.cumsum(lengths).astype(np.int32)
    key_ends = np.cumsum(key_lengths).astype(np.int32) if key_lengths else ends
    # rows past the last sequence's, up to a multiple of 8: L's and Δ's rows 16-byte aligned, as a GPU's tensors
    # usually are (the lowering may then use vector accesses: a sequence starting at an odd row must not)
    total, total_k = (int(ends[-1]) + 2 + 7) // 8 * 8, int(key_ends[-1]) + 2
    q, do = random_bf16(rng, total, heads, d), random_bf16(rng, total, heads, d)
    k, v = random_bf16(rng, total_k, kv_heads, d), random_bf16(rng, total_k, kv_heads, d)
    out, lse, dq_ref, dk_ref, dv_ref = varlen_attention_backward_ref(q, k, v, do, ends, key_ends, bool(causal), 0.1)
    packed = lambda t: t[None].transpose(0, 2, 1, 3)  # noqa: E731
    out_bf = out.astype(q.dtype)
    lse32 = lse.astype(np.float32)[None]
    delta = np.zeros((1, heads, total), np.float32)
    attention_bwd_delta.interpret(packed(out_bf), packed(do), lse32, delta, grid=(-(-total // 64), heads, 1), D=d)
    constants = {"D": d, "CAUSAL": causal, **({"GROUP": heads // kv_heads} if heads != kv_heads else {})}
    kernels = backward_kernels(d, target == "sm_90a", bool(causal))
    (dkdv_kernel, dkdv, key_rows), (dq_kernel, dq_cfg, query_rows) = kernels
    dk, dv = poisoned(total_k, kv_heads, d), poisoned(total_k, kv_heads, d)
    interp, sim = run_both(dkdv_kernel, [packed(q), packed(k), packed(v), packed(do), lse32, delta, packed(dk),
                                         packed(dv), ends, key_ends, 0.1],
                           (-(-total_k // key_rows) + len(lengths), kv_heads, 1), {**constants, **dkdv}, target, order)
    rows_k = int(key_ends[-1])
    for got, ref in ((interp[6], dk_ref), (interp[7], dv_ref)):
        got = got[0].transpose(1, 0, 2)
        assert np.isnan(f64(got[rows_k:])).all() and rel_err(got[:rows_k], ref[:rows_k]) < 2e-2
    for i in (6, 7):
        assert rel_err(sim[i][0, :, :rows_k], interp[i][0, :, :rows_k]) < 2e-3
    dq = poisoned(total, heads, d)
    interp, sim = run_both(dq_kernel, [packed(q), packed(k), packed(v), packed(do), lse32, delta, packed(dq), ends,
                                       key_ends, 0.1],
                           (-(-total // query_rows) + len(lengths), heads, 1), {**constants, **dq_cfg}, target, order)
    got, rows_q = interp[6][0].transpose(1, 0, 2), int(ends[-1])
    assert np.isnan(f64(got[rows_q:])).all() and rel_err(got[:rows_q], dq_ref[:rows_q]) < 2e-2
    assert rel_err(sim[6][0, :, :rows_q], interp[6][0, :, :rows_q]) < 2e-3
