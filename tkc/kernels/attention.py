"""Attention forward (FlashAttention-2 style): O = softmax(scale · Q·Kᵀ)·V, causal or not, with online softmax. The
kernels take their element type from the constant DT (bf16, or f16)."""

from __future__ import annotations

import functools
import math
import numbers
from typing import TYPE_CHECKING, Any

import tkc
from tkc.kernels._checks import cdiv as ceil_div  # `cdiv` is the DSL's, for kernels
from tkc.kernels._checks import (MULTIPROCESSORS, UNREAD_LSE, check_like, check_tensor, dtype_constant, fail,
                                 multiprocessors, resident_blocks, shared_memory_limit, unread_lse, wants_grad,
                                 wgmma_path)
from tkc.kernels.attention_decode import CONFIG as DECODE_CONFIG
from tkc.kernels.attention_decode import CONFIG_SM80 as DECODE_CONFIG_SM80
from tkc.kernels.attention_decode import HOPPER_ROWS, MAX_ROWS, attention_decode_launch, takes_decode
from tkc.lang import *  # noqa: F403

if TYPE_CHECKING:
    import torch

@tkc.func
def kv_head(h, group):
    """The head of K and V that query head h reads: `group` query heads in a row share one (grouped-query
    attention; 1: each its own)."""
    if group == 1:
        return h
    return h // group


@tkc.func
def longest_first(grows_with_x, heads_together):
    """This block's (x, y, z) in a causal grid (query or key blocks, heads, batch) whose blocks' work grows with x
    (`grows_with_x`: the forward's and dQ's query blocks, later queries seeing more keys) or falls with it (dK/dV's
    key blocks). The GPU starts blocks in the order of their linear index; taken as they come, one head's blocks
    after another's, the last head's longest block would start near the end (a tail of up to ~10 % of the kernel at
    B·N = 16384). Here the linear index walks groups of `heads_together` heads (whose K and V, or Q and dO, share
    L2), in each the longest blocks of all of them first, then the next longest, ... The sm_80 forward, in groups
    of 8: +6-10 % at N = 4096 and 16384 (H100, RESULTS "causal block order — 2026-12-05 18:31"). The wgmma
    backward kernels keep one head at a time (longest first within it): in groups of 2, 4 or 8 heads they were
    0-4 % slower at N = 16384, whose concurrent blocks then stream several heads' Q and dO through L2."""
    x, y, z = block_idx()
    nx, ny, nz = num_blocks()
    linear = x + nx * (y + ny * z)
    group = linear // (heads_together * nx)
    width = min(heads_together, ny * nz - heads_together * group)  # heads in this group (the last may have fewer)
    rank = linear - heads_together * nx * group
    head = heads_together * group + rank % width
    longest = rank // width                                  # 0: the group's longest blocks
    return (nx - 1 - longest if grows_with_x else longest), head % ny, head // ny


@tkc.func
def flash_forward(Q, K, V, O, L, scale, D, CAUSAL, ROWS, KEYS, Q_IN_SHARED, LSE, DT, GROUP):
    """attention_fwd's body; with LSE it also stores each row's log-sum-exp into L."""
    static_assert(D in (32, 64, 96, 128, 256), f"head dim D must be 32, 64, 96, 128 or 256, got {D}")
    static_assert(ROWS in (16, 32), f"ROWS (query rows per warp) must be 16 or 32, got {ROWS}")
    static_assert(KEYS in (32, 64), f"KEYS (keys per step) must be 32 or 64, got {KEYS}")
    static_assert(Q_IN_SHARED or ROWS * D <= 2048,
                  f"ROWS={ROWS} with D={D} needs more than 255 registers per thread; use ROWS=16 or Q_IN_SHARED=1")
    blk, h, b = longest_first(1, 8) if CAUSAL else block_idx()
    kv_h = kv_head(h, GROUP)
    q_tile = blk * 4 + warp_id()                             # this warp's rows, in tiles of ROWS
    if Q_IN_SHARED:
        q_s = load(Q, (b, h, blk, 0), st[DT, 4 * ROWS, D])
    else:
        q = load(Q, (b, h, q_tile, 0), rt[DT, ROWS, D])
    scale_log2 = scale * LOG2E                               # exp(x·scale) = exp2(x·scale_log2)
    RESCALE_LOG2 = 8.0
    m, l, o = neg_infty(rv[f32, ROWS]), zeros(rv[f32, ROWS]), zeros(rt[f32, ROWS, D])
    last_row = (blk + 1) * 4 * ROWS                          # one past the block's last query row
    n_blocks = cdiv(last_row, KEYS) if CAUSAL else cdiv(K.shape[2], KEYS)
    first_masked = blk * 4 * ROWS // KEYS                    # key blocks from here on cross the diagonal
    for j in range(n_blocks):
        k_s, v_s = load(K, (b, kv_h, j, 0), st[DT, KEYS, D]), load(V, (b, kv_h, j, 0), st[DT, KEYS, D])
        if Q_IN_SHARED:
            q = load(q_s, (warp_id(), 0), rt[DT, ROWS, D])
        s = mma_ABt(q, load(k_s), zeros(rt[f32, ROWS, KEYS]))
        if CAUSAL:
            if j >= first_masked:                            # key j·KEYS+c is visible to query q_tile·ROWS+r iff c <= r + diag
                s = tril(s, q_tile * ROWS - j * KEYS, -math.inf)
        m_new = max(m, row_max(s))
        if max(m_new - m) * scale_log2 > RESCALE_LOG2:          # a row's maximum grew a lot: rescale l and o
            correction = exp2((m - m_new) * scale_log2)
            l, o, m = l * correction, mul_row(o, correction), m_new
        p = exp2(sub_row(s * scale_log2, m * scale_log2))      # ≤ 2^RESCALE_LOG2 where m lags behind
        l = l + row_sum(p)
        o = mma_AB(p.to(DT), load(v_s), o)
    store(O, div_row(o, l).to(DT), (b, h, q_tile, 0))
    if LSE:
        store(L, m * scale + log(l), (b, h, q_tile))  # the p were taken against m: Σ exp = exp(scale·m) · l




