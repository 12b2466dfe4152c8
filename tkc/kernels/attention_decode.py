"""Attention for a few query rows over many keys (decoding), split over the keys as flash-decoding does: the rows
that read one K/V head (with grouped-query attention, all its query heads' rows together) are one tile, and the
keys are cut into parts, a block each; each part's softmax·V, normalized, and its log-sum-exp go to f32 buffers,
and a second kernel weighs the parts by their log-sum-exps (or, in one launch, the last part of a row tile to
finish: attention_decode_last, the sm_80 path's outside CUDA graph captures). One block per (head, query tile)
would leave most of the GPU idle (B=1, H=32: 32 blocks) and most of each 64- or 128-row query tile empty. On Hopper,
where a tile's parts are few enough for a cluster (up to 16), they are one: the parts meet in distributed shared
memory and one launch does both (attention_decode_cluster). Built with LENGTHS, each batch reads its own count of
keys (attention_kvcache), and with PAGED its cache's key steps from the pages a page table names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tkc
from tkc.kernels._checks import cdiv as ceil_div  # `cdiv` is the DSL's, for kernels
from tkc.kernels._checks import (arrival_counters, cached_plan, current_stream_key, dtype_constant, stream_scratch,
                                 unread_lengths, unread_lse, unread_pages)
from tkc.lang import *  # noqa: F403

if TYPE_CHECKING:
    import torch

FLOOR = -1e30  # the running maximum a row's probabilities are taken against, at least: a warp whose keys all lie
# past Nk (score -inf) has m = -inf, and exp2(-inf - -inf) would be NaN


@tkc.func
def batch_keys(K, Lengths, Pages, b, LENGTHS, PAGED):
    """The keys batch b attends to: all of K's, or with LENGTHS its own count Lengths[b] (a cache filled to
    different lengths; at most the cache's, at least 0). With PAGED the cache is K's pages (K.shape[2] keys each)
    that batch b's row of the page table Pages names: Pages.shape[1] of them."""
    most = K.shape[2]
    if PAGED:
        most = Pages.shape[1] * K.shape[2]
    if LENGTHS:
        return max(min(Lengths[b], most), 0)
    return most


