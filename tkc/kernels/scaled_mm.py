"""FP8 GEMM with scales (Hopper): C = (A·Bᵀ) · scale_a · scale_b in bf16 (or f16, f32), from e4m3 or e5m2 operands
(any mix), f32 accumulation.

The fp8 tensor cores (wgmma k32, sm_90a) read both operands K-major, so B comes as N×K rows (a linear layer's
weight) — torch._scaled_mm's column-major K×N `mat2` is the same memory. Scales are per tensor (one element each)
or per row of A and per column of B (rowwise), as torch._scaled_mm takes them.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import tkc
from tkc.kernels._checks import cdiv as ceil_div  # `cdiv` is the DSL's, for kernels
from tkc.kernels._checks import (MULTIPROCESSORS, arrival_counters, check_tensor, current_stream_key, fail,
                                 multiprocessors, stream_scratch, wgmma_path)
from tkc.kernels.gemm import (FEW_ROWS, FEW_ROWS_MAX, SMALLER_TILES, _runs_of_k, cluster_stacks, cluster_sum,
                              cluster_tile, few_rows_in_clusters, few_rows_last_block, few_rows_product,
                              gemm_few_rows_kernel, grouped_tile, persistent_grid, run_of_k, runs_sum,
                              share_with_cluster, tile_choice)
from tkc.lang import *  # noqa: F403

if TYPE_CHECKING:
    import torch


@tkc.func
def scaled(acc, ScaleA, ScaleB, Bias, row, col, rowwise, bias, cols, rows=16):
    """`acc`, C's row block `row` (`rows` rows) × column block `col` (`cols` columns), times the scales: ScaleA[i]
    for row i and ScaleB[j] for column j with `rowwise`, else ScaleA[0]·ScaleB[0] (one element each: the rest of
    the 16 read zeros); plus Bias[j] with `bias`."""
    if rowwise:
        acc = mul_col(mul_row(acc, load(ScaleA, (row,), rv[f32, rows])), load(ScaleB, (col,), rv[f32, cols]))
    else:
        acc = acc * (sum(load(ScaleA, (0,), rv[f32, 16])) * sum(load(ScaleB, (0,), rv[f32, 16])))
    if bias:
        acc = add_col(acc, load(Bias, (col,), rv[f32, cols]))
    return acc


@tkc.kernel(warps="WARPS", stages="STAGES", producer="PRODUCER", tma_store="TMA_STORE", cluster="CLUSTER",
            min_target="sm_90a")
def scaled_mm_kernel(A: gl["AT", 2], B: gl["BT", 2], ScaleA: gl[f32, 1], ScaleB: gl[f32, 1], Bias: gl["CT", 1],
                     C: gl["CT", 2], ROWWISE: const = 0, BIAS: const = 0, BN: const = 256, BK: const = 128,
                     WARPS: const = 8, GROUP_M: const = 8, STAGES: const = 3, PRODUCER: const = 0,
                     TMA_STORE: const = 1, AT: const = fp8e4m3, BT: const = fp8e4m3, CT: const = bf16,
                     CLUSTER: const = 1, CLUSTER_N: const = 1):
    """C (M×N) = A (M×K) · Bᵀ (B is N×K) times the scales: ScaleA[0]·ScaleB[0], or with ROWWISE ScaleA[i] for
    row i and ScaleB[j] for column j; plus Bias (N) with BIAS. As gemm_sm90_kernel (persistent grid, grouped
    tiles, a TMA ring where rows are 16-byte aligned; CLUSTER tiles stacked in M sharing B's slices by TMA
    multicast, or CLUSTER / CLUSTER_N by CLUSTER_N tiles sharing A's slices along a row of them too): a block of
    WARPS / 4 warpgroups takes a (16·WARPS)×BN tile of C, each warpgroup its 64 rows;
    BK = 128 fp8 elements a step (the bytes of bf16's 64); PRODUCER=1 adds a warpgroup that only loads. Grid: up
    to cdiv(M, 16·WARPS)·cdiv(N, BN), a multiple of CLUSTER."""
    BM = 16 * WARPS
    CM = CLUSTER // CLUSTER_N  # a cluster's tiles: CM of them one above the other, CLUSTER_N side by side
    stacks_m, stacks_n = cluster_stacks(cdiv(A.shape[0], BM), cdiv(C.shape[1], BN), CLUSTER, CLUSTER_N)
    for tile in range(block_idx()[0] // CLUSTER, stacks_m * stacks_n, num_blocks()[0] // CLUSTER):  # persistent
        bm, bn = cluster_tile(grouped_tile(tile, stacks_m, stacks_n, GROUP_M), CLUSTER, CLUSTER_N)
        acc = zeros(rt[f32, 16, BN])
        for k in range(cdiv(A.shape[1], BK)):
            a_s = load(A, (bm, k), st[AT, BM, BK], multicast=(CLUSTER_N, 1))  # the blocks of this row of tiles
            a = load(a_s, (warpgroup_id(), 0), st[AT, 64, BK])
            acc = mma_ABt(a, load(B, (bn, k), st[BT, BN, BK], multicast=(CM, CLUSTER_N)), acc)
        row = bm * WARPS + warp_id()  # this warp's 16 rows of C, in units of 16
        acc = scaled(acc, ScaleA, ScaleB, Bias, row, bn, ROWWISE, BIAS, BN)
        store(C, acc if CT == f32 else acc.to(CT), (row, bn))


@tkc.kernel(warps="WARPS", min_target="sm_80")
def sum_scaled_splits_kernel(Partial: gl[f32, 3], ScaleA: gl[f32, 1], ScaleB: gl[f32, 1], Bias: gl["CT", 1],
                             C: gl["CT", 2], ROWWISE: const = 0, BIAS: const = 0, COLS: const = 64, WARPS: const = 4,
                             CT: const = bf16):
    """C = (Partial[0] + Partial[1] + ...) times the scales (plus the bias), as scaled_mm_kernel's. Grid:
    (cdiv(M, 16), cdiv(N, WARPS·COLS)); each warp adds up 16 rows × COLS columns."""
    row, part = block_idx()[0], block_idx()[1] * WARPS + warp_id()  # in units of 16 rows and of COLS columns
    total = load(Partial, (0, row, part), rt[f32, 16, COLS])
    for split in range(1, Partial.shape[0]):
        total = total + load(Partial, (split, row, part), rt[f32, 16, COLS])
    total = scaled(total, ScaleA, ScaleB, Bias, row, part, ROWWISE, BIAS, COLS)
    store(C, total if CT == f32 else total.to(CT), (row, part))


@tkc.kernel(warps="WARPS", stages="STAGES", cluster="CLUSTER", min_target="sm_90a")
def scaled_mm_few_rows_kernel(A: gl["DT", 2], B: gl["DT", 2], ScaleA: gl[f32, 1], ScaleB: gl[f32, 1],
                              Bias: gl["CT", 1], C: gl["CT", 2], ROWWISE: const = 0, BIAS: const = 0,
                              ROWS: const = 16, BK: const = 128, WARPS: const = 8, STAGES: const = 5,
                              ROTATE: const = 1, CLUSTER: const = 2, DT: const = fp8e4m3, CT: const = bf16):
    """scaled_mm for A of at most ROWS rows, A and B of one fp8 type, in one launch: gemm_few_rows_cluster_kernel
    (Cᵀ = B·Aᵀ, a block column's CLUSTER runs of K a cluster summing in distributed shared memory), then the
    scales and the bias as scaled_mm_kernel's. Grid: (cdiv(N, 16·WARPS) · CLUSTER,)."""
    bn = block_idx()[0] // CLUSTER
    first, end = run_of_k(cdiv(A.shape[1], BK), cluster_rank(), CLUSTER)
    partial = share_with_cluster(few_rows_product(A, B, bn, first, end, 1, ROWS, BK, WARPS, ROTATE, DT), ROWS, WARPS)
    if warp_id() % CLUSTER == cluster_rank():
        col = bn * WARPS + warp_id()  # the warp's 16 columns of C, in units of 16
        total = cluster_sum(partial, (0, warp_id()), rt[f32, ROWS, 16], CLUSTER)
        total = scaled(total, ScaleA, ScaleB, Bias, 0, col, ROWWISE, BIAS, 16, ROWS)
        store(C, total if CT == f32 else total.to(CT), (0, col))


@tkc.kernel(warps="WARPS", stages="STAGES", min_target="sm_90a")
def scaled_mm_few_rows_last_kernel(A: gl["DT", 2], B: gl["DT", 2], ScaleA: gl[f32, 1], ScaleB: gl[f32, 1],
                                   Bias: gl["CT", 1], Partial: gl[f32, 3], C: gl["CT", 2], Counter: gl[i32, 1],
                                   ROWWISE: const = 0, BIAS: const = 0, ROWS: const = 16, BK: const = 128,
                                   WARPS: const = 8, STAGES: const = 5, ROTATE: const = 1, RUNS: const = 4,
                                   DT: const = fp8e4m3, CT: const = bf16):
    """scaled_mm for A of at most ROWS rows in one launch on any number of blocks: gemm_few_rows_last_kernel (block
    (t, s) leaves run s's f32 sum in Partial[s], the last of block column t's RUNS runs to arrive at Counter[t] adds
    them up), then the scales and the bias as scaled_mm_kernel's. Grid: (cdiv(N, 16·WARPS), RUNS)."""
    bn, split = block_idx()[0], block_idx()[1]
    first, end = run_of_k(cdiv(A.shape[1], BK), split, RUNS)
    acc = few_rows_product(A, B, bn, first, end, 1, ROWS, BK, WARPS, ROTATE, DT)
    col = bn * WARPS + warp_id()  # the warp's 16 columns of C, in units of 16
    store(Partial, transpose(acc), (split, 0, col))
    if arrive_last(Counter, bn, RUNS):
        total = scaled(runs_sum(Partial, col, RUNS, ROWS), ScaleA, ScaleB, Bias, 0, col, ROWWISE, BIAS, 16, ROWS)
        store(C, total if CT == f32 else total.to(CT), (0, col))


# gemm()'s bf16 tile, in bytes, for fp8, where the rows of A, B and C are 16-byte aligned: a TMA ring, clusters of two
# blocks stacked in M sharing B's slices (TMA multicast) and a producer warpgroup (8192³ on the H200: 1391 TFLOP/s =
# 1.13x cuBLASLt, without either 1273 = 1.04x; RESULTS "cluster probe — 2026-12-05"); else a cp.async ring on
# narrower tiles (ptxas: 255 registers and 212 bytes of spills at BN = 256)
CONFIG = {"BN": 256, "BK": 128, "WARPS": 8, "STAGES": 3, "TMA_STORE": 1, "CLUSTER": 2, "PRODUCER": 1}
CONFIG_UNALIGNED = {"BN": 128, "BK": 128, "WARPS": 8, "STAGES": 3, "TMA_STORE": 0}
# Products with few of CONFIG's tiles take gemm()'s smaller tiles (tile_choice: the first whose tiles fill 0.9 of the
# multiprocessors), their K steps in the same bytes
SMALLER_TILES_FP8 = [{**tiles, "BK": 2 * tiles["BK"], "TMA_STORE": 0} for tiles in SMALLER_TILES]
# Up to 32 rows of a (tokens times a weight), both of one fp8 type: gemm()'s few-rows product (the weight's rows the
# wgmma's 64, a's rows its N; K split into runs), by gemm's switches: outside CUDA graph captures in one launch whose
# last run of a block column sums the runs (FEW_ROWS_LAST_BLOCK, scaled_mm_few_rows_last_kernel: 34 µs a call against
# the two kernels' 44-45 event-timed on an H100, RESULTS "few rows in one launch as shipped ... — 2026-12-06 21:21"),
# else gemm_few_rows_kernel's f32 partial sums, then sum_scaled_splits_kernel (or with FEW_ROWS_IN_CLUSTERS a cluster
# a block column, summing in distributed shared memory: scaled_mm_few_rows_kernel)
SUM_SCALED = {"COLS": 64, "WARPS": 4}


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
              bias: torch.Tensor | None = None, out_dtype: Any = None, out: torch.Tensor | None = None,
              target: str | None = None) -> torch.Tensor:
    """(a · b) · scale_a · scale_b in out_dtype (bf16, f16 or f32; default bf16, or out's) for float8_e4m3fn or
    float8_e5m2 CUDA tensors (any mix) a (M×K, row-major) and b (K×N, column-major: `weight.t()` of an N×K weight),
    as torch._scaled_mm: scale_a and scale_b are float32 tensors of one element each (per tensor) or of shapes
    (M, 1) and (1, N) (rowwise); `bias`, of shape (N,) and the output's dtype, is added after the scales. Any M,
    N, K. Hopper (sm_90a) only. The products sum in the wgmma's accumulator over all of K, as torch's
    use_fast_accum=True (its default promotes partial sums into a second f32 sum every few steps)."""
    import torch

    if torch.compiler.is_compiling():  # one op of the graph
        from tkc.kernels import torch_ops

        c = torch_ops.scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, target)
        return c if out is None else out.copy_(c)
    # The common call (a row-major, b column-major, matching K, scales of the shapes asked for, no out=) checks only
    # what the launch cannot know and launches the plan the first checked call made; dtypes and devices are the
    # launch's argument reader's to check, and anything else takes the full checks below and their error.
    if (out is None and out_dtype in (None, torch.bfloat16, torch.float16, torch.float32) and isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor) and a.dim() == 2 == b.dim() and isinstance(scale_a, torch.Tensor)
            and isinstance(scale_b, torch.Tensor) and (bias is None or isinstance(bias, torch.Tensor))):
        (m, k), (kb, n) = a.shape, b.shape
        sa, sb = a.stride(), b.stride()
        rowwise = scale_a.numel() != 1 or scale_b.numel() != 1
        if (k == kb and m and n and sa[1] == 1 and sb[0] == 1 and (bias is None or bias.shape == (n,))
                and (not rowwise or scale_a.shape == (m, 1) and scale_b.shape == (1, n))):
            out_dtype = out_dtype or torch.bfloat16
            aligned = not ((a.data_ptr() | b.data_ptr() | sa[0] | sb[1] | k) & 15 or n * out_dtype.itemsize & 15)
            sms = MULTIPROCESSORS.get(a.get_device())
            plan = sms and _PLANS.get((a.get_device(), a.dtype, b.dtype, out_dtype, rowwise, bias is not None,
                                       launch_kind(m, n, k, sms, aligned, a.dtype == b.dtype), target))
            if plan:
                c = a.new_empty((m, n), dtype=out_dtype)  # fresh: only its row length decides its alignment
                if plan(a, b.t(), scale_a.reshape(-1), scale_b.reshape(-1), _no_bias(c) if bias is None else bias, c,
                        True):
                    return c
    fp8 = {torch.float8_e4m3fn: fp8e4m3, torch.float8_e5m2: fp8e5m2}
    check_tensor("a", a, a.dtype if getattr(a, "dtype", None) in fp8 else torch.float8_e4m3fn, 2)
    check_tensor("b", b, b.dtype if getattr(b, "dtype", None) in fp8 else torch.float8_e4m3fn, 2)
    outputs = {torch.bfloat16: bf16, torch.float16: f16, torch.float32: f32}
    out_dtype = out.dtype if out_dtype is None and isinstance(out, torch.Tensor) else out_dtype or torch.bfloat16
    if out_dtype not in outputs:
        fail(f"out_dtype: scaled_mm writes torch.bfloat16, torch.float16 or torch.float32, got {out_dtype}")
    (m, k), (kb, n) = a.shape, b.shape
    if k != kb:
        fail(f"b: a is {m}x{k}, so b must be {k}xN, got {tuple(b.shape)}")
    if a.stride(1) != 1 and k > 1:
        fail(f"a: must be row-major (its last dimension contiguous), got strides {tuple(a.stride())}")
    if b.stride(0) != 1 and k > 1:
        fail(f"b: must be column-major (strides (1, K), e.g. weight.t() of an N×K weight): fp8 tensor cores read "
             f"both operands along K; got strides {tuple(b.stride())}")
    rowwise = _check_scales(scale_a, scale_b, m, n)
    if bias is not None:
        check_tensor("bias", bias, out_dtype, 1)
        if bias.shape != (n,):
            fail(f"bias: expected shape ({n},), got {tuple(bias.shape)}")
    for name, t in (("b", b), ("scale_a", scale_a), ("scale_b", scale_b), ("bias", bias)):
        if t is None:
            continue
        if t.get_device() != a.get_device():
            fail(f"{name} is on {t.device} but a is on {a.device}")
    if not wgmma_path(a.get_device(), target):
        fail("scaled_mm runs on Hopper's fp8 tensor cores (sm_90a); this GPU or target has none")
    if out is None:
        out = a.new_empty((m, n), dtype=out_dtype)
    else:
        check_tensor("out", out, out_dtype, 2)
        if out.shape != (m, n):
            fail(f"out: expected shape ({m}, {n}), got {tuple(out.shape)}")
    if m == 0 or n == 0:
        return out
    weight = b.t()  # N×K, row-major
    aligned = not ((a.data_ptr() | weight.data_ptr() | a.stride(0) | weight.stride(0) | k) & 15
                   or (out.data_ptr() | (out.stride(0) | n) * out.element_size()) & 15)  # TMA's: 16-byte rows
    args = (a, weight, scale_a.reshape(-1), scale_b.reshape(-1), _no_bias(out) if bias is None else bias, out)
    kind = launch_kind(m, n, k, multiprocessors(a.get_device()), aligned, a.dtype == b.dtype)
    key = (a.get_device(), a.dtype, b.dtype, out_dtype, rowwise, bias is not None, kind, target)
    plan = _PLANS.get(key)
    if plan is None:
        if kind[0] == "few rows":
            plan = _few_rows_plan(fp8[a.dtype], kind[1], kind[2], rowwise, bias is not None, outputs[out_dtype],
                                  args)
        else:
            tiles = CONFIG_UNALIGNED if kind[1] < 0 else CONFIG if kind[1] == 0 else SMALLER_TILES_FP8[kind[1] - 1]
            cfg = {**tiles, "ROWWISE": int(rowwise), "BIAS": int(bias is not None),
                   "AT": fp8[a.dtype], "BT": fp8[b.dtype], "CT": outputs[out_dtype]}
            if out_dtype is torch.float32:  # an f32 staging tile a warp would not fit beside the ring
                cfg["TMA_STORE"] = 0
            spec = scaled_mm_kernel.specialize(target="sm_90a", **cfg)
            plan = _tiles_plan(spec, 16 * cfg["WARPS"], cfg["BN"], spec.resident_blocks(*args), cfg.get("CLUSTER", 1))
    plan(*args, False)
    _PLANS[key] = plan  # for the common call above
    return out