@tkc.kernel(warps=4, stages="STAGES", min_target="sm_80")
def attention_fwd(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], O: gl["DT", 4], scale: float,
                  D: const = 64, CAUSAL: const = 0, ROWS: const = 16, KEYS: const = 64, Q_IN_SHARED: const = 0,
                  DT: const = bf16, GROUP: const = 1, STAGES: const = 3):
    """q: (B, H, Nq, D), k and v: (B, H / GROUP, Nk, D), o like q. Grid: (Nq / (4·ROWS), H, B): the query blocks
    first, so that the blocks running at once share a few heads' K and V in L2 (causal: the longest blocks of 8
    heads first, `longest_first`). Query head h reads K and V's head h // GROUP (grouped-query attention; GROUP = 1:
    multi-head).

    Each of the 4 warps owns ROWS query rows; the block streams K and V through shared memory KEYS rows at a time
    and keeps the running row maximum m, the running sum l and the unnormalized output o in registers. With
    Q_IN_SHARED the block's queries wait in shared memory and each step reads them slice by slice, which leaves
    room in registers for ROWS=32 at D=128. With CAUSAL (Nq = Nk), query i sees keys j <= i: the loop stops
    after the block's diagonal and masks the key blocks that cross it.

    The running maximum m only moves (and l and o are rescaled) when some row's maximum grew by more than
    2^RESCALE_LOG2; otherwise the probabilities are taken against the old m, at most 2^RESCALE_LOG2, which f32
    sums and bf16 products hold exactly as well. o / l is the same; most steps skip the rescale.
    """
    flash_forward(Q, K, V, O, O, scale, D, CAUSAL, ROWS, KEYS, Q_IN_SHARED, 0, DT, GROUP)


@tkc.kernel(warps=4, stages="STAGES", min_target="sm_80")
def attention_fwd_lse(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], O: gl["DT", 4], L: gl[f32, 3], scale: float,
                      D: const = 64, CAUSAL: const = 0, ROWS: const = 16, KEYS: const = 64, Q_IN_SHARED: const = 0,
                      DT: const = bf16, GROUP: const = 1, STAGES: const = 3):
    """attention_fwd that also writes each query row's log-sum-exp ln Σ_j exp(scale · q·k_j) into L (B, H, Nq),
    for the backward pass."""
    flash_forward(Q, K, V, O, L, scale, D, CAUSAL, ROWS, KEYS, Q_IN_SHARED, 1, DT, GROUP)


@tkc.kernel(warps="WARPS", stages="STAGES", pingpong="PINGPONG", overlap="OVERLAP", defer="DEFER", producer="PRODUCER",
            exp2_poly="EXP2_POLY", tma_store="TMA_STORE", blocks_per_sm="BLOCKS", late_sums="LATE_SUMS",
            stagger="STAGGER", late_pv="LATE_PV", split_ring="SPLIT_RING", min_target="sm_90a")