@tkc.func
def key_step(K, Pages, b, h, j, rows_a_step, D, PAGED, DT):
    """Key step j of batch b's cache (K/V head h) into shared memory: K's tile j of batch b, or with PAGED its keys
    j·rows_a_step .. from the page Pages[b, ·] that holds them (a page holds a whole number of steps)."""
    if PAGED:
        first = j * rows_a_step
        page = Pages[b, first // K.shape[2]]
        return load(K, (page, h, rows(first % K.shape[2]), 0), st[DT, rows_a_step, D])
    return load(K, (b, h, j, 0), st[DT, rows_a_step, D])


@tkc.func
def decode_part(Q, K, V, Pages, b, h, t, part, steps, keys, scale, D, KEYS, LENGTHS, PAGED, DT):
    """Query rows 16t .. 16t + 15 of K/V head h (batch b) over key steps part·steps .. (part + 1)·steps - 1 of 4·KEYS
    keys, of the batch's first `keys` keys (with PAGED in the pages Pages[b] names): softmax(scale · q·kᵀ)·v over
    those keys, normalized, as (this warp's quarter of the columns, warp w's from w·D/4 on; the rows' log-sum-exp,
    alike in every warp).

    Every warp holds the 16 query rows and takes KEYS of each step's keys (the block loads them into shared memory
    together), keeping its own running maximum m, sum l and output o; at the end the four warps' results meet in
    shared memory and each warp weighs a quarter of the columns. Keys past `keys` score -inf: a warp whose keys
    all lie past them ends with l = 0, o = 0 and a log-sum-exp of -inf, which weighs nothing (a part past them runs
    no step: all its warps so). (A finite score for them,
    -1e30, failed on the GPU: ptxas contracts s·c - m·c into an fma, whose difference of two ~1e29 products is not
    0 but ~±1e22, and exp2 of it inf; the simulator, rounding each product, agreed with the interpreter.)"""
    static_assert(D in (64, 128, 256), f"head dim D must be 64, 128 or 256, got {D}")
    static_assert(KEYS in (16, 32, 64), f"KEYS (keys per warp and step) must be 16, 32 or 64, got {KEYS}")
    q = load(Q, (b, h, t, 0), rt[DT, 16, D])
    scale_log2 = scale * LOG2E
    RESCALE_LOG2 = 8.0
    m, l, o = neg_infty(rv[f32, 16]), zeros(rv[f32, 16]), zeros(rt[f32, 16, D])
    first = part * steps
    for j in range(first, min(first + steps, cdiv(keys, 4 * KEYS))):
        k_s = key_step(K, Pages, b, h, j, 4 * KEYS, D, PAGED, DT)
        v_s = key_step(V, Pages, b, h, j, 4 * KEYS, D, PAGED, DT)
        s = mma_ABt(q, load(k_s, (warp_id(), 0), rt[DT, KEYS, D]), zeros(rt[f32, 16, KEYS]))
        s = keep_cols(s, keys - (4 * j + warp_id()) * KEYS)
        m_new = max(m, row_max(s))
        if max(m_new - m) * scale_log2 > RESCALE_LOG2:          # as attention_fwd: rescale only on a large rise
            correction = exp2((m - m_new) * scale_log2)         # (no keys yet: -inf - -inf, NaN, not > RESCALE)
            l, o, m = l * correction, mul_row(o, correction), m_new
        p = exp2(sub_row(s * scale_log2, max(m, FLOOR) * scale_log2))
        l = l + row_sum(p)
        p = p.to(DT)
        v = load(v_s, (warp_id(), 0), rt[DT, KEYS, D])
        if LENGTHS:  # a cache's rows past the batch's length may hold anything (never written: NaN, which p = 0
            # does not cancel): zeros there. Every step, not only the one across the length: under an `if` both
            # tiles stay live (D = 256 spilled 108 bytes; this way 240 registers, none spilled)
            v = keep_rows(v, keys - (4 * j + warp_id()) * KEYS)
        o = mma_AB(p, v, o)
    # The four warps' (o / l, log-sum-exp) through shared memory; warp w weighs columns w·D/4 .. (w+1)·D/4 - 1.
    outs = store(empty(st[f32, D, 64]), transpose(div_row(o, max(l, 1e-30))), (0, warp_id()))  # l = 0: o = 0
    lses = store(empty(sv[f32, 64]), m * scale + log(l), (warp_id(),))
    top = load(lses, (0,), rv[f32, 16])
    for w in range(1, 4):
        top = max(top, load(lses, (w,), rv[f32, 16]))
    top = max(top, FLOOR)  # (a part past the batch's keys: every warp's -inf; their weights 0 then, not NaN)
    total, acc = zeros(rv[f32, 16]), zeros(rt[f32, 16, D // 4])
    for w in range(4):
        weight = exp(load(lses, (w,), rv[f32, 16]) - top)
        total = total + weight
        acc = acc + mul_row(transpose(load(outs, (warp_id(), w), rt[f32, D // 4, 16])), weight)
    return div_row(acc, max(total, 1e-30)), top + log(total)  # (no keys: o = 0, lse -inf)


@tkc.func
def weigh_in(top, total, acc, o, lse):
    """(top, total, acc) with one more part weighed in: its output `o` and log-sum-exp `lse` against the running
    maximum `top` (at least FLOOR: a part of lse -inf first would make exp(-inf - -inf)); acc and total rescaled."""
    new_top = max(max(top, lse), FLOOR)
    old, new = exp(top - new_top), exp(lse - new_top)   # the first part: old = exp(-inf) = 0
    acc = mul_row(acc, old) + mul_row(o, new)
    return new_top, total * old + new, acc


@tkc.kernel(warps=4, stages="STAGES", min_target="sm_80")
def attention_decode(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], Lengths: gl[i32, 1], Pages: gl[i32, 2],
                     OParts: gl[f32, 4], LParts: gl[f32, 3], scale: float, steps: int, D: const = 128,
                     KEYS: const = 16, STAGES: const = 3, LENGTHS: const = 0, PAGED: const = 0, DT: const = bf16):
    """Q (B, H_kv, R, D): the R query rows that read K/V head h (grouped-query attention: q (B, H, Nq, D) viewed so,
    the H / H_kv heads' Nq rows each), K and V (B, H_kv, Nk, D); with LENGTHS, batch b's keys are its first
    Lengths[b] (B,) (a cache filled to different lengths; none: zero rows), else Lengths is unread. With PAGED, K
    and V are pages (pages, H_kv, page size, D) of whole key steps and batch b's cache is the pages its row of the
    page table Pages (B, pages a batch) names, in order (vLLM's / FlashAttention's block_table); else Pages is
    unread. Grid: (P·T, H_kv, B), T = cdiv(R, 16): block (p·T + t, h, b) takes query rows 16t .. 16t + 15 and key
    steps p·steps .. (p + 1)·steps - 1 of 4·KEYS keys (decode_part), and stores softmax(scale · q·kᵀ)·v over its
    keys (normalized) at OParts[p·B + b, h] and each row's log-sum-exp at LParts[p·B + b, h]: (P·B, H_kv, R, D) and
    (P·B, H_kv, R), for attention_decode_combine."""
    part_tile, h, b = block_idx()
    row_tiles = cdiv(Q.shape[2], 16)                         # a part's row tiles next to each other: their K and V
    part, t = part_tile // row_tiles, part_tile % row_tiles  # come from L2 but for the first
    o, lse = decode_part(Q, K, V, Pages, b, h, t, part, steps, batch_keys(K, Lengths, Pages, b, LENGTHS, PAGED),
                         scale, D, KEYS, LENGTHS, PAGED, DT)
    row = part * Q.shape[0] + b
    store(OParts, o, (row, h, t, warp_id()))
    if warp_id() == 0:
        store(LParts, lse, (row, h, t))


@tkc.func
def part_result(OParts, LParts, part, batch, b, h, t, D):
    """attention_decode's part `part` of row tile t (K/V head h, batch b of `batch`) out of its buffers: this warp's
    D / 4 columns of the output and the rows' log-sum-exp (zeros past the last part)."""
    row = part * batch + b
    return load(OParts, (row, h, t, warp_id()), rt[f32, 16, D // 4]), load(LParts, (row, h, t), rv[f32, 16])


@tkc.kernel(warps=4, stages="STAGES", min_target="sm_80")
def attention_decode_last(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], Lengths: gl[i32, 1], Pages: gl[i32, 2],
                          OParts: gl[f32, 4], LParts: gl[f32, 3], O: gl["DT", 4], L: gl[f32, 3],
                          Counter: gl[i32, 1], scale: float, steps: int, D: const = 128, KEYS: const = 16,
                          STAGES: const = 3, LSE: const = 0, LENGTHS: const = 0, PAGED: const = 0, DT: const = bf16):
    """attention_decode and attention_decode_combine in one launch on any GPU: each block leaves its part's output and
    log-sum-exp in OParts and LParts (as attention_decode), and the last of a row tile's parts to arrive at its
    counter (Counter[(b·H_kv + h)·T + t], zero before the first launch and again after each) weighs them all into O
    (B, H_kv, R, D), each warp D / 4 of the columns (and with LSE the log-sum-exp into L (B, H_kv, R)). Q, K, V,
    Lengths, Pages, the grid and the parts as attention_decode's."""
    part_tile, h, b = block_idx()
    row_tiles = cdiv(Q.shape[2], 16)
    part, t = part_tile // row_tiles, part_tile % row_tiles
    o, lse = decode_part(Q, K, V, Pages, b, h, t, part, steps, batch_keys(K, Lengths, Pages, b, LENGTHS, PAGED),
                         scale, D, KEYS, LENGTHS, PAGED, DT)
    store(OParts, o, (part * Q.shape[0] + b, h, t, warp_id()))
    if warp_id() == 0:
        store(LParts, lse, (part * Q.shape[0] + b, h, t))
    parts = num_blocks()[0] // row_tiles
    if arrive_last(Counter, (b * Q.shape[1] + h) * row_tiles + t, parts):
        # the parts weighed in order with the next four's loads in flight (past the last part they read zeros,
        # unused) rather than one L2 round trip a part waited on in turn; no gain shown yet: from a graph 3.3 µs
        # behind the two kernels at B = 1, 8192 keys either way (H100 before, H200 after; RESULTS "issue 4's bars on
        # the H200, and decoding / few rows")
        top, total, acc = neg_infty(rv[f32, 16]), zeros(rv[f32, 16]), zeros(rt[f32, 16, D // 4])
        o0, l0 = part_result(OParts, LParts, 0, Q.shape[0], b, h, t, D)
        o1, l1 = part_result(OParts, LParts, 1, Q.shape[0], b, h, t, D)
        o2, l2 = part_result(OParts, LParts, 2, Q.shape[0], b, h, t, D)
        o3, l3 = part_result(OParts, LParts, 3, Q.shape[0], b, h, t, D)
        for p in runtime_range(parts):
            o, lse = o0, l0
            o0, o1, o2, l0, l1, l2 = o1, o2, o3, l1, l2, l3
            o3, l3 = part_result(OParts, LParts, p + 4, Q.shape[0], b, h, t, D)
            top, total, acc = weigh_in(top, total, acc, o, lse)
        store(O, div_row(acc, max(total, 1e-30)).to(DT), (b, h, t, warp_id()))
        if LSE:
            if warp_id() == 0:
                store(L, top + log(total), (b, h, t))


@tkc.kernel(warps=4, stages="STAGES", cluster="CLUSTER", min_target="sm_90a")
def attention_decode_cluster(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], Lengths: gl[i32, 1],
                             Pages: gl[i32, 2], O: gl["DT", 4], L: gl[f32, 3], scale: float, steps: int,
                             D: const = 128, KEYS: const = 32, STAGES: const = 2, CLUSTER: const = 2, LSE: const = 0,
                             LENGTHS: const = 0, PAGED: const = 0, DT: const = bf16):
    """attention_decode and attention_decode_combine in one launch, with no buffers in global memory: the CLUSTER
    parts of a row tile's keys are the blocks of a cluster, each leaving its part's output and log-sum-exp in its
    shared memory; after a cluster barrier each warp of the cluster reads its 16 columns of them out of the blocks'
    (distributed shared memory), weighs them, and stores them to O (B, H_kv, R, D) (and with LSE the log-sum-exp L
    (B, H_kv, R)).
    Q, K, V, Lengths, Pages as attention_decode's. Grid: (T·CLUSTER, H_kv, B): block (t·CLUSTER + p, h, b) takes
    query rows 16t .. 16t + 15 and key steps p·steps .. (p + 1)·steps - 1. CLUSTER = 1: one block a row tile, no
    split."""
    t, h, b = block_idx()[0] // CLUSTER, block_idx()[1], block_idx()[2]
    keys = batch_keys(K, Lengths, Pages, b, LENGTHS, PAGED)
    o, lse = decode_part(Q, K, V, Pages, b, h, t, cluster_rank(), steps, keys, scale, D, KEYS, LENGTHS, PAGED, DT)
    # cluster loads read register tiles: the log-sum-exps as 16×16 tiles, a row's value in all of its row
    outs = store(empty(st[f32, 16, D]), o, (0, warp_id()), conflicts=2)  # once a block
    lses = store(empty(st[f32, 64, 16]), add_row(zeros(rt[f32, 16, 16]), lse), (warp_id(), 0), conflicts=2)
    cluster_sync()
    # the weighing spread over the cluster: each warp one 16-column tile of O (D / 16 of them), read from every part
    # (8.9 / 22.7 µs against 9.7 / 25.0 with the first block's four warps reading all, 8 / 16 parts, RESULTS
    # "decoding in fewer, larger parts — 2026-12-06 18:06")
    for col in range(cluster_rank() * 4 + warp_id(), D // 16, 4 * CLUSTER):
        parts = ()
        for rank in range(CLUSTER):
            parts = parts + (row_max(load(lses, (0, 0), rt[f32, 16, 16], rank=rank, conflicts=2)),)
        top = parts[0]
        for rank in range(1, CLUSTER):
            top = max(top, parts[rank])
        top = max(top, FLOOR)  # (a batch without keys: every part's -inf; zero rows, lse -inf)
        total, acc = zeros(rv[f32, 16]), zeros(rt[f32, 16, 16])
        for rank in range(CLUSTER):
            weight = exp(parts[rank] - top)
            total = total + weight
            acc = acc + mul_row(load(outs, (0, col), rt[f32, 16, 16], rank=rank, conflicts=2), weight)
        store(O, div_row(acc, max(total, 1e-30)).to(DT), (b, h, t, col))
        if LSE:
            if col == 0:
                store(L, top + log(total), (b, h, t))


@tkc.kernel(warps=4, min_target="sm_80")
def attention_decode_combine(OParts: gl[f32, 3], LParts: gl[f32, 2], O: gl["DT", 2], L: gl[f32, 1],
                             LSE: const = 0, DT: const = bf16):
    """The parts' outputs weighed by their log-sum-exps: O = Σ_p exp(lse_p - lse)·OParts[p], with
    lse = ln Σ_p exp(lse_p) (into L with LSE), over (P, rows, D) and (P, rows) (attention_decode's buffers, flat)
    into (rows, D). Grid: (cdiv(rows, 16), D / 32): block (t, c) takes rows 16t .. 16t + 15, columns
    32c .. 32c + 31. Warp w weighs parts w, w + 4, w + 8, ... (a running maximum) with its next four parts' loads in
    flight (past the last part they read zeros, unused); the four warps' results then meet in shared memory. A warp
    weighing every part, one round trip after the other, made this kernel a fifth of a B=1 decoding step."""
    tile, cols = block_idx()[0], block_idx()[1]
    top, total, acc = neg_infty(rv[f32, 16]), zeros(rv[f32, 16]), zeros(rt[f32, 16, 32])
    first = warp_id()
    o0, l0 = load(OParts, (first, tile, cols), rt[f32, 16, 32]), load(LParts, (first, tile), rv[f32, 16])
    o1, l1 = load(OParts, (first + 4, tile, cols), rt[f32, 16, 32]), load(LParts, (first + 4, tile), rv[f32, 16])
    o2, l2 = load(OParts, (first + 8, tile, cols), rt[f32, 16, 32]), load(LParts, (first + 8, tile), rv[f32, 16])
    o3, l3 = load(OParts, (first + 12, tile, cols), rt[f32, 16, 32]), load(LParts, (first + 12, tile), rv[f32, 16])
    for part in range(first, LParts.shape[0], 4):
        o, lse = o0, l0
        o0, o1, o2, l0, l1, l2 = o1, o2, o3, l1, l2, l3
        o3, l3 = load(OParts, (part + 16, tile, cols), rt[f32, 16, 32]), load(LParts, (part + 16, tile), rv[f32, 16])
        top, total, acc = weigh_in(top, total, acc, o, lse)
    # A warp without parts (fewer than 4) has total 0: its output 0, its log-sum-exp -inf, its weight 0.
    # f32 rows: the warps' results cross shared memory once a block, 2-way conflicting each way
    outs = store(empty(st[f32, 64, 32]), div_row(acc, max(total, 1e-30)), (warp_id(), 0), conflicts=2)
    lses = store(empty(sv[f32, 64]), top + log(total), (warp_id(),))
    top = load(lses, (0,), rv[f32, 16])
    for w in range(1, 4):
        top = max(top, load(lses, (w,), rv[f32, 16]))
    top = max(top, FLOOR)  # (rows of a batch without keys: every part's -inf; zero rows, lse -inf)
    total, acc = zeros(rv[f32, 16]), zeros(rt[f32, 16, 32])
    for w in range(4):
        weight = exp(load(lses, (w,), rv[f32, 16]) - top)
        total = total + weight
        acc = acc + mul_row(load(outs, (w, 0), rt[f32, 16, 32], conflicts=2), weight)
    if warp_id() == 0:
        store(O, div_row(acc, max(total, 1e-30)).to(DT), (tile, cols))
        if LSE:
            if cols == 0:
                store(L, top + log(total), (tile,))


# (KEYS, STAGES, BLOCKS) per head dim: a step is 4·KEYS keys (64 KB of K and V at either D), STAGES - 1 steps in
# flight per block, and the keys split into parts enough for BLOCKS blocks a multiprocessor (the blocks it holds at
# once: 144-160 KB of shared memory leave room for one): one wave. On the H200, D=128: B=8 H_kv=8 Nk=8192 0.91x
# cuDNN with 128-key steps and 2 stages vs 0.76x with 64-key steps and 3 (or 4) stages (RESULTS "decoding —
# 2026-12-05 12:10"); B=1 Nk=32768 0.99x cuDNN from a CUDA graph with parts for one block a multiprocessor (128
# blocks), 0.90x with parts for two (256: two waves), B=8 0.92x either way ("13:50"). On an H100, with the parts
# rounded down to one wave: 0.98-1.01x at one query a head ("15:09").
CONFIG = {64: (64, 2, 1), 128: (32, 2, 1),
          256: (16, 2, 1)}  # D = 256 (not yet timed): 64-key steps, 242 registers, no spills, 193 KB; Hopper only
# The sm_80 path's, in 96 KB of shared memory at most (an RTX 4090 gives a block 99 KB; an A100 holds two)
CONFIG_SM80 = {64: (32, 2, 2), 128: (16, 2, 2)}
MAX_ROWS = 64           # query rows a K/V head (GROUP·Nq) up to which attention() may take this path
HOPPER_ROWS = 16        # on Hopper: one tile (with more, attention_sm90's blocks read K and V once for all rows)
MIN_STEPS = 4           # key steps a part at least: each part's pipeline has steps to overlap
# On Hopper, up to MAX_CLUSTER parts a row tile run as one cluster (attention_decode_cluster): one launch, no f32
# buffers, no combine kernel
DECODE_IN_CLUSTERS = True
MAX_CLUSTER = 16        # blocks a cluster: above 8 (B = 1 from 8192 keys at D = 128: 16 parts) a size that not every
# sm_90 GPU places (a GPC of 16 free multiprocessors a cluster): `together` asks
CLUSTER_PARTS = 0       # on Hopper, at most this many parts a row tile (0: a wave's, as decode_parts splits;
# bench/probe_decode.py --variants)
# Where a wave's parts do not make clusters the GPU holds all at once (an H100 holds 7 clusters of 16 and 30 of 4:
# one GPC has fewer multiprocessors), a call outside a CUDA graph capture that reads at most FEWER_PARTS_BYTES of K and
# V takes one launch of fewer, larger parts in clusters (the most of at most 8 the GPU holds, at least half a
# wave's) instead of the two kernels: such a call waits on the host's two launches (~64 µs a call against 35-39 on
# an H100: B = 1, Nk = 8192 / 16384 0.81 -> 1.43 / 1.37x cuDNN, B = 4, Nk = 4096 0.77 -> 1.41x). A graph keeps the
# wave's split (its replay has no host work: B = 1 at 8 parts reads 0.95-0.97x cuDNN from a graph against 1.01-1.02).
FEWER_PARTS = True
# ... also for attention_kvcache (LENGTHS), whose parts are sized by the cache's N_max: a batch filled to part of it
# leaves some of the fewer parts empty (B = 1 at 32768 keys filled to 63 %: 72 µs against the sm_80 build's wave of
# parts 54 and flash's 52 on an H100, RESULTS "attention-kvcache — 2026-12-07 23:10"). False: the two kernels over
# the wave's split there (not yet timed: bench/attention_kvcache.py times both)
FEWER_PARTS_WITH_LENGTHS = True
FEWER_PARTS_BYTES = 1 << 27  # 134 MB: B = 1, H_kv = 8, Nk = 32768 at D = 128 still gained (0.85 -> 0.99x cuDNN)
# The wave's split in one launch instead of the two kernels: attention_decode_last, whose last part of a row tile to
# arrive at its counter weighs the parts (arrival_counters). "eager": outside CUDA graph captures only (a capture keeps
# the two kernels); True: in captures too (the graph zeroes counters of its own); False: never.
# On Hopper (DECODE_LAST_BLOCK, where the clusters do not take the call) off: from a graph slower than the two kernels
# (B = 1 at 8192 / 32768 keys 14.4 / 40.9 µs against 8.0 + 3.1 / 34.6 + 3.1 on the H200, RESULTS "issue 4's bars on
# the H200, and decoding / few rows — 2026-12-06 23:51": one block a row tile weighs all 16 parts after its own), and
# eager behind the clusters wherever those are held (30.3 against 22.8 µs a call at B = 1, 8192 keys).
# On the sm_80 path (DECODE_LAST_BLOCK_SM80: A100s, no clusters) eager: a call waits on the host's two launches (B = 1,
# 8192 keys on the H200: 40.5 µs a call against 30.3, 0.80 -> 1.07x cuDNN; B = 8 level), a graph keeps the two
# kernels (13.0 against 22.0 µs: 32 parts weighed in one block a row tile).
DECODE_LAST_BLOCK: bool | str = False
DECODE_LAST_BLOCK_SM80: bool | str = "eager"
# "eager" takes the one launch only where K and V are at most this many bytes: where the host's second launch is what
# a call waits on; above, the GPU's time dominates and one block a row tile weighing all the parts after its own
# costs more than the combine kernel. The sm_80 path on an H100 (RESULTS "decoding's one launch on the sm_80 path as
# shipped — 2026-12-07 01:53"), B = 1, µs a call one launch / two: 34 MB 39.2 / 52.3, 67 MB 41.1 / 53.7 (gains up to
# here), 134 MB 63.3 / 56.7, 537 MB 192.7 / 187.0 (loses above); Hopper, 16 parts, 134 MB: 43.4 / 41.7.
LAST_BLOCK_BYTES = 1 << 26


def decode_parts(units: int, steps: int, slots: int) -> tuple[int, int]:
    """The keys' split for `units` blocks a part (K/V heads × query tiles × batch) over `steps` key steps: (parts,
    steps a part). As many parts as the GPU's `slots` (multiprocessors × the blocks each holds) take in one wave,
    none of fewer than MIN_STEPS steps (where there are that many), and no part empty. (Rounding the parts up
    instead left 136 blocks for 132 multiprocessors at B=1, H_kv=8, Nk=131072: 0.76x cuDNN from a graph, RESULTS
    "decoding — 2026-12-05 15:04".)"""
    parts = max(1, min(slots // units, steps // MIN_STEPS))
    per_part = ceil_div(steps, parts)
    return ceil_div(steps, per_part), per_part


def takes_decode(rows: int, causal: bool, q: torch.Tensor, out: torch.Tensor) -> bool:
    """Can attention() take this path for `rows` query rows a K/V head (GROUP·Nq): not causal, few rows, and q and
    out contiguous (viewed as (B, H_kv, GROUP·Nq, D): a K/V head's query heads' rows in a row)."""
    return not causal and rows <= MAX_ROWS and q.is_contiguous() and out.is_contiguous()


def attention_decode_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                            lse: torch.Tensor | None, scale: float, sms: int, target: str | None,
                            common_only: bool = False, hopper: bool = True,
                            lengths: torch.Tensor | None = None, pages: torch.Tensor | None = None) -> bool:
    """attention() by attention_decode_cluster (Hopper, where a row tile's parts make a cluster the GPU holds with
    all the others), by attention_decode_last where the path's switch takes it (DECODE_LAST_BLOCK on Hopper,
    DECODE_LAST_BLOCK_SM80 on the sm_80 path: eagerly, as shipped), or by attention_decode and
    attention_decode_combine, on checked tensors (q and out contiguous, not causal): out, and lse (B, H, Nq) where
    given; True once launched. With `common_only` (attention()'s common call, shapes checked, q, k and v not), q, k
    and v outside the launch's common case launch nothing: False. hopper: CONFIG, else CONFIG_SM80. lengths: (B,)
    int32, each batch's count of keys (attention_kvcache), or None (all of k's). pages: (B, pages a batch) int32,
    the page table of a paged cache (k and v (pages, H_kv, page size, D), the page size a multiple of the key step
    4·KEYS), or None."""
    import torch

    # (a decoding step's shapes repeat: its host work is what a short step waits for); a paged cache's as the
    # contiguous cache it stands for, (B, H_kv, pages a batch · page size, D)
    k_shape = k.shape if pages is None else (q.shape[0], k.shape[1], pages.shape[1] * k.shape[2], k.shape[3])
    plan = cached_plan(_PLANS, (q.shape, k_shape, q.dtype, lse is not None, target, sms, hopper, lengths is not None,
                                pages is not None), _plan)
    l_out = lse.view(plan.q_rows[:3]) if lse is not None else unread_lse(q)  # (read by the one-launch kernels)
    kv = (k, v, unread_lengths(q) if lengths is None else lengths, unread_pages(q) if pages is None else pages)
    if plan.clustered is not None:
        cluster_args = (q.view(plan.q_rows), *kv, out.view(plan.q_rows), l_out, scale)
        if plan.together is None:  # asked once a shape, of the first (checked) call
            if common_only:
                return False
            plan.decide(cluster_args)
        fewer = plan.fewer is not None and not torch.cuda.is_current_stream_capturing() and (
            lengths is None or FEWER_PARTS_WITH_LENGTHS)
        clustered, steps = ((plan.clustered, plan.steps) if plan.together else plan.fewer if fewer else (None, 0))
        if clustered is not None:
            if common_only:
                return clustered.common(*cluster_args, steps)
            clustered(*cluster_args, steps)
            return True
    stream = current_stream_key(torch, q)  # None in a capture
    o_parts = stream_scratch(torch, q, plan.parts_shape, torch.float32, stream)
    l_parts = stream_scratch(torch, q, plan.parts_shape[:3], torch.float32, stream)
    if plan.last is not None and not (plan.last_block == "eager" and stream is None):
        args = (q.view(plan.q_rows), *kv, o_parts, l_parts, out.view(plan.q_rows), l_out,
                arrival_counters(torch, q, plan.counters, stream), scale, plan.steps)
        if common_only:
            return plan.last.common(*args)
        plan.last(*args)
        return True
    args = (q.view(plan.q_rows), *kv, o_parts, l_parts, scale, plan.steps)
    if common_only:
        if not plan.decode.common(*args):
            return False
    else:
        plan.decode(*args)
    parts, flat, d = plan.flat_parts
    plan.combine(o_parts.view(plan.flat_parts), l_parts.view(parts, flat), out.view(flat, d),
                 l_parts.view(-1) if lse is None else lse.view(flat))
    return True


class _Plan:
    """attention_decode_launch's launches for one shape: the two kernels bound to their grids, the steps a part,
    q's shape as (B, H_kv, GROUP·Nq, D), the parts' output's shape (P·B, H_kv, GROUP·Nq, D) and as the combine reads
    it (P, B·H·Nq, D); on Hopper, attention_decode_cluster bound to its grid (`clustered`, with at most MAX_CLUSTER
    parts), taken where the GPU holds all its clusters at once (`together`, asked on the first call: a cluster's
    blocks share a GPC, so fewer may fit than blocks; a second wave would double the time), else outside graph
    captures (`fewer`: FEWER_PARTS) the same kernel over fewer parts, with its steps a part."""

    def __init__(self, decode: Any, combine: Any, steps: int, q_rows: tuple[int, int, int, int],
                 parts_shape: tuple[int, int, int, int], flat_parts: tuple[int, int, int]):
        self.decode, self.combine, self.steps = decode, combine, steps
        self.q_rows, self.parts_shape, self.flat_parts = q_rows, parts_shape, flat_parts
        self.clustered: Any = None
        self.together: bool | None = None
        self.fewer: tuple[Any, int] | None = None
        self.splits: Any = None  # on Hopper: c → attention_decode_cluster over c parts bound to its grid, its steps
        self.few_bytes = False   # K and V of at most FEWER_PARTS_BYTES
        # the path's switch (DECODE_LAST_BLOCK or DECODE_LAST_BLOCK_SM80; False above LAST_BLOCK_BYTES when "eager"),
        # and where it is on, attention_decode_last bound to the decode kernel's grid
        self.last_block: bool | str = False
        self.last: Any = None
        self.counters = 0        # the row tiles it counts arrivals of

    def decide(self, args: tuple[Any, ...]) -> None:
        """On the first call (`args` attention_decode_cluster's but the steps): does the GPU hold all clusters of
        the wave's parts (`together`), and if not, which fewer parts it does (`fewer`)."""
        x, y, z = self.clustered.grid
        self.together = x * y * z <= self.clustered.spec.resident_blocks(*args, self.steps)
        parts = self.flat_parts[0]
        if self.together or not (FEWER_PARTS and self.few_bytes) or self.last is not None:
            return
        # portable sizes only (each size asked about compiles a kernel on the shape's first call)
        for cluster in range(min(parts - 1, 8), max(1, ceil_div(parts, 2) - 1), -1):
            bound, steps = self.splits(cluster)
            x, y, z = bound.grid
            if x * y * z <= bound.spec.resident_blocks(*args, steps):
                self.fewer = bound, steps
                return


_PLANS: dict[tuple[Any, ...], _Plan] = {}  # attention_decode_launch's plans by shapes, dtype, target, ...
def _plan(q_shape: tuple[int, ...], k_shape: tuple[int, ...], dtype: Any, lse: bool, target: str | None, sms: int,
          hopper: bool, lengths: bool, paged: bool = False) -> _Plan:
    batch, heads, nq, d = q_shape
    kv_heads, nk = k_shape[1], k_shape[2]
    rows = heads // kv_heads * nq
    keys, stages, blocks_per_sm = (CONFIG if hopper else CONFIG_SM80)[d]
    tiles = ceil_div(rows, 16)
    units = batch * kv_heads * tiles
    slots = blocks_per_sm * sms
    if hopper and DECODE_IN_CLUSTERS and CLUSTER_PARTS:
        slots = min(slots, units * CLUSTER_PARTS)
    parts, steps = decode_parts(units, ceil_div(nk, 4 * keys), slots)
    dt = {**dtype_constant(dtype), **({"LENGTHS": 1} if lengths else {}), **({"PAGED": 1} if paged else {})}
    decode = attention_decode.specialize(D=d, KEYS=keys, STAGES=stages, **dt, target=target)
    combine = attention_decode_combine.specialize(LSE=int(lse), **dtype_constant(dtype), target=target)
    flat = batch * heads * nq
    plan = _Plan(decode[(parts * tiles, kv_heads, batch)], combine[(ceil_div(flat, 16), d // 32)], steps,
                 (batch, kv_heads, rows, d), (parts * batch, kv_heads, rows, d), (parts, flat, d))
    plan.last_block = DECODE_LAST_BLOCK if hopper else DECODE_LAST_BLOCK_SM80
    kv_bytes = 2 * batch * kv_heads * nk * d * dtype.itemsize
    if plan.last_block == "eager" and kv_bytes > LAST_BLOCK_BYTES:
        plan.last_block = False
    if plan.last_block:
        plan.last = attention_decode_last.specialize(D=d, KEYS=keys, STAGES=stages, LSE=int(lse), **dt,
                                                     target=target)[(parts * tiles, kv_heads, batch)]
        plan.counters = units
    if hopper and DECODE_IN_CLUSTERS:
        def split(cluster: int) -> tuple[Any, int]:  # attention_decode_cluster over at most `cluster` parts
            parts, steps = decode_parts(units, ceil_div(nk, 4 * keys), units * cluster)
            spec = attention_decode_cluster.specialize(D=d, KEYS=keys, STAGES=stages, CLUSTER=parts, LSE=int(lse),
                                                       **dt, target=target)
            return spec[(tiles * parts, kv_heads, batch)], steps

        plan.splits, plan.few_bytes = split, kv_bytes <= FEWER_PARTS_BYTES
        if parts <= MAX_CLUSTER:
            plan.clustered = split(parts)[0]
    return plan
