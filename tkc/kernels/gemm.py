"""GEMM: C = A·B or A·Bᵀ in bf16 (or f16) with f32 accumulation, through shared tiles and the tensor cores. The
kernels take their element type from the constant DT (bf16 by default)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, NamedTuple

import tkc
from tkc.kernels._checks import cdiv as ceil_div  # `cdiv` is the DSL's, for kernels
from tkc.kernels._checks import (MULTIPROCESSORS, arrival_counters, check_tensor, current_stream_key, dtype_constant,
                                 fail, multiprocessors, stream_scratch, wants_grad, wgmma_path)
from tkc.lang import *  # noqa: F403

if TYPE_CHECKING:
    import torch

@tkc.func
def grouped_tile(pid, blocks_m, blocks_n, group_m):
    """Block `pid`'s tile of C (row, column), walking C in groups of `group_m` block-rows, so that blocks that run
    at the same time share A's and B's slices in L2."""
    group_start = pid // (group_m * blocks_n) * group_m
    group_rows = min(blocks_m - group_start, group_m)
    return group_start + pid % group_rows, pid % (group_m * blocks_n) // group_rows


@tkc.kernel(warps="WARPS", stages="STAGES", blocks_per_sm="BLOCKS_PER_SM", min_target="sm_80")
def gemm_kernel(A: gl["DT", 2], B: gl["DT", 2], C: gl["DT", 2], TRANS_B: const = 0,
                BM: const = 128, BN: const = 128, BK: const = 32, WARPS: const = 4, WARPS_N: const = 2,
                GROUP_M: const = 8, STAGES: const = 3, BLOCKS_PER_SM: const = 1, DT: const = bf16):
    """C (M×N) = A (M×K) · B (K×N), or · Bᵀ with TRANS_B=1 (B is N×K). Grid: (cdiv(M, BM) · cdiv(N, BN),).

    The block stages a BM×BK slice of A and a BK×BN slice of B in shared memory per step of K (a STAGES-deep
    cp.async pipeline); its WARPS warps form a (WARPS / WARPS_N) × WARPS_N grid, each accumulating its piece of
    the BM×BN tile of C in registers. Blocks walk C in groups of GROUP_M block-rows, so that neighbours in time
    share A's and B's slices in L2. Edges read zeros and their stores are dropped, so any M, N, K works.
    """
    WARPS_M = WARPS // WARPS_N
    WM, WN = BM // WARPS_M, BN // WARPS_N                       # each warp's piece of C
    bm, bn = grouped_tile(block_idx()[0], cdiv(A.shape[0], BM), cdiv(C.shape[1], BN), GROUP_M)
    wm, wn = warp_id() // WARPS_N, warp_id() % WARPS_N
    acc = zeros(rt[f32, WM, WN])
    for k in range(cdiv(A.shape[1], BK)):
        a = load(load(A, (bm, k), st[DT, BM, BK]), (wm, 0), rt[DT, WM, BK])
        if TRANS_B:
            b = load(load(B, (bn, k), st[DT, BN, BK]), (wn, 0), rt[DT, WN, BK])
            acc = mma_ABt(a, b, acc)
        else:
            b = load(load(B, (k, bn), st[DT, BK, BN]), (0, wn), rt[DT, BK, WN])
            acc = mma_AB(a, b, acc)
    store(C, acc.to(DT), (bm * WARPS_M + wm, bn * WARPS_N + wn))


@tkc.func
def cluster_stacks(blocks_m, blocks_n, cluster, cluster_n):
    """The stacks of C's blocks_m × blocks_n tiles that clusters of `cluster` blocks take, cluster / cluster_n tiles
    in M by cluster_n in N: (stacks in M, stacks in N)."""
    static_assert(cluster % cluster_n == 0, f"CLUSTER_N ({cluster_n}) must divide CLUSTER ({cluster})")
    if cluster_n > 1:
        return cdiv(blocks_m, cluster // cluster_n), cdiv(blocks_n, cluster_n)
    return cdiv(blocks_m, cluster), blocks_n


@tkc.func
def cluster_tile(stack, cluster, cluster_n):
    """This block's tile of C (row, column) in the cluster's stack (row, column of stacks): its rank's place, row
    rank // cluster_n and column rank % cluster_n (past M's or N's end in a last stack: loads zeros, stores none)."""
    stack_m, bn = stack  # (named bn: the tile's column where a stack is one tile wide)
    if cluster_n > 1:
        return (stack_m * (cluster // cluster_n) + cluster_rank() // cluster_n,
                bn * cluster_n + cluster_rank() % cluster_n)
    return stack_m * cluster + cluster_rank(), bn


@tkc.kernel(warps="WARPS", stages="STAGES", producer="PRODUCER", tma_store="TMA_STORE", cluster="CLUSTER",
            min_target="sm_90a")
def gemm_sm90_kernel(A: gl["DT", 2], B: gl["DT", 2], C: gl["DT", 2], TRANS_B: const = 0, BN: const = 256,
                     BK: const = 32, WARPS: const = 4, GROUP_M: const = 8, STAGES: const = 4, PRODUCER: const = 0,
                     TMA_STORE: const = 0, DT: const = bf16, CLUSTER: const = 1, CLUSTER_N: const = 1):
    """As gemm_kernel, on Hopper's wgmma: a block of WARPS / 4 warpgroups takes a (16·WARPS)×BN tile of C; A's
    and B's slices are staged in shared memory (a STAGES-deep cp.async pipeline), each warpgroup multiplies its
    64 rows of A by all of B, and each warp keeps its 16 rows of the result.
    Grid: up to cdiv(M, 16·WARPS) · cdiv(N, BN) blocks, each taking every grid-th tile (fewer blocks than tiles: a
    persistent grid; the ring runs on across a block's tiles). Where A and B are 16-byte aligned the loads become a TMA +
    mbarrier ring (insert-tma-pipeline), else a cp.async ring. With CLUSTER > 1 the blocks run in clusters that
    take CLUSTER tiles stacked in M at a time (the grid a multiple of CLUSTER): they read the same slices of B,
    which TMA multicast copies once for the cluster. With CLUSTER_N > 1 a cluster's tiles are CLUSTER / CLUSTER_N
    stacked in M by CLUSTER_N side by side in N (rank r: row r // CLUSTER_N, column r % CLUSTER_N of them): the
    blocks of a row of tiles share A's slices, those of a column B's, each by multicast to its group."""
    BM = 16 * WARPS
    CM = CLUSTER // CLUSTER_N  # a cluster's tiles: CM of them one above the other, CLUSTER_N side by side
    stacks_m, stacks_n = cluster_stacks(cdiv(A.shape[0], BM), cdiv(C.shape[1], BN), CLUSTER, CLUSTER_N)
    for tile in range(block_idx()[0] // CLUSTER, stacks_m * stacks_n, num_blocks()[0] // CLUSTER):  # persistent
        bm, bn = cluster_tile(grouped_tile(tile, stacks_m, stacks_n, GROUP_M), CLUSTER, CLUSTER_N)
        acc = zeros(rt[f32, 16, BN])
        for k in range(cdiv(A.shape[1], BK)):
            a_s = load(A, (bm, k), st[DT, BM, BK], multicast=(CLUSTER_N, 1))  # the blocks of this row of tiles
            a = load(a_s, (warpgroup_id(), 0), st[DT, 64, BK])  # this warpgroup's rows
            if TRANS_B:  # B: the blocks of this column of tiles
                acc = mma_ABt(a, load(B, (bn, k), st[DT, BN, BK], multicast=(CM, CLUSTER_N)), acc)
            else:
                acc = mma_AB(a, load(B, (k, bn), st[DT, BK, BN], multicast=(CM, CLUSTER_N)), acc)
        store(C, acc.to(DT), (bm * WARPS + warp_id(), bn))


@tkc.func
def run_of_k(steps, run, runs):
    """Steps first .. end - 1 of a loop of `steps`: the run-th of `runs` equal runs (the last shorter or empty)."""
    per_run = cdiv(steps, runs)
    return run * per_run, min(steps, (run + 1) * per_run)


@tkc.func
def rotated_step(step, first, end, offset):
    """Step `step` of the run first .. end - 1 taken `offset` steps in (wrapping), so that blocks starting
    together read different slices of an operand they all read."""
    return first + (step - first + offset) % max(end - first, 1)


@tkc.kernel(warps="WARPS", stages="STAGES", min_target="sm_90a")
def gemm_split_k_kernel(A: gl["DT", 2], B: gl["DT", 2], Partial: gl[f32, 3], TRANS_B: const = 0, BN: const = 64,
                        BK: const = 128, WARPS: const = 4, STAGES: const = 4, ROTATE: const = 0, DT: const = bf16):
    """gemm_sm90_kernel's product split along K, for products with few tiles and a long K: grid (tiles, splits);
    block (t, s) multiplies tile t over the s-th of `splits` equal runs of K's steps and writes its f32 sum to
    Partial[s] (Partial is splits × M × N); sum_splits_kernel adds them up. (gemm() takes gemm_few_rows_kernel
    where splitting pays: up to 32 rows; bench/probe_skinny.py times this one beside it.)"""
    BM = 16 * WARPS
    tile, split = block_idx()[0], block_idx()[1]
    blocks_n = cdiv(Partial.shape[2], BN)
    bm, bn = tile // blocks_n, tile % blocks_n
    first, end = run_of_k(cdiv(A.shape[1], BK), split, num_blocks()[1])
    acc = zeros(rt[f32, 16, BN])
    for step in range(first, end):
        k = rotated_step(step, first, end, bn * ROTATE)  # A, a few rows, is read by every block
        a = load(load(A, (bm, k), st[DT, BM, BK]), (warpgroup_id(), 0), st[DT, 64, BK])  # this warpgroup's rows
        if TRANS_B:
            acc = mma_ABt(a, load(B, (bn, k), st[DT, BN, BK]), acc)
        else:
            acc = mma_AB(a, load(B, (k, bn), st[DT, BK, BN]), acc)
    store(Partial, acc, (split, bm * WARPS + warp_id(), bn))


@tkc.func
def few_rows_product(A, B, bn, first, end, TRANS_B, ROWS, BK, WARPS, ROTATE, DT):
    """This warp's 16 columns of C = A·Bᵀ (or A·B) in block column `bn`, transposed (rt[f32, 16, ROWS]: B's
    columns of C fill the wgmma's rows, A's few rows are its N), summed over steps first .. end - 1 of K, taken
    from step first + bn·ROTATE on (wrapping), so that blocks starting together read different slices of A."""
    BN = 16 * WARPS
    acc = zeros(rt[f32, 16, ROWS])
    for step in range(first, end):
        k = rotated_step(step, first, end, bn * ROTATE)
        a = load(A, (0, k), st[DT, ROWS, BK])
        if TRANS_B:
            acc = mma_ABt(load(load(B, (bn, k), st[DT, BN, BK]), (warpgroup_id(), 0), st[DT, 64, BK]), a, acc)
        else:  # this warpgroup's K×64 column panel of B, read transposed by the wgmma
            acc = mma_AtBt(load(load(B, (k, bn), st[DT, BK, BN]), (0, warpgroup_id()), st[DT, BK, 64]), a, acc)
    return acc


@tkc.kernel(warps="WARPS", stages="STAGES", min_target="sm_90a")
def gemm_few_rows_kernel(A: gl["DT", 2], B: gl["DT", 2], Partial: gl[f32, 3], TRANS_B: const = 1, ROWS: const = 16,
                         BK: const = 128, WARPS: const = 4, STAGES: const = 8, ROTATE: const = 1, DT: const = bf16):
    """gemm_split_k_kernel for A of at most ROWS (16, 32, 64) rows, the operands' roles swapped: Cᵀ = B·Aᵀ (B is
    N×K, TRANS_B=1: a linear layer's weight) or Bᵀ·Aᵀ (B is K×N), so that B's columns of C fill the wgmma's 64
    rows and A's few rows are its N (no shared memory or copies spent on rows A does not have). Grid (cdiv(N,
    16·WARPS), runs of K); block (t, s) writes its f32 sum to Partial[s]."""
    bn, split = block_idx()[0], block_idx()[1]
    first, end = run_of_k(cdiv(A.shape[1], BK), split, num_blocks()[1])
    acc = few_rows_product(A, B, bn, first, end, TRANS_B, ROWS, BK, WARPS, ROTATE, DT)
    store(Partial, transpose(acc), (split, 0, bn * WARPS + warp_id()))


@tkc.kernel(warps="WARPS", stages="STAGES", min_target="sm_90a")
def gemm_few_rows_last_kernel(A: gl["DT", 2], B: gl["DT", 2], Partial: gl[f32, 3], C: gl["DT", 2],
                              Counter: gl[i32, 1], TRANS_B: const = 1, ROWS: const = 16, BK: const = 128,
                              WARPS: const = 4, STAGES: const = 8, ROTATE: const = 1, RUNS: const = 4,
                              DT: const = bf16):
    """gemm_few_rows_kernel and sum_splits_kernel in one launch on any number of blocks: block (t, s) leaves its
    f32 sum in Partial[s], and the last of block column t's RUNS runs to arrive at Counter[t] (zero before the first
    launch, and again after each) adds up all the runs' sums and stores C. Grid: (cdiv(N, 16·WARPS), RUNS)."""
    bn, split = block_idx()[0], block_idx()[1]
    first, end = run_of_k(cdiv(A.shape[1], BK), split, RUNS)
    acc = few_rows_product(A, B, bn, first, end, TRANS_B, ROWS, BK, WARPS, ROTATE, DT)
    columns = bn * WARPS + warp_id()  # this warp's 16 columns of C
    store(Partial, transpose(acc), (split, 0, columns))
    if arrive_last(Counter, bn, RUNS):
        store(C, runs_sum(Partial, columns, RUNS, ROWS).to(DT), (0, columns))


@tkc.func
def runs_sum(Partial, columns, RUNS, ROWS):
    """The sum of Partial[0 .. RUNS - 1]'s first ROWS rows × 16 columns from `columns` (in units of 16), its loads
    all issued at once (RUNS a constant: the loop unrolled; the last block's sum is the launch's tail)."""
    total = load(Partial, (0, 0, columns), rt[f32, ROWS, 16])
    for run in range(1, RUNS):
        total = total + load(Partial, (run, 0, columns), rt[f32, ROWS, 16])
    return total


@tkc.func
def share_with_cluster(acc, ROWS, WARPS):
    """Each warp's tile of few_rows_product, transposed back (C's rows × the warp's 16 columns), in a shared tile
    that the blocks of the cluster read from each other once all have passed the cluster_sync."""
    partial = store(empty(st[f32, ROWS, 16 * WARPS]), transpose(acc), (0, warp_id()))
    cluster_sync()
    return partial


@tkc.func
def cluster_sum(partial, index, spec, cluster):
    """The sum of sub-tile `index` of the shared tile `partial` over the copies of the cluster's blocks."""
    total = load(partial, index, spec, rank=0)
    for rank in range(1, cluster):
        total = total + load(partial, index, spec, rank=rank)
    return total


@tkc.kernel(warps="WARPS", stages="STAGES", cluster="CLUSTER", min_target="sm_90a")
def gemm_few_rows_cluster_kernel(A: gl["DT", 2], B: gl["DT", 2], C: gl["DT", 2], TRANS_B: const = 1,
                                 ROWS: const = 16, BK: const = 128, WARPS: const = 4, STAGES: const = 8,
                                 ROTATE: const = 1, CLUSTER: const = 2, DT: const = bf16):
    """gemm_few_rows_kernel and the sum of its runs of K in one launch: a block column's CLUSTER runs are the
    blocks of a cluster, which add up their partial sums in distributed shared memory — each block the columns
    of every CLUSTER-th warp, from its rank on — and store C. Grid: (cdiv(N, 16·WARPS) · CLUSTER,)."""
    bn = block_idx()[0] // CLUSTER
    first, end = run_of_k(cdiv(A.shape[1], BK), cluster_rank(), CLUSTER)
    acc = few_rows_product(A, B, bn, first, end, TRANS_B, ROWS, BK, WARPS, ROTATE, DT)
    partial = share_with_cluster(acc, ROWS, WARPS)
    if warp_id() % CLUSTER == cluster_rank():
        store(C, cluster_sum(partial, (0, warp_id()), rt[f32, ROWS, 16], CLUSTER), (0, bn * WARPS + warp_id()))


@tkc.kernel(warps="WARPS", min_target="sm_80")
def sum_splits_kernel(Partial: gl[f32, 3], C: gl["DT", 2], COLS: const = 256, WARPS: const = 4, DT: const = bf16):
    """C = Partial[0] + Partial[1] + ... in DT. Grid: (M, cdiv(N, WARPS·COLS)); each warp adds up COLS
    columns of a row."""
    part = block_idx()[1] * WARPS + warp_id()  # this warp's columns, in units of COLS
    row = block_idx()[0]
    total = load(Partial, (0, row, part), rv[f32, COLS])
    for split in range(1, Partial.shape[0]):
        total = total + load(Partial, (split, row, part), rv[f32, COLS])
    store(C, total, (row, part))


CONFIG = {"BM": 128, "BN": 128, "BK": 64, "WARPS": 4, "WARPS_N": 2, "STAGES": 2, "GROUP_M": 16}  # what gemm() launches (best of bench/sweep.py)
# gemm_sm90_kernel per TRANS_B (best of bench/wgmma_probe.py on the H200). A producer warpgroup keeps the ring
# filling while the consumers store a tile: on one of three H100s +7-8 % at 8192×8192×1024 (8 steps of K a tile) and
# +2-5 % at 8192³ and 16384×4096×4096, level within ±3 % on the other two, -2 % at 2048³ (one wave: no tile boundary
# to hide; RESULTS "a producer warpgroup for gemm() — 2026-12-06")
CONFIG_SM90 = {0: {"BN": 256, "BK": 64, "WARPS": 8, "STAGES": 3, "PRODUCER": 1, "TMA_STORE": 1},
               1: {"BN": 256, "BK": 64, "WARPS": 8, "STAGES": 3, "PRODUCER": 1, "TMA_STORE": 1}}
PERSISTENT = True  # gemm_sm90_kernel on at most as many blocks as the GPU holds at once, each walking its tiles
# Smaller tiles for products with few tiles of CONFIG_SM90's size (skinny: inference's few rows of tokens): the first
# whose tiles fill 0.9 of the multiprocessors, else the last (bench/probe_skinny.py, RESULTS "gemm probe — 2026-12-04
# 12:49–12:50": M = 16-512 rows, N = K = 4096 / 8192, 0.36-0.65x cuBLAS with CONFIG_SM90, 0.62-1.22x this way)
SMALLER_TILES = [{"BN": 128, "BK": 64, "WARPS": 8, "STAGES": 4}, {"BN": 256, "BK": 64, "WARPS": 4, "STAGES": 4},
                 {"BN": 128, "BK": 64, "WARPS": 4, "STAGES": 4}, {"BN": 64, "BK": 128, "WARPS": 4, "STAGES": 4}]


@functools.lru_cache(maxsize=4096)
def tile_choice(m: int, n: int, sms: int) -> int:
    """Which tiles gemm_sm90_kernel takes for an m×n product on `sms` multiprocessors: 0 for CONFIG_SM90's,
    i for SMALLER_TILES[i - 1]."""
    for i, cfg in enumerate([CONFIG_SM90[0], *SMALLER_TILES]):
        if ceil_div(m, 16 * cfg["WARPS"]) * ceil_div(n, cfg["BN"]) >= 0.9 * sms:
            return i
    return len(SMALLER_TILES)


# A few rows and a long K (a few tokens times a weight): even the smallest tiles leave SMs idle or starve on A,
# which every block reads. Up to 32 rows the operands swap roles (gemm_few_rows_kernel: Cᵀ = B·Aᵀ, or Bᵀ·Aᵀ with B
# read transposed by the wgmma; A's rows the wgmma's N of 16 or 32, no wgmma rows wasted on A) and K is split into
# runs, one block each, about a block an SM, their f32 partial sums added up by sum_splits_kernel; blocks start
# their runs at different steps (ROTATE). RESULTS "gemm probe — 2026-12-04 14:14–14:22" (split K alone,
# gemm_split_k_kernel: M=16 N=K=8192 0.64 -> 0.90x cuBLAS in a graph), "14:35–14:41" and "14:44" (the swap for B
# given N×K: M = 1-32, N = K = 4096 0.70-0.85 -> 0.99-1.18x, 8192 0.82-0.90 -> 0.91-0.97x), "15:19" (B given K×N,
# one warpgroup: 0.74-0.87 -> 0.93-1.04x at 4096, 0.81 -> 0.93x at M=1 N=K=8192, 0.89 unchanged at 16-32 rows) and
# "15:42" (two warpgroups on column views of B's tile as fast, 0.90-1.07x: one configuration for both).
FEW_ROWS = {"BK": 128, "WARPS": 8, "STAGES": 5, "ROTATE": 1}  # ROWS: 16 or 32, the fewest that hold A's rows
FEW_ROWS_MAX = 32  # at 64 rows BN=64 tiles without a split are as fast as cuBLAS
# The runs of K of a block column as a cluster summing its partial sums in distributed shared memory
# (gemm_few_rows_cluster_kernel: one launch) rather than gemm_few_rows_kernel + sum_splits_kernel. Off: correct
# (tests/gpu test_few_rows_in_clusters, 2026-12-05) but no faster on the GPU, from a CUDA graph on an H100: 12.5-12.9
# µs against gemm()'s 9.3-10.7 at N=K=4096, within 1-3 % at 8192 (RESULTS "few rows in clusters — 2026-12-05")
# "eager": one launch outside CUDA graph captures only (where a call's host time, two launches against one, is what
# the GPU waits for), the two kernels in a capture (faster from a graph).
FEW_ROWS_IN_CLUSTERS: bool | str = False
# The runs of K and their sum in one launch on any GPU: gemm_few_rows_last_kernel, the last of a block column's runs
# to arrive at its counter summing them (arrival_counters). "eager": outside CUDA graph captures only (a capture
# keeps the two kernels); True: in captures too (the graph zeroes counters of its own). Taken before
# FEW_ROWS_IN_CLUSTERS. "eager" (H100, RESULTS "one launch by the last block — 2026-12-06 20:45"): event-timed, where
# the host's two launches are what the GPU waits for, M = 1-32 at N = K = 4096 32.9-35.9 µs a call against gemm()'s
# 36.4-39.5 (B given N×K), 1-4 % faster at 8192; from a graph the one kernel was 2 µs slower than the two (11.5-12.7
# against 9.5-10.3 µs at 4096: the last run's sum waits on its own product), so a capture keeps the two. As shipped,
# its workspace per stream too: 25-28 µs a call at 4096 (RESULTS "few rows in one launch as shipped ... — 21:21").
FEW_ROWS_LAST_BLOCK: bool | str = "eager"
SUM_SPLITS = {"COLS": 256, "WARPS": 4}


def few_rows_in_clusters() -> bool | str:
    """Whether gemm() and scaled_mm() take the one-launch few-rows kernels (FEW_ROWS_IN_CLUSTERS, read when a
    launch plan is made): True, False, or "eager" (outside CUDA graph captures)."""
    return FEW_ROWS_IN_CLUSTERS


def few_rows_last_block() -> bool | str:
    """Whether gemm() and scaled_mm() take the few-rows kernels whose last run sums (FEW_ROWS_LAST_BLOCK, read when
    a launch plan is made): True, False, or "eager" (outside CUDA graph captures)."""
    return FEW_ROWS_LAST_BLOCK


class Choice(NamedTuple):
    """How gemm() runs a product: `kind` "tiles" (gemm_sm90_kernel with tile_choice's tiles, `count`) or "few
    rows" (gemm_few_rows_kernel on `count` runs of K, A of up to `rows` rows)."""

    kind: str
    count: int
    rows: int = 0


@functools.lru_cache(maxsize=4096)
def launch_choice(m: int, n: int, k: int, sms: int) -> Choice:
    """How gemm() runs an m×n×k product with 16-byte aligned rows on `sms` multiprocessors (either way of B: the
    few-rows kernel reads B given K×N transposed at the same speed)."""
    if m <= FEW_ROWS_MAX:
        runs = _runs_of_k(ceil_div(n, 16 * FEW_ROWS["WARPS"]), ceil_div(k, FEW_ROWS["BK"]), sms)
        if runs > 1:
            return Choice("few rows", runs, 16 if m <= 16 else 32)
    return Choice("tiles", tile_choice(m, n, sms))


def _runs_of_k(tiles: int, steps: int, slots: int) -> int:
    """Into how many runs to split `steps` steps of K of `tiles` tiles on a GPU holding `slots` blocks at once:
    about a block a slot, at most 4 runs, each at least 8 steps (1: no split)."""
    return max(1, min(4, slots // tiles, steps // 8))


def sm90_config(trans_b: bool, aligned: bool, choice: int = 0) -> dict[str, int]:
    """gemm_sm90_kernel's constants: CONFIG_SM90 (TMA ring, TMA stores) or, with `choice`, smaller tiles; without
    16-byte aligned rows a 4-stage cp.async ring and plain stores."""
    if not aligned:  # (no TMA: nothing to multicast, so no clusters)
        return {**CONFIG_SM90[int(trans_b)], "TRANS_B": int(trans_b), "PRODUCER": 0, "STAGES": 4, "TMA_STORE": 0,
                "CLUSTER": 1}
    return {**(CONFIG_SM90[int(trans_b)] if choice == 0 else SMALLER_TILES[choice - 1]), "TRANS_B": int(trans_b)}


def gemm(a: torch.Tensor, b: torch.Tensor, *, trans_b: bool = False, target: str | None = None,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """a (M×K) · b (K×N), or · bᵀ with trans_b (b is N×K), for bf16 (or f16) CUDA tensors; a result of their
    dtype, f32 accumulation.
    Any M, N, K. The last dimension of `a` must be contiguous; `b` may also be given transposed (column-major).
    On Hopper (or with target="sm_90a") the wgmma kernel runs (TMA where the rows of a and b are 16-byte
    aligned; up to 32 rows of a with a long K, the product over runs of K and their sum, in one launch outside CUDA
    graph captures: gemm_few_rows_last_kernel); elsewhere (or with target="sm_80") the mma.sync kernel."""
    import torch

    from tkc.runtime.launch import alignment

    if torch.compiler.is_compiling() or wants_grad(torch, a, b):  # one op of the graph / of autograd
        from tkc.kernels import torch_ops

        c = torch_ops.gemm(a, b, bool(trans_b), target)
        return c if out is None else out.copy_(c)

    # The common call (2-D row-major a and b of matching sizes; out, if given, of the product's shape) checks only
    # what the launch cannot know and takes its launch plan from the first such call: at 2048³ the kernel runs
    # ~27 µs, and the GPU should not wait for Python. Dtypes, devices and out's strides are the launch's argument
    # reader's to check; anything else takes the full checks below and their error.
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 == b.dim():
        (m, k), (b0, b1) = a.shape, b.shape
        n, kb = (b0, b1) if trans_b else (b1, b0)
        sa, sb = a.stride(), b.stride()
        if k == kb and m and n and sa[1] == 1 and sb[1] == 1:
            # 16-byte aligned rows (TMA's condition): addresses, row pitches and row lengths
            aligned = not (a.data_ptr() | b.data_ptr() | (sa[0] | sb[0] | k | b1) * 2) & 15
            device = a.get_device()
            sms = MULTIPROCESSORS.get(device)
            plan = (_PLANS.get((device, a.dtype, trans_b, aligned, target,
                                launch_choice(m, n, k, sms) if aligned else _UNALIGNED))
                    if sms is not None else None)
            if plan is not None and (out is None or isinstance(out, torch.Tensor) and out.shape == (m, n)):
                c = a.new_empty((m, n)) if out is None else out
                if plan(a, b, c, m, n, True):
                    return c

    dtype = torch.float16 if getattr(a, "dtype", None) is torch.float16 else torch.bfloat16  # else: its error
    check_tensor("a", a, dtype, 2)
    check_tensor("b", b, dtype, 2)
    dt = dtype_constant(dtype)
    if a.get_device() != b.get_device():
        fail(f"a is on {a.device} but b is on {b.device}")
    m, k = a.shape
    n, kb = (b.shape if trans_b else b.shape[::-1])
    if k != kb:
        fail(f"b: a is {m}x{k}, so b must be {'Nx' if trans_b else ''}{k}{'' if trans_b else 'xN'}, "
             f"got {tuple(b.shape)}{' (trans_b=True)' if trans_b else ''}")
    if b.dim() == 2 and b.stride(-1) != 1 and b.shape[-1] > 1 and b.stride(0) == 1:
        b, trans_b = b.t(), not trans_b  # a column-major b is the row-major transpose: no copy
    if a.stride(-1) != 1 and a.shape[-1] > 1:
        fail(f"a: its last dimension must be contiguous, got strides {tuple(a.stride())}")
    if out is None:
        out = a.new_empty((m, n))
    else:
        check_tensor("out", out, dtype, 2)
        if out.shape != (m, n):
            fail(f"out: expected shape ({m}, {n}), got {tuple(out.shape)}")
    if m == 0 or n == 0:
        return out
    # wgmma on Hopper: with a TMA ring where the operands' rows are 16-byte aligned (tiles by the product's size),
    # else with a cp.async ring (any alignment)
    device, aligned = a.get_device(), alignment(a) == alignment(b) == 16
    choice = launch_choice(m, n, k, multiprocessors(device)) if aligned else _UNALIGNED
    if wgmma_path(device, target) and choice.kind == "few rows":
        constants = {"TRANS_B": int(trans_b), "ROWS": choice.rows, **dt, **FEW_ROWS}
        plan = _split_k_plan(gemm_few_rows_kernel.specialize(target="sm_90a", **constants), choice.count,
                             choice.rows, 16 * FEW_ROWS["WARPS"], dt)
        if few_rows_last_block():
            spec = gemm_few_rows_last_kernel.specialize(target="sm_90a", RUNS=choice.count, **constants)
            plan = _last_block_plan(spec, choice.count, 16 * FEW_ROWS["WARPS"], plan, few_rows_last_block() == "eager")
        elif few_rows_in_clusters():
            spec = gemm_few_rows_cluster_kernel.specialize(target="sm_90a", CLUSTER=choice.count, **constants)
            plan = _cluster_split_plan(spec, choice.count, 16 * FEW_ROWS["WARPS"], spec.resident_blocks(a, b, out),
                                       plan, few_rows_in_clusters() == "eager")
    elif wgmma_path(device, target):
        cfg = sm90_config(trans_b, aligned, choice.count)
        spec = gemm_sm90_kernel.specialize(target="sm_90a", **dt, **cfg)
        most = spec.resident_blocks(a, b, out) if PERSISTENT else GRID_LIMIT
        plan = _tiles_plan(spec, 16 * cfg["WARPS"], cfg["BN"], most, cfg.get("CLUSTER", 1))
    else:
        plan = _tiles_plan(gemm_kernel.specialize(TRANS_B=int(trans_b), target=target, **dt, **CONFIG),
                           CONFIG["BM"], CONFIG["BN"], GRID_LIMIT)
    plan(a, b, out, m, n, False)
    _PLANS[(device, dtype, trans_b, aligned, target, choice)] = plan  # for the common call above
    return out


def persistent_grid(m: int, n: int, bm: int, bn: int, most: int, cluster: int = 1,
                    cluster_n: int = 1) -> tuple[int, int, int]:
    """The grid of a kernel taking bm×bn tiles of an m×n product on at most `most` blocks, in clusters of `cluster`
    that take stacks of that many tiles in M, or of cluster / cluster_n in M by cluster_n in N (whole clusters: a
    stack's tile past M's or N's end has a block too)."""
    stacks = ceil_div(ceil_div(m, bm), cluster // cluster_n) * ceil_div(ceil_div(n, bn), cluster_n)
    return (min(stacks * cluster, most - most % cluster), 1, 1)


def _tiles_plan(spec: Any, bm: int, bn: int, most: int, cluster: int = 1) -> Any:
    """gemm()'s launch of a kernel taking bm×bn tiles of C on at most `most` blocks (persistent_grid): plan(a, b,
    c, m, n, common_only) launches it and says whether it did (common_only: see Specialized.launch)."""
    def plan(a: Any, b: Any, c: Any, m: int, n: int, common_only: bool) -> bool:
        return spec.launch(persistent_grid(m, n, bm, bn, most, cluster), (a, b, c), common_only=common_only)
    return plan


def _split_k_plan(spec: Any, splits: int, bm: int, bn: int, dt: dict[str, Any]) -> Any:
    """gemm()'s launch of a product split into `splits` runs of K: the partial sums of `spec` (gemm_few_rows_kernel,
    bm×bn tiles of C) into an f32 workspace, then sum_splits_kernel's sum of them into c."""
    import torch

    total = sum_splits_kernel.specialize(target="sm_90a", **dt, **SUM_SPLITS)
    cols = SUM_SPLITS["COLS"] * SUM_SPLITS["WARPS"]

    def plan(a: Any, b: Any, c: Any, m: int, n: int, common_only: bool) -> bool:
        partial = stream_scratch(torch, c, (splits, m, n), torch.float32, current_stream_key(torch, c))
        return (spec.launch((ceil_div(m, bm) * ceil_div(n, bn), splits, 1), (a, b, partial), common_only=common_only)
                and total.launch((m, ceil_div(n, cols), 1), (partial, c), common_only=common_only))
    return plan


def _last_block_plan(spec: Any, runs: int, bn: int, otherwise: Any, eager: bool) -> Any:
    """gemm()'s launch of a few-rows product split into `runs` runs of K summed by the last run of each block
    column to arrive (gemm_few_rows_last_kernel: one launch, an f32 workspace); with `eager`, `otherwise` (the two
    kernels) in CUDA graph captures."""
    import torch

    def plan(a: Any, b: Any, c: Any, m: int, n: int, common_only: bool) -> bool:
        stream = current_stream_key(torch, c)  # None in a capture
        if eager and stream is None:
            return otherwise(a, b, c, m, n, common_only)
        columns = ceil_div(n, bn)
        partial = stream_scratch(torch, c, (runs, m, n), torch.float32, stream)
        return spec.launch((columns, runs, 1), (a, b, partial, c, arrival_counters(torch, c, columns, stream)),
                           common_only=common_only)
    return plan


def _cluster_split_plan(spec: Any, runs: int, bn: int, resident: int, otherwise: Any, eager: bool = False) -> Any:
    """gemm()'s launch of a few-rows product split into `runs` runs of K summed in clusters of as many blocks
    (gemm_few_rows_cluster_kernel on bn columns of C a cluster: one launch, no workspace) where the GPU holds all
    the clusters at once (`resident` blocks), else `otherwise` (the two kernels); with `eager`, `otherwise` in CUDA
    graph captures too."""
    import torch

    def plan(a: Any, b: Any, c: Any, m: int, n: int, common_only: bool) -> bool:
        blocks = ceil_div(n, bn) * runs
        if blocks > resident or eager and torch.cuda.is_current_stream_capturing():
            return otherwise(a, b, c, m, n, common_only)
        return spec.launch((blocks, 1, 1), (a, b, c), common_only=common_only)
    return plan


GRID_LIMIT = 2**31 - 1
_UNALIGNED = Choice("tiles", 0)  # rows not 16-byte aligned: CONFIG_SM90's tiles on a cp.async ring
# (device, dtype, trans_b, 16-byte aligned rows, target, launch_choice) → what gemm()'s common call launches
_PLANS: dict[tuple[int, Any, bool, bool, str | None, Choice], Any] = {}