def _no_bias(out: Any) -> Any:
    """The Bias argument of a launch without one (BIAS=0 never reads it): one element of out's dtype and device,
    made once."""
    key = (out.get_device(), out.dtype)
    stand_in = _NO_BIAS.get(key)
    if stand_in is None:
        stand_in = _NO_BIAS[key] = out.new_empty((1,))
    return stand_in


_NO_BIAS: dict[tuple[int, Any], Any] = {}


@functools.lru_cache(maxsize=4096)
def launch_kind(m: int, n: int, k: int, sms: int, aligned: bool, one_type: bool) -> tuple:
    """How scaled_mm() runs an m×n×k product on `sms` multiprocessors: ("few rows", rows of the kernel (16, 32),
    runs of K) for up to 32 rows of 16-byte aligned operands of one type whose K splits, else ("tiles", i): CONFIG's
    tiles (0), SMALLER_TILES_FP8[i - 1], or CONFIG_UNALIGNED (-1) where rows are not 16-byte aligned."""
    if not aligned:
        return ("tiles", -1)
    if m <= FEW_ROWS_MAX and one_type:
        runs = _runs_of_k(ceil_div(n, 16 * FEW_ROWS["WARPS"]), ceil_div(k, FEW_ROWS["BK"]), sms)
        if runs > 1:
            return ("few rows", 16 if m <= 16 else 32, runs)
    return ("tiles", tile_choice(m, n, sms))