def attention_sm90(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], O: gl["DT", 4], L: gl[f32, 3], scale: float,
                   D: const = 128, CAUSAL: const = 0, KEYS: const = 64, WARPS: const = 8, LSE: const = 0,
                   STAGES: const = 3, PINGPONG: const = 0, OVERLAP: const = 0, DEFER: const = 0, PRODUCER: const = 0,
                   Q_REGS: const = 0, EXP2_POLY: const = 0, TMA_STORE: const = 0, SKIP_RESCALE: const = 0,
                   ROWSUM_MMA: const = 0, BLOCKS: const = 0, LATE_SUMS: const = 0, STAGGER: const = 0,
                   LATE_PV: const = 0, DT: const = bf16, GROUP: const = 1, SPLIT_RING: const = 0):
    """attention_fwd on Hopper's wgmma (GROUP as there). Its tiles are the B·H·cdiv(Nq, 16·WARPS) query blocks, those of
    a head next to each other (so that the blocks running at once share a few heads' K and V, read from L2, not HBM;
    causal takes them longest first within groups of 8 heads). Grid: (G,), any G ≥ 1: block i takes tiles i, i + G,
    i + 2G, ... (G = the number of tiles: one each; G = the blocks the GPU holds at once: persistent). Any Nq, Nk ≥ 1.
    With LSE, L (B, H, Nq) gets each row's log-sum-exp, ln Σ_j exp(scale · q·k_j), for the backward pass.

    The block's queries wait in shared memory; each warpgroup takes its 64 rows of them (a view) and each warp
    keeps the softmax state of its 16 rows. Per block of KEYS keys: S = Q·Kᵀ by wgmma from shared memory, the
    online softmax in registers (as attention_fwd), and O += P·V by wgmma with P straight from registers. Keys
    past Nk (in the last block) are masked; queries past Nq are computed and not stored. Causal keeps key j for
    query i when j ≤ i (torch's convention, also for Nq ≠ Nk); its query blocks end at the last row, the first one
    reaching before row 0 (those rows see no key: their NaN stays in them, and they are not stored). The first step's
    block holds key 0, which every real query sees, so m is finite from then on (no -inf - -inf in the correction).

    With Q_REGS each warp keeps its 16 rows of queries in registers (Q·Kᵀ then reads only K from shared memory);
    Q_REGS=2 only the first half of their columns (D = 128 or 256), loaded straight from global memory, Q·Kᵀ in two
    parts, the second from shared memory, which holds only that half of the block's queries.
    A block with several tiles gets a ring for the queries on the tile loop: the next tile's load while this one
    runs (one stage with Q_REGS). Scheduling is the compiler's: DEFER=1 runs each P·V
    in the next step under the softmax (`defer-wgmma`), DEFER=2 also runs step 0 before the key loop without its
    zero P·V (`peel-deferred-step`), DEFER=3 also reads the next tile's queries and starts its first Q·Kᵀ under
    this tile's epilogue (`rotate-tile-loop`, with Q_REGS), DEFER=4 all of its step 0, the softmax under this tile's
    last P·V, PRODUCER=1 adds a warpgroup that issues the TMA loads (PRODUCER=2: one of 24 registers a thread,
    which leaves the consumers room for DEFER=1 with OVERLAP=1 at D=64 with 128-key steps),
    PINGPONG=1 has the two warpgroups take turns at the tensor cores, OVERLAP=1 issues the next Q·Kᵀ before the
    softmax (with DEFER=1: behind the deferred P·V, both under the softmax). EXP2_POLY=N takes every N-th
    exponential off the multi-function unit (a cubic on the FMA pipe). TMA_STORE=1 stores O through a staging tile
    per warp and TMA (where shared memory has room for it). SKIP_RESCALE=1 multiplies O by the correction only
    when some row of the warp has a new maximum (exact: the others' corrections are 1), which most steps of a
    long row do not. ROWSUM_MMA=1 takes the row sums off the softmax: the tensor cores add P·1 (a shared tile of
    ones, 16 columns, each the row's sum of the bf16 P that P·V uses) beside P·V. BLOCKS=2 fits two blocks on an
    SM (with a producer, its registers and the consumers' are split for that). LATE_SUMS=1 leaves the row sums'
    lane parts apart until after the key loop (`sum-rows-after-loop`: one exchange a tile instead of one a step).
    STAGGER=N starts warpgroup 1 N key steps after warpgroup 0 (`stagger-warpgroups`), so that one's epilogue and
    step 0 run under the other's wgmmas. LATE_PV=1 issues the deferred P·V after the step's row max (`defer-wgmma`).
    SPLIT_RING=1 (with DEFER=2) gives K and V barriers of their own: K's stage is released once Q·Kᵀ is done, V is
    waited for only before its (deferred) P·V, so that a ring of two stages still loads a step ahead
    (`insert-tma-pipeline`).
    """
    static_assert(D in (64, 96, 128, 256), f"head dim D must be 64, 96, 128 or 256, got {D}")
    static_assert(KEYS in (48, 64, 80, 128), f"KEYS (keys per step) must be 48, 64, 80 or 128, got {KEYS}")
    static_assert(DEFER or not Q_REGS, "Q_REGS=1 needs DEFER=1: with P·V running on into the next step, ptxas gives "
                  "P the registers of Q that the next Q·Kᵀ reads (wrong results)")
    static_assert(Q_REGS != 2 or D in (128, 256), f"Q_REGS=2 splits Q's columns in two halves of whole 64-column "
                  f"panels: D must be 128 or 256, got {D}")
    static_assert(not SPLIT_RING or DEFER == 2, "SPLIT_RING=1 needs DEFER=2: with DEFER=1 step 0's P·V of a zero P "
                  "would read V's stage before its wait (peeling step 0 leaves that P·V out)")
    BLOCK_ROWS = 16 * WARPS
    scale_log2 = scale * LOG2E
    key_blocks = cdiv(K.shape[2], KEYS)
    q_blocks, heads = cdiv(Q.shape[2], BLOCK_ROWS), Q.shape[1]
    # The grid's blocks take the tiles (query blocks, those of a head next to each other) in turn; the next tile's
    # queries load while this one runs.
    if ROWSUM_MMA:  # every warp writes 16 rows of ones (the same rows twice where KEYS < 16·WARPS)
        ones_s = store(empty(st[DT, KEYS, 16]), ones(rt[DT, 16, 16]), (warp_id() % (KEYS // 16), 0))
    for tile in range(block_idx()[0], q_blocks * heads * Q.shape[0], num_blocks()[0]):
        blk, head = tile % q_blocks, tile // q_blocks
        if CAUSAL:  # the longest rows first (not last), over groups of 8 heads whose K and V stay in L2 together
            first_head = head // 8 * 8
            # (both ≥ 1 / ≥ 0 anyway: written so, the compiler sees it and divides unsigned, which spares the
            # producer warpgroup registers)
            group = min(8, max(heads * Q.shape[0] - first_head, 1))
            rank = tile % (8 * q_blocks)                     # within the group: longest blocks of all its heads first
            blk, head = q_blocks - 1 - rank // group, first_head + rank % group
        h, b = head % heads, head // heads
        kv_h = kv_head(h, GROUP)
        # Causal: the query blocks end at the last row, so that the one left partly empty is the first, the
        # shortest (not the last, the longest: 1/18 of the work at N = 4096 in blocks of 192), in whole warp tiles
        first_row = blk * BLOCK_ROWS - ((q_blocks * BLOCK_ROWS - Q.shape[2]) // 16 * 16 if CAUSAL else 0)
        if Q_REGS == 2:  # the first half of the columns straight into registers; only the second half in shared
            # memory (half the tile: at D = 256 three stages of 64 keys fit beside it)
            q = load(Q, (b, h, first_row // 16 + warp_id(), 0), rt[DT, 16, D // 2])
            q_high_block = load(Q, (b, h, rows(first_row), 1), st[DT, BLOCK_ROWS, D // 2])
            q_high = load(q_high_block, (warpgroup_id(), 0), st[DT, 64, D // 2])
        else:
            q_block = load(Q, (b, h, rows(first_row), 0), st[DT, BLOCK_ROWS, D])
            if Q_REGS == 1:  # each warp's 16 rows in registers: Q·Kᵀ then reads only K from shared memory
                q = load(q_block, (warp_id(), 0), rt[DT, 16, D])
            else:
                q = load(q_block, (warpgroup_id(), 0), st[DT, 64, D])
        q_tile = first_row // 16 + warp_id()                 # this warp's 16 rows, in tiles of 16
        m, l, o = neg_infty(rv[f32, 16]), zeros(rv[f32, 16]), zeros(rt[f32, 16, D])
        l_cols = zeros(rt[f32, 16, 16])                      # ROWSUM_MMA: P·1, each column the row sums
        n_blocks = min(cdiv(first_row + BLOCK_ROWS, KEYS), key_blocks) if CAUSAL else key_blocks
        first_masked = max(first_row, 0) // KEYS
        for j in range(n_blocks):
            k_s, v_s = load(K, (b, kv_h, j, 0), st[DT, KEYS, D]), load(V, (b, kv_h, j, 0), st[DT, KEYS, D])
            if Q_REGS == 2:
                s = mma_ABt(q, load(k_s, (0, 0), st[DT, KEYS, D // 2]), zeros(rt[f32, 16, KEYS]))
                s = mma_ABt(q_high, load(k_s, (0, 1), st[DT, KEYS, D // 2]), s)
            else:
                s = mma_ABt(q, k_s, zeros(rt[f32, 16, KEYS]))
            if j == key_blocks - 1:
                s = keep_cols(s, K.shape[2] - j * KEYS)  # keys past the end (TMA read them as zeros)
            if CAUSAL:
                if j >= first_masked:
                    s = tril(s, q_tile * 16 - j * KEYS, -math.inf)
            m_new = max(m, row_max(s))
            correction = exp2((m - m_new) * scale_log2)
            if SKIP_RESCALE:  # O only when some row's maximum moved (else every correction is exactly 1)
                if max(m_new - m) > 0.0:
                    o = mul_row(o, correction)
            else:
                o = mul_row(o, correction)
            l, m = l * correction, m_new
            p = exp2(sub_row(s * scale_log2, m * scale_log2))
            if ROWSUM_MMA:
                p_low = p.to(DT)
                l_cols = mma_AB(p_low, ones_s, mul_row(l_cols, correction))
                o = mma_AB(p_low, v_s, o)
            else:
                l = l + row_sum(p)
                o = mma_AB(p.to(DT), v_s, o)
        if ROWSUM_MMA:
            l = row_max(l_cols)                              # (its columns are equal)
        store(O, div_row(o, l).to(DT), (b, h, q_tile, 0))
        if LSE:
            store(L, m * scale + log(l), (b, h, q_tile))  # the p were taken against m: Σ exp = exp(scale·m) · l


# (ROWS, KEYS, Q_IN_SHARED) per head dim, from bench/sweep.py on the H200 (N = 4096, causal and not; D = 32 and 96 on
# an H100, RESULTS "sm_80 attention at D = 32 and 96 — 2026-12-05 18:40": D = 96 1.00 / 1.11x flash with 64-key steps
# against 0.90 / 1.03 with 32); FALLBACK where N does not divide.
CONFIG = {32: (32, 64, 0), 64: (32, 64, 0), 96: (32, 64, 1), 128: (32, 32, 1),
          256: (16, 32, 1)}  # D = 256: the one that fits (243 registers, no spills; 128 KB, a block an SM)
HOPPER_HEAD_DIMS = (64, 96, 128, 256)  # attention_sm90's; D = 32 takes the sm_80 kernels anywhere
DECODE_HEAD_DIMS = tuple(DECODE_CONFIG)  # attention_decode's on Hopper (64, 128, 256); elsewhere DECODE_CONFIG_SM80's
FALLBACK = (16, 64, 0)


def sm80_stages(d: int, device: int) -> dict[str, int]:
    """The pipeline depth of the sm_80 kernels at D = 256 where the card has less shared memory a block than three
    stages need (the forward 128 KB, the backward's dK/dV 112 KB): two (96 KB each) on sm_86 / sm_89 cards' 99 KB."""
    return {"STAGES": 2} if d == 256 and shared_memory_limit(device) < 128 * 1024 else {}


# attention_sm90's configuration per head dim, length and mask, from bench/attention.py --variants on the H200
# (RESULTS 2026-12-03 08:19, 08:41 and 10:01; each round in a new order). D=128: P·V deferred with a producer
# warpgroup and the queries in registers, the tile loop rotated (DEFER=3: the next tile's first Q·Kᵀ under this
# one's epilogue; RESULTS 2026-12-03 16:39: 1.04/1.07/1.05x cuDNN at N = 4096/8192/16384 not causal vs
# 1.02/1.04/1.04 with DEFER=1, causal 1.09/1.12/1.09 vs 1.06/1.12/1.09). Not causal, on a persistent grid: each
# block's next queries and keys load during its current tile (N=1024: 0.92x cuDNN vs 0.88 with two tiles a block;
# N=4096 1.02 vs 0.98). Causal (tiles of different lengths, which a static round robin leaves unbalanced: 0.78-0.99
# persistent): two query blocks per block (RESULTS 12:36: 1.05/1.08/1.07x cuDNN at N = 4096/8192/16384 vs
# ping-pong's 1.03/1.04/1.06, with programmatic dependent launch). D=64: under 2048 keys, two consumer warpgroups of
# 128-key steps with a producer and the queries in registers, step 0 peeled, on a persistent grid (RESULTS
# 2026-12-03 14:30: N=1024 0.93x cuDNN vs 0.89 not causal, 0.88 vs 0.83 causal; a producer of 24 registers a
# thread was +1-2% with the row sums exchanged each step, RESULTS 2026-12-03 21:53, and -1.4% with late sums,
# 2026-12-04 02:13), P·V issued after the row max (LATE_PV; RESULTS 2026-12-04 02:53: 426 vs 418 TFLOP/s not
# causal, 314 vs 312 causal); from 2048 keys three consumer warpgroups of 128-key steps with a producer, not causal
# on a persistent grid (N=2048: 0.99x cuDNN vs 0.89); causal from 2048 to 4096 keys the short configuration on
# four query blocks a block (RESULTS "attention probe — 2026-12-04 05:32–05:33": N=2048 361 vs 340 TFLOP/s with two
# blocks of two 64-key warpgroups per SM, cuDNN 368; persistent 263: causal tiles unbalance a static round robin).
# D=128 causal under 4096 keys: P·V deferred one step less (DEFER=2; RESULTS "attention probe — 2026-12-04 07:33
# and 07:37": N=512 0.92x cuDNN vs 0.86, N=1024 0.97 vs 0.92, N=2048 1.07 vs 1.05). Everywhere the row sums' lane
# parts are exchanged once a tile (LATE_SUMS; RESULTS "attention probe — 2026-12-04": +1-2.5% at N = 1024 and 4096,
# D = 64 and 128, causal and not).
LONG_KEYS = 4096
# A few query rows a K/V head (GROUP·Nq ≤ HOPPER_ROWS: one tile; not causal: decoding) on Hopper by attention_decode
# (the keys split over the GPU, tkc/kernels/attention_decode.py) rather than attention_sm90 (a block per head, most
# of its 128-row tile empty).
# On the H200 1.8-9x attention_sm90 at one query a head, from a CUDA graph (RESULTS "decoding — 2026-12-05").
DECODE_ON_HOPPER = True


def sm90_config(d: int, nq: int, nk: int, causal: bool = False, units: int | None = None,
                sms: int | None = None) -> dict[str, int]:
    """The constants attention() launches attention_sm90 with (WARPS: consumer warps, 16 query rows each) and its
    grid: TILES query blocks per block (default 1), or PERSISTENT=1, one block per slot the GPU holds at once.
    Given the number of heads `units` (B·H) and the GPU's multiprocessors `sms`, a grid of few tiles (small
    batches) gets smaller or more of them (`_for_few_tiles`)."""
    cfg = {**_sm90_schedule(d, nk, causal), "LATE_SUMS": 1}
    if units is not None and sms is not None:
        cfg = _for_few_tiles(cfg, d, nq, causal, units, sms)
    return cfg


def _for_few_tiles(cfg: dict[str, int], d: int, nq: int, causal: bool, units: int, sms: int) -> dict[str, int]:
    """`cfg` for a grid of few tiles (bench/probe_small_batch.py, RESULTS "attention probe — 2026-12-04 12:41", B = 1
    and 2, H = 16). D=64 not causal from 2048 keys takes 192-row tiles, which leave the busiest multiprocessors two
    where the mean is under four: below 4·sms of them, the short configuration's 128-row tiles (N=2048 B=1: 412 vs
    297 TFLOP/s, N=4096 455 vs 440). Several query blocks a block (causal) leave multiprocessors idle below
    2·sms blocks: halve TILES until there are that many (N=2048 B=1: D=64 296 vs 132, D=128 469 vs 307).
    At B·N = 16384 neither applies."""
    if d == 64 and not causal and cfg["WARPS"] == 12 and ceil_div(nq, 192) * units < 4 * sms:
        cfg = {**_sm90_schedule(d, LONG_KEYS // 4, causal), "LATE_SUMS": 1}
    tiles = cfg.get("TILES", 1)
    query_blocks = ceil_div(nq, 16 * cfg["WARPS"]) * units
    while tiles > 1 and ceil_div(query_blocks, tiles) < 2 * sms:
        tiles //= 2
    return cfg if tiles == cfg.get("TILES", 1) else {**cfg, "TILES": tiles}


def _sm90_schedule(d: int, nk: int, causal: bool) -> dict[str, int]:
    """sm90_config's warps, key steps, passes and grid per head dim, key length and mask."""
    if d == 256:  # O takes 128 registers a thread. K and V with barriers of their own (SPLIT_RING, which takes
        # DEFER=2): K's stage refilled once Q·Kᵀ is done, V's a step late behind the deferred P·V, so two stages of
        # 80 keys (80 KB each, beside Q's 64: 225 KB) still load a step ahead: +27-39 % over one ring for both at
        # every length, causal or not, 0.92-1.07x cuDNN (H100, RESULTS "head dim 256, K and V rings apart —
        # 2026-12-06"); three stages (of 48 keys, or of 64 beside half of Q in registers) no better. Lean producer
        # (the consumers 240 registers). Causal from LONG_KEYS keys on: 80-key steps too, step 0 peeled; shorter,
        # 64-key steps with one producer warp (80: 0-3 % behind at N = 1024, "head dim 256, 80-key steps —
        # 2026-12-05 22:36")
        apart = {"WARPS": 8, "STAGES": 2, "DEFER": 2, "SPLIT_RING": 1}
        if not causal:
            return {**apart, "KEYS": 80, "PRODUCER": 2, "PERSISTENT": 1}
        if nk >= LONG_KEYS:
            return {**apart, "KEYS": 80, "PRODUCER": 2, "TILES": 2}
        return {**apart, "KEYS": 64, "PRODUCER": 1, "TILES": 2}
    if d >= 96:  # D = 96 as 128 (not swept)
        cfg = {"KEYS": 128, "WARPS": 8, "DEFER": 3, "PRODUCER": 1, "Q_REGS": 1}
        if not causal:
            return {**cfg, "PERSISTENT": 1}
        return {**cfg, "TILES": 2} if nk >= LONG_KEYS else {**cfg, "DEFER": 2, "TILES": 2}
    short = {"KEYS": 128, "WARPS": 8, "DEFER": 2, "PRODUCER": 1, "Q_REGS": 1, "LATE_PV": 1}
    if nk < LONG_KEYS // 2:  # short keys: two consumer warpgroups with the queries in registers, step 0 peeled
        return {**short, "PERSISTENT": 1}
    long = {"KEYS": 128, "WARPS": 12, "DEFER": 1, "PRODUCER": 1}
    if not causal:
        return {**long, "PERSISTENT": 1}
    return long if nk >= LONG_KEYS else {**short, "TILES": 4}


GRID_KEYS = ("TILES", "PERSISTENT")  # in a configuration: how attention_sm90's grid is sized, not constants


def sm90_constants(cfg: dict[str, int]) -> dict[str, int]:
    """A configuration's kernel constants (without its GRID_KEYS)."""
    return {key: value for key, value in cfg.items() if key not in GRID_KEYS}


def sm90_blocks(batch: int, heads: int, nq: int, warps: int, tiles: int = 1) -> int:
    """attention_sm90's grid for `tiles` query blocks (of 16·warps rows) per block."""
    return ceil_div(ceil_div(nq, 16 * warps) * heads * batch, tiles)


def launch_sm90(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                scale: float, cfg: dict[str, int], *, causal: bool = False, return_lse: bool = False,
                kernel: Any = None, **extra: int) -> tuple[Any, int]:
    """attention_sm90 (or `kernel`, a copy of it with `extra` constants: bench's probes) on checked tensors with
    configuration `cfg` (constants and GRID_KEYS); the specialized kernel it launched and its largest grid."""
    kernel = attention_sm90 if kernel is None else kernel
    batch, heads, nq, d = q.shape
    constants = {"D": d, "CAUSAL": int(causal), "LSE": int(return_lse), **sm90_constants(cfg),
                 **dtype_constant(q.dtype), **group_constant(heads, k.shape[1]), **extra}
    spec = kernel.specialize(target="sm_90a", **constants)
    most = 2**31 - 1
    if cfg.get("PERSISTENT"):
        most = resident_blocks(kernel, (q.device, *constants.items()), q, k, v, out, lse, scale, **constants,
                               target="sm_90a")
    spec[(min(sm90_blocks(batch, heads, nq, cfg["WARPS"], cfg.get("TILES", 1)), most),)](q, k, v, out, lse, scale)
    return spec, most


def group_constant(heads: int, kv_heads: int) -> dict[str, int]:
    """The kernels' GROUP for q's `heads` over k and v's `kv_heads` (checked: it divides), where it is not 1."""
    return {"GROUP": heads // kv_heads} if kv_heads and heads != kv_heads else {}


# (device, dtype, target, query heads a K/V head, configuration) → (the specialized attention_sm90, its query rows a
# tile, tiles a block, its largest grid): what attention()'s common call launches
_PLANS: dict[tuple[Any, ...], tuple[Any, int, int, int]] = {}
_DECODING: set[tuple[Any, ...]] = set()  # (device, target) of Hopper launches that took attention_decode
_KVCACHE: dict[tuple[Any, ...], bool] = {}  # (device, target) of checked attention_kvcache calls → the Hopper path?


@functools.lru_cache(maxsize=4096)
def _config_key(d: int, nq: int, nk: int, causal: bool, units: int, sms: int) -> tuple[tuple[str, int], ...]:
    """attention()'s sm90_config as a (hashable) tuple of its items; D and the mask are in it."""
    return (("D", d), ("CAUSAL", int(causal)), *sm90_config(d, nq, nk, causal, units, sms).items())


def check_qkv(q: Any, k: Any, v: Any, names: tuple[str, str] = ("k", "v")) -> tuple[int, int, int, int, int]:
    """Attention's operands: bf16 (or f16) CUDA tensors q (B, H, Nq, D), k and v (B, H_kv, Nk, D) of one dtype on
    one device, D ∈ {32, 64, 96, 128, 256}, H_kv dividing H (grouped-query attention: query head h reads K/V head
    h // (H / H_kv)); (B, H, Nq, Nk, D), or the error naming the first that is not (k and v by `names`)."""
    import torch

    k_name, v_name = names
    dtype = q.dtype if getattr(q, "dtype", None) is torch.float16 else torch.bfloat16
    check_tensor("q", q, dtype, 4)
    check_tensor(k_name, k, dtype, 4)
    check_tensor(v_name, v, dtype, 4)
    batch, heads, nq, d = q.shape
    nk = k.shape[2]
    if d not in CONFIG:
        fail(f"q: head dim must be 32, 64, 96, 128 or 256, got {d}")
    kv_heads = k.shape[1]
    if k.shape[0] != batch or k.shape[3] != d or (kv_heads == 0) != (heads == 0) or heads and heads % kv_heads:
        fail(f"{k_name}: expected shape ({batch}, H_kv, Nk, {d}) with H_kv dividing q's {heads} heads (H_kv = "
             f"{heads}: multi-head; fewer: grouped-query attention), got {tuple(k.shape)}")
    if v.shape != k.shape:
        fail(f"{v_name}: expected the shape of {k_name} {tuple(k.shape)}, got {tuple(v.shape)}")
    if not q.get_device() == k.get_device() == v.get_device():
        fail(f"q, {k_name}, {v_name} must be on the same device")
    return batch, heads, nq, nk, d


def _tma_aligned(*tensors: Any) -> bool:
    """The common calls' test of what _check_tma_strides checks but the last dimension (the launch's reader checks
    that): 16-byte aligned addresses, the other strides multiples of 8 elements (16 bytes)."""
    bits = 0
    for t in tensors:
        st = t.stride()
        bits |= (t.data_ptr() & 15) | ((st[0] | st[1] | st[2]) & 7)
    return not bits


def _check_tma_strides(*named: tuple[str, Any]) -> None:
    """The Hopper kernels read and write through TMA: the last dimension contiguous, the other strides multiples of
    16 bytes, 16-byte aligned addresses; else the error naming the tensor."""
    for name, t in named:
        st = t.stride()
        if (st[3] != 1 and t.shape[3] > 1) or (st[0] | st[1] | st[2]) % 8 or t.data_ptr() % 16:
            fail(f"{name}: the Hopper kernel reads and writes through TMA: the last dimension must be contiguous "
                 f"and the other strides multiples of 8 elements (16 bytes), got strides {tuple(t.stride())}")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float | None = None,
              target: str | None = None, out: torch.Tensor | None = None,
              return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale · q·kᵀ)·v for bf16 (or f16) CUDA tensors q (B, H, Nq, D), k and v (B, H_kv, Nk, D),
    D ∈ {32, 64, 96, 128, 256} (the output of their dtype), where H_kv divides H: query head h reads K/V head
    h // (H / H_kv) (grouped-query attention, as torch's SDPA with enable_gqa=True; H_kv = 1: multi-query). scale
    defaults to 1/√D (any scale > 0). Causal keeps key j for query i when j ≤ i (torch's `is_causal`, also for
    Nq ≠ Nk).

    On Hopper (or with target="sm_90a") at D = 64, 96, 128 or 256: attention_sm90, any Nq, Nk ≥ 1; the last dimension
    contiguous and the other strides multiples of 16 bytes. Elsewhere (or with target="sm_80"), and at D = 32 on
    every GPU: attention_fwd, Nq and Nk multiples of 64, causal with Nq = Nk; or, at D = 64 or 128 for a few
    queries (decoding: Nq · H / H_kv ≤ MAX_ROWS, not causal, q contiguous), any Nk, by attention_decode
    (tkc/kernels/attention_decode.py; on Hopper with DECODE_ON_HOPPER, up to HOPPER_ROWS rows, at D = 256 too).
    With return_lse, also each row's log-sum-exp ln Σ_j exp(scale · q·k_j), float32 (B, H, Nq): (out, lse). On
    inputs requiring grad, autograd's backward runs tkc's backward kernels (tkc/kernels/attention_bwd.py: causal with
    Nq = Nk)."""
    import torch

    if torch.compiler.is_compiling() or wants_grad(torch, q, k, v):  # one op of the graph / of autograd
        from tkc.kernels import torch_ops

        scale = None if scale is None else float(scale)
        if return_lse or wants_grad(torch, q, k, v):  # the backward needs the log-sum-exp
            o, lse = torch_ops.attention_lse(q, k, v, bool(causal), scale, target)
            o = o if out is None else out.copy_(o)
            return (o, lse) if return_lse else o
        o = torch_ops.attention(q, k, v, bool(causal), scale, target)
        return o if out is None else out.copy_(o)

    # The common call (q, k, v of one 4-D shape but for Nk, no out= or return_lse, a Hopper launch): only what the
    # launch cannot know is checked here, and the launch comes from a plan the first checked call made (a short
    # sequence's kernel runs ~20 µs: the GPU should not wait for Python). Dtypes, devices and the last dimension's
    # contiguity are the launch's argument reader's to check; anything else takes the full checks below.
    if out is None and not return_lse and isinstance(q, torch.Tensor) and q.dim() == 4 and isinstance(k, torch.Tensor):
        batch, heads, nq, d = q.shape
        nk, kv_heads = (k.shape[2], k.shape[1]) if k.dim() == 4 else (0, 0)
        group = heads // kv_heads if kv_heads and heads % kv_heads == 0 else 0
        device = q.get_device()
        sms = MULTIPROCESSORS.get(device)
        # a decoding call's shape never takes attention_sm90's plan (whose key holds no lengths: a prefill's plan
        # would serve every later decoding step): the decoding kernels, or the checked call, which picks them
        decoding = (DECODE_ON_HOPPER and not causal and group and group * nq <= HOPPER_ROWS and d in DECODE_HEAD_DIMS
                    and q.is_contiguous())
        decode = decoding and (device, target) in _DECODING
        plan = (_PLANS.get((device, q.dtype, target, group, _config_key(d, nq, nk, bool(causal), batch * heads, sms)))
                if sms is not None and nq and nk and group and not decoding else None)
        if ((plan is not None or decode and nk and nq) and k.shape == (batch, kv_heads, nk, d)
                and isinstance(v, torch.Tensor) and v.shape == k.shape
                and (scale is None or type(scale) is float and 0 < scale < math.inf)):
            out = torch.empty_like(q)  # q's layout, as the checked call's
            if _tma_aligned(q, k, v):  # (out's layout is q's)
                scale = 1.0 / math.sqrt(d) if scale is None else scale
                if decode:
                    if attention_decode_launch(q, k, v, out, None, scale, sms, target, common_only=True):
                        return out
                else:
                    spec, rows, tiles, most = plan
                    blocks = min(ceil_div(ceil_div(nq, rows) * heads * batch, tiles), most)
                    if spec.launch((blocks, 1, 1), (q, k, v, out, UNREAD_LSE[device], scale), common_only=True):
                        return out
            out = None

    if scale is not None and not (isinstance(scale, numbers.Real) and 0 < scale < math.inf):
        fail(f"scale: must be a positive finite number, got {scale!r} (the kernels offset each row by its largest "
             "q·k, which is the largest scale·q·k only when scale > 0)")
    batch, heads, nq, nk, d = check_qkv(q, k, v)
    device = q.get_device()
    if out is None:
        out = torch.empty_like(q)
    else:
        check_like("out", out, q)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if target == "sm_90a" and d not in HOPPER_HEAD_DIMS:
        fail(f"q: target sm_90a's kernels take head dims 64, 96, 128 and 256, got {d} (D = 32 runs the sm_80 kernels: "
             "target=None or \"sm_80\")")
    on_hopper = wgmma_path(device, target)
    hopper = on_hopper and d in HOPPER_HEAD_DIMS
    lse = torch.empty((batch, heads, nq), dtype=torch.float32, device=q.device) if return_lse else None
    if hopper:
        if nk == 0 and nq:
            fail("k: attention needs at least one key (Nk = 0)")
        _check_tma_strides(("q", q), ("k", k), ("v", v), ("out", out))
        if batch * heads * nq == 0:
            return (out, lse) if return_lse else out
        rows = heads // k.shape[1] * nq  # a K/V head's
        if DECODE_ON_HOPPER and rows <= HOPPER_ROWS and d in DECODE_HEAD_DIMS and takes_decode(rows, causal, q, out):
            attention_decode_launch(q, k, v, out, lse, scale, multiprocessors(device), target)
            _DECODING.add((device, target))  # the common call may now take it (its launches check the rest)
            return (out, lse) if return_lse else out
        if lse is None:
            lse = unread_lse(q)
        key = _config_key(d, nq, nk, bool(causal), batch * heads, multiprocessors(device))
        cfg = dict(key[2:])
        spec, most = launch_sm90(q, k, v, out, lse, scale, cfg, causal=causal, return_lse=return_lse)
        if not return_lse:
            _PLANS[(device, q.dtype, target, heads // k.shape[1], key)] = (spec, 16 * cfg["WARPS"],
                                                                           cfg.get("TILES", 1), most)
        return (out, lse) if return_lse else out
    if ((nq % 64 or nk % 64) and nk and d in DECODE_CONFIG_SM80
            and takes_decode(heads // k.shape[1] * nq, causal, q, out)):
        if batch * heads * nq:  # a few queries (decoding): split over the keys, any Nk
            attention_decode_launch(q, k, v, out, lse, scale, multiprocessors(device), target, hopper=False)
        return (out, lse) if return_lse else out
    if nq % 64 or nk % 64:
        fail(f"q, k: on this path sequence lengths must be multiples of 64, got Nq={nq}, Nk={nk} (or, at D = 64 "
             f"or 128, Nq · H / H_kv ≤ {MAX_ROWS}, not causal: decoding)")
    if causal and nq != nk:
        fail(f"causal attention on this path needs Nq = Nk, got {nq} and {nk}")
    if batch * heads * nq == 0:
        return (out, lse) if return_lse else out
    rows, keys, q_in_shared = CONFIG[d]
    if nq % (4 * rows) or nk % keys:
        rows, keys, q_in_shared = FALLBACK
    build = "sm_80" if on_hopper else target  # D = 32 on Hopper: the sm_80 build, as the backward's kernels
    grid, constants = (nq // (4 * rows), heads, batch), {"D": d, "CAUSAL": int(causal), "ROWS": rows, "KEYS": keys,
                                                         "Q_IN_SHARED": q_in_shared, "target": build,
                                                         **dtype_constant(q.dtype),
                                                         **group_constant(heads, k.shape[1]), **sm80_stages(d, device)}
    if return_lse:
        attention_fwd_lse[grid](q, k, v, out, lse, scale, **constants)
        return out, lse
    attention_fwd[grid](q, k, v, out, scale, **constants)
    return out


def attention_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor, *,
                      block_table: torch.Tensor | None = None, scale: float | None = None, target: str | None = None,
                      out: torch.Tensor | None = None,
                      return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Decoding over a KV cache filled to a different length in each batch (FlashAttention's flash_attn_with_kvcache
    with cache_seqlens, without appending): q (B, H, Nq, D) contiguous, a few query rows a K/V head (H / H_kv · Nq ≤
    MAX_ROWS), k_cache and v_cache (B, H_kv, N_max, D), cache_seqlens (B,) int32: batch b's rows attend to keys
    0 .. cache_seqlens[b] - 1 of its cache (not causal: each of its Nq rows to all of them). bf16 or f16; D ∈ {64,
    128}, on Hopper 256 too. Lengths past N_max read as N_max (never out of bounds); a batch of length 0 gets zero rows
    (and lse -inf). The cache's rows past a batch's length are never used (they may hold anything, NaN too).

    A paged cache (vLLM's, flash_attn_with_kvcache's block_table): k_cache and v_cache (pages, H_kv, page size, D)
    (a transposed view of FlashAttention's (pages, page size, H_kv, D) layout) and block_table (B, pages a batch)
    int32: batch b's key i lies in page block_table[b, i // page size], row i % page size; N_max is the table's
    pages a batch times the page size. The page size must be a multiple of the kernels' key step (256 always is;
    FlashAttention-2 asks the same).

    With return_lse, also each row's log-sum-exp, float32 (B, H, Nq). The keys split over the GPU as attention()'s
    decoding (attention_decode's kernels, built with LENGTHS, and PAGED). (cache_seqlens' and block_table's values
    are not read on the host: that would wait for the GPU.)"""
    import torch

    # The common call (a decoding step after a checked one on this device and target: no out= or return_lse): only
    # what the launch cannot know is checked here, as attention()'s; the launch's argument reader checks dtypes,
    # devices and contiguity of the last dimension, and anything outside its common case takes the full checks.
    device = q.get_device() if isinstance(q, torch.Tensor) else None
    hopper = _KVCACHE.get((device, target)) if out is None and not return_lse else None
    if (hopper is not None and q.dim() == 4 and isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4
            and isinstance(v_cache, torch.Tensor) and isinstance(cache_seqlens, torch.Tensor)
            and not wants_grad(torch, q, k_cache, v_cache)):
        batch, heads, nq, d = q.shape
        kv_heads, nk = k_cache.shape[1], k_cache.shape[2]
        config = (DECODE_CONFIG if hopper else DECODE_CONFIG_SM80).get(d)
        if block_table is None:
            cache_fits = k_cache.shape == (batch, kv_heads, nk, d)
        else:  # (pages of whole key steps; the table a row a batch)
            cache_fits = (isinstance(block_table, torch.Tensor) and block_table.dim() == 2
                          and block_table.shape[0] == batch and block_table.shape[1] and k_cache.shape[3] == d
                          and config is not None and nk % (4 * config[0]) == 0)
        if (cache_fits and v_cache.shape == k_cache.shape and cache_seqlens.shape == (batch,) and config is not None
                and nk and batch * heads * nq and kv_heads and heads % kv_heads == 0
                and heads // kv_heads * nq <= MAX_ROWS and q.is_contiguous()
                and (scale is None or type(scale) is float and 0 < scale < math.inf)):
            if not hopper or _tma_aligned(q, k_cache, v_cache):  # (TMA's on Hopper; out's layout is q's)
                out = torch.empty_like(q)
                if attention_decode_launch(q, k_cache, v_cache, out, None,
                                           1.0 / math.sqrt(d) if scale is None else scale, MULTIPROCESSORS[device],
                                           target, common_only=True, hopper=hopper, lengths=cache_seqlens,
                                           pages=block_table):
                    return out
                out = None

    if wants_grad(torch, q, k_cache, v_cache):  # (its output would silently leave autograd's graph)
        fail("q, k_cache, v_cache: attention_kvcache is for inference and has no backward; call it under "
             "torch.no_grad(), or use attention_varlen with cu_seqlens_k to train")
    if block_table is None:
        batch, heads, nq, nk, d = check_qkv(q, k_cache, v_cache, ("k_cache", "v_cache"))
    else:
        batch, heads, nq, nk, d = _check_paged_cache(q, k_cache, v_cache, block_table)
    check_tensor("cache_seqlens", cache_seqlens, torch.int32, 1)
    if cache_seqlens.shape[0] != batch:
        fail(f"cache_seqlens: one length a batch, expected shape ({batch},), got {tuple(cache_seqlens.shape)}")
    if cache_seqlens.get_device() != q.get_device():
        fail(f"cache_seqlens is on {cache_seqlens.device} but q is on {q.device}")
    if scale is not None and not (isinstance(scale, numbers.Real) and 0 < scale < math.inf):
        fail(f"scale: must be a positive finite number, got {scale!r}")
    device = q.get_device()
    hopper = wgmma_path(device, target)
    dims = DECODE_CONFIG if hopper else DECODE_CONFIG_SM80
    if d not in dims:
        fail(f"q: attention_kvcache takes head dims {', '.join(map(str, dims))} here, got {d}")
    if block_table is not None and k_cache.shape[2] % (4 * dims[d][0]):
        fail(f"k_cache: pages of {k_cache.shape[2]} keys, but with block_table the page size must be a multiple of "
             f"{4 * dims[d][0]} here (the kernels' key step at D = {d}; 256 works on every path)")
    rows = heads // k_cache.shape[1] * nq if heads else 0
    if rows > MAX_ROWS:
        fail(f"q: attention_kvcache is for decoding, at most {MAX_ROWS} query rows a K/V head (H / H_kv · Nq), got "
             f"{rows}: use attention_varlen with cu_seqlens_k for longer queries")
    if not q.is_contiguous():
        fail("q: must be contiguous (each K/V head's query rows are read as one tile)")
    if out is None:
        out = torch.empty_like(q)
    else:
        check_like("out", out, q)
        if not out.is_contiguous():
            fail("out: must be contiguous, as q")
    if nk == 0:
        fail("k_cache: needs room for at least one key (N_max = 0)")
    if hopper:
        _check_tma_strides(("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out))
    lse = torch.empty((batch, heads, nq), dtype=torch.float32, device=q.device) if return_lse else None
    if batch * heads * nq:
        attention_decode_launch(q, k_cache, v_cache, out, lse, 1.0 / math.sqrt(d) if scale is None else float(scale),
                                multiprocessors(device), target, hopper=hopper, lengths=cache_seqlens,
                                pages=block_table)
        _KVCACHE[(device, target)] = hopper  # the common call may now take this device and target
    return (out, lse) if return_lse else out


def _check_paged_cache(q: Any, k_cache: Any, v_cache: Any, block_table: Any) -> tuple[int, int, int, int, int]:
    """A paged cache's operands (attention_kvcache with block_table): q (B, H, Nq, D), k_cache and v_cache (pages,
    H_kv, page size, D) of q's dtype, block_table (B, pages a batch) int32, all on one device; (B, H, Nq, N_max, D)
    with N_max = pages a batch · page size, or the error naming the first that is not so."""
    import torch

    dtype = q.dtype if getattr(q, "dtype", None) is torch.float16 else torch.bfloat16
    check_tensor("q", q, dtype, 4)
    check_tensor("k_cache", k_cache, dtype, 4)
    check_tensor("v_cache", v_cache, dtype, 4)
    check_tensor("block_table", block_table, torch.int32, 2)
    batch, heads, nq, d = q.shape
    pages, kv_heads, page, _ = k_cache.shape
    if k_cache.shape[3] != d or (kv_heads == 0) != (heads == 0) or heads and heads % kv_heads or not pages:
        fail(f"k_cache: with block_table, expected shape (pages, H_kv, page size, {d}) with H_kv dividing q's {heads} "
             f"heads and at least one page, got {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        fail(f"v_cache: expected the shape of k_cache {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    if block_table.shape[0] != batch or block_table.shape[1] == 0:
        fail(f"block_table: one row of pages a batch, expected shape ({batch}, pages a batch ≥ 1), got "
             f"{tuple(block_table.shape)}")
    if not q.get_device() == k_cache.get_device() == v_cache.get_device() == block_table.get_device():
        fail("q, k_cache, v_cache, block_table must be on the same device")
    return batch, heads, nq, block_table.shape[1] * page, d