def _tiles_plan(spec: Any, bm: int, bn: int, most: int, cluster: int = 1) -> Any:
    """scaled_mm()'s launch of scaled_mm_kernel on bm×bn tiles of C, on at most `most` blocks (gemm's
    persistent_grid): plan(a, weight, scale_a, scale_b, bias, c, common_only) launches it and says whether it did
    (common_only: see Specialized.launch)."""
    def plan(a: Any, weight: Any, scale_a: Any, scale_b: Any, bias: Any, c: Any, common_only: bool) -> bool:
        grid = persistent_grid(c.shape[0], c.shape[1], bm, bn, most, cluster)
        return spec.launch(grid, (a, weight, scale_a, scale_b, bias, c), common_only=common_only)
    return plan


def _few_rows_plan(dt: Any, rows: int, runs: int, rowwise: bool, bias: bool, ct: Any, args: tuple) -> Any:
    """scaled_mm()'s launch for up to 32 rows of a over `runs` runs of K (Cᵀ = W·Aᵀ: the weight's rows fill the
    wgmma's 64): with FEW_ROWS_LAST_BLOCK scaled_mm_few_rows_last_kernel (one launch; "eager": outside CUDA graph
    captures); with FEW_ROWS_IN_CLUSTERS scaled_mm_few_rows_kernel, each block column's runs a cluster, where the GPU
    holds all the clusters at once ("eager" alike); else gemm_few_rows_kernel's f32 partial sums, then
    sum_scaled_splits_kernel's scaled sum."""
    import torch

    split = _split_plan(dt, rows, runs, rowwise, bias, ct)
    if few_rows_last_block():
        return _last_block_plan(dt, rows, runs, rowwise, bias, ct, split, few_rows_last_block() == "eager")
    in_clusters = few_rows_in_clusters()
    if not in_clusters:
        return split
    eager = in_clusters == "eager"
    spec = scaled_mm_few_rows_kernel.specialize(target="sm_90a", ROWWISE=int(rowwise), BIAS=int(bias), ROWS=rows,
                                                CLUSTER=runs, DT=dt, CT=ct, **FEW_ROWS)
    resident, columns = spec.resident_blocks(*args), 16 * FEW_ROWS["WARPS"]

    def plan(a: Any, weight: Any, scale_a: Any, scale_b: Any, bias: Any, c: Any, common_only: bool) -> bool:
        blocks = ceil_div(c.shape[1], columns) * runs
        if blocks > resident or eager and torch.cuda.is_current_stream_capturing():
            return split(a, weight, scale_a, scale_b, bias, c, common_only)
        return spec.launch((blocks, 1, 1), (a, weight, scale_a, scale_b, bias, c), common_only=common_only)
    return plan


def _last_block_plan(dt: Any, rows: int, runs: int, rowwise: bool, bias: bool, ct: Any, otherwise: Any,
                     eager: bool) -> Any:
    """scaled_mm()'s launch for up to 32 rows of a in one launch on any GPU: scaled_mm_few_rows_last_kernel, the
    last run of K of each block column to arrive summing (FEW_ROWS_LAST_BLOCK); with `eager`, `otherwise` (the two
    kernels) in CUDA graph captures."""
    import torch

    spec = scaled_mm_few_rows_last_kernel.specialize(target="sm_90a", ROWWISE=int(rowwise), BIAS=int(bias),
                                                     ROWS=rows, RUNS=runs, DT=dt, CT=ct, **FEW_ROWS)

    def plan(a: Any, weight: Any, scale_a: Any, scale_b: Any, bias: Any, c: Any, common_only: bool) -> bool:
        stream = current_stream_key(torch, c)  # None in a capture
        if eager and stream is None:
            return otherwise(a, weight, scale_a, scale_b, bias, c, common_only)
        m, n = c.shape
        columns = ceil_div(n, 16 * FEW_ROWS["WARPS"])
        partial = stream_scratch(torch, c, (runs, m, n), torch.float32, stream)
        return spec.launch((columns, runs, 1), (a, weight, scale_a, scale_b, bias, partial, c,
                                                arrival_counters(torch, c, columns, stream)), common_only=common_only)
    return plan


def _split_plan(dt: Any, rows: int, runs: int, rowwise: bool, bias: bool, ct: Any) -> Any:
    """scaled_mm()'s launch for up to 32 rows of a in two kernels: gemm_few_rows_kernel's f32 partial sums over
    `runs` runs of K, then sum_scaled_splits_kernel's scaled sum into c."""
    import torch

    partial_sums = gemm_few_rows_kernel.specialize(target="sm_90a", TRANS_B=1, ROWS=rows, DT=dt, **FEW_ROWS)
    total = sum_scaled_splits_kernel.specialize(target="sm_90a", ROWWISE=int(rowwise), BIAS=int(bias), CT=ct,
                                                **SUM_SCALED)
    cols = SUM_SCALED["COLS"] * SUM_SCALED["WARPS"]

    def plan(a: Any, weight: Any, scale_a: Any, scale_b: Any, bias: Any, c: Any, common_only: bool) -> bool:
        m, n = c.shape
        partial = stream_scratch(torch, c, (runs, m, n), torch.float32, current_stream_key(torch, c))
        return (partial_sums.launch((ceil_div(n, 16 * FEW_ROWS["WARPS"]), runs, 1), (a, weight, partial),
                                    common_only=common_only)
                and total.launch((ceil_div(m, 16), ceil_div(n, cols), 1), (partial, scale_a, scale_b, bias, c),
                                 common_only=common_only))
    return plan


# (device, a's and b's and the output's dtypes, rowwise, bias, launch_kind, target) → what scaled_mm() launches:
# plan(a, weight, scale_a, scale_b, bias (or _no_bias), c, common_only) -> whether it launched
_PLANS: dict[tuple, Any] = {}


def _check_scales(scale_a: Any, scale_b: Any, m: int, n: int) -> bool:
    """Per tensor (False) or rowwise (True) scales, or the error that says what they must be."""
    import torch

    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(s, torch.Tensor):
            fail(f"{name} must be a float32 CUDA tensor, got {type(s).__name__}")
        if s.dtype is not torch.float32:
            fail(f"{name} must be torch.float32, got {s.dtype}")
        if not s.is_cuda:
            fail(f"{name} is on {s.device}; tkc kernels run on CUDA tensors")
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return False
    if (tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n) and scale_a.is_contiguous()
            and scale_b.is_contiguous()):
        return True
    fail(f"scale_a and scale_b must have one element each, or be contiguous of shapes ({m}, 1) and (1, {n}) "
         f"(rowwise); got {tuple(scale_a.shape)} and {tuple(scale_b.shape)}")
    return False
