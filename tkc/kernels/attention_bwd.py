"""Attention backward (FlashAttention-2 style, without atomics): given O = softmax(scale · Q·Kᵀ)·V, the output's
gradient dO and each query row's log-sum-exp L, the gradients dQ, dK and dV.

With P = exp(scale · Q·Kᵀ - L) (the forward's probabilities, recomputed a block at a time from L) and
Δ_i = Σ_d dO_id · O_id = Σ_j P_ij · dP_ij:

    dV = Pᵀ·dO        dP = dO·Vᵀ        dS = P ∘ (dP - Δ)        dQ = scale · dS·K        dK = scale · dSᵀ·Q

Three kernels: attention_bwd_delta (Δ), attention_bwd_dkdv (a block per 64 keys, looping over the queries: it
computes everything transposed, Sᵀ = K·Qᵀ, so that Pᵀ and dSᵀ come out of the tensor cores in the layout the next
product takes), attention_bwd_dq (a block per 64 queries, looping over the keys, like the forward). Each key block
and each query block is owned by one block: no atomics, P recomputed twice. On Hopper attention_bwd_dkdv_sm90 and
attention_bwd_dq_sm90 do the same with wgmma (each warpgroup's operands read once from shared memory, where the
mma.sync kernels' warps each read all of them: those are bound by shared memory bandwidth). attention_bwd_sm90
takes five products a step for the two kernels' seven: dK, dV and dQ by atomics (TMA reductions into an f32 sum);
right, but on the H200 3-8 % slower than the two at B·N = 16384 (not the reductions' bytes, 7-12 %: the block
barriers around dSᵀ in shared memory and the dQ wgmma's wait; RESULTS "attention backward probe — 2026-12-04
21:38"), so attention_backward does not use it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import tkc
from tkc.kernels._checks import cdiv as ceil_div  # `cdiv` is the DSL's, for kernels
from tkc.kernels._checks import check_like, check_tensor, dtype_constant, fail, multiprocessors, wgmma_path
from tkc.kernels.attention import check_qkv, group_constant, kv_head, sm80_stages
from tkc.lang import *  # noqa: F403

if TYPE_CHECKING:
    import torch


@tkc.kernel(warps=4, min_target="sm_80")
def attention_bwd_delta(O: gl["DT", 4], dO: gl["DT", 4], dL: gl[f32, 3], Delta: gl[f32, 3], D: const = 64,
                        WITH_DL: const = 0, DT: const = bf16):
    """Δ (B, H, N) = the row sums of dO ∘ O, less the log-sum-exp's gradient dL with WITH_DL (∂L_i/∂S_ij = P_ij, so
    it adds P ∘ dL to dS). Grid: (N / 64, H, B); each warp takes 16 rows."""
    blk, h, b = block_idx()
    tile = blk * 4 + warp_id()
    o = load(O, (b, h, tile, 0), rt[DT, 16, D]).to(f32)
    do = load(dO, (b, h, tile, 0), rt[DT, 16, D]).to(f32)
    delta = row_sum(o * do)
    if WITH_DL:
        delta = delta - load(dL, (b, h, tile), rv[f32, 16])
    store(Delta, delta, (b, h, tile))


@tkc.func
def operand(tile, wgmma):
    """A shared tile as an mma operand: as it is for wgmma (which reads shared memory), else loaded into registers
    (ldmatrix) for mma.sync."""
    if wgmma:
        return tile
    return load(tile)


@tkc.func
def warp_rows(tile, in_shared, d, dt):
    """This warp's 16 rows of a block's tile waiting in shared memory (`in_shared`), or `tile` itself."""
    if in_shared:
        return load(tile, (warp_id(), 0), rt[dt, 16, d])
    return tile


@tkc.func
def scores_t(k, q_s, kv_in_shared, wgmma, d, dt):
    """Sᵀ = K·Qᵀ of a warp's 16 keys over one step of queries (a row per key, a column per query)."""
    return mma_ABt(warp_rows(k, kv_in_shared, d, dt), operand(q_s, wgmma), zeros(rt[f32, 16, q_s.shape[0]]))


@tkc.func
def columns(tile, part, cols, dt):
    """Columns part·cols .. (part + 1)·cols of a shared tile (the tile itself where cols is 0 or all of them)."""
    if not cols or cols == tile.shape[1]:
        return tile
    return load(tile, (0, part), st[dt, tile.shape[0], cols])


@tkc.func
def column_part(blk, d, cols):
    """A block's index along the grid's x where D / `cols` blocks in a row take the same keys or queries, each
    summing `cols` columns of their gradients (0: all of D): (its key or query block, which columns in units of
    cols, cols)."""
    cols = cols or d
    static_assert(cols == d or d % cols == 0 and cols % 64 == 0, f"COLS ({cols}) must be a multiple of 64 dividing D")
    if cols < d:
        return blk // (d // cols), blk % (d // cols), cols
    return blk, 0, cols


@tkc.func
def probabilities_t(s_t, lse_log2, scale_log2, diagonal, causal, queries, ragged):
    """Pᵀ of a warp's 16 keys over one step of queries from their scores Sᵀ (query c sees key r iff c >= r +
    diagonal; with `ragged`, only the first `queries` columns are queries)."""
    if ragged:  # the last step's columns past Nq (zeros read past the end, with an L of 0: no P for them)
        s_t = keep_cols(s_t, queries)
    if causal:  # every step (a no-op before the diagonal): a branch around it costs ptxas ~90 registers
        s_t = triu(s_t, diagonal, -math.inf)
    return exp2(sub_col(s_t * scale_log2, lse_log2))


@tkc.func
def dkdv_step(s_t, v, q_s, do_s, lse_log2, delta, dk, dv, scale_log2, diagonal, causal, queries, ragged,
              kv_in_shared, wgmma, d, dt, part=0, cols=0, scores_first=0):
    """dK and dV of a warp's 16 keys over one step of queries from its scores Sᵀ, everything transposed (query c
    sees key r iff c >= r + diagonal; with `ragged`, only the first `queries` columns are queries):
    dV += Pᵀ·dO, dK += dSᵀ·Q (without the scale); also returns dSᵀ (in `dt`). With `cols` < D, dK and dV are their
    columns part·cols .. (part + 1)·cols (Sᵀ and dPᵀ take all of D). With `scores_first`, dPᵀ before the softmax (both
    products of scores first, the two of gradients last, as defer-wgmma wants them: DEFER=1)."""
    if scores_first:
        dp_t = mma_ABt(warp_rows(v, kv_in_shared, d, dt), operand(do_s, wgmma), zeros(rt[f32, 16, q_s.shape[0]]))
    p_t = probabilities_t(s_t, lse_log2, scale_log2, diagonal, causal, queries, ragged)
    dv = mma_AB(p_t.to(dt), operand(columns(do_s, part, cols, dt), wgmma), dv)
    if not scores_first:
        dp_t = mma_ABt(warp_rows(v, kv_in_shared, d, dt), operand(do_s, wgmma), zeros(rt[f32, 16, q_s.shape[0]]))
    ds_t = (p_t * sub_col(dp_t, delta)).to(dt)
    return mma_AB(ds_t, operand(columns(q_s, part, cols, dt), wgmma), dk), dv, ds_t


@tkc.func
def dq_step(q, do, k_s, v_s, lse_log2, delta, dq, scale_log2, diagonal, causal, keys, ragged, wgmma, dt, part=0,
            cols=0, scores_first=0):
    """dQ of a warp's 16 queries over one step of keys (query r sees key c iff c <= r + diagonal; with `ragged`, only
    the first `keys` columns are keys): dQ += dS·K (without the scale); with `cols` < D, dQ's columns
    part·cols .. (part + 1)·cols. With `scores_first`, dP before the softmax (both products of scores first, as
    defer-wgmma wants them)."""
    s = mma_ABt(q, operand(k_s, wgmma), zeros(rt[f32, 16, k_s.shape[0]]))
    if scores_first:
        dp = mma_ABt(do, operand(v_s, wgmma), zeros(rt[f32, 16, k_s.shape[0]]))
    if ragged:  # the last step's keys past Nk
        s = keep_cols(s, keys)
    if causal:  # every step, as in dkdv_step
        s = tril(s, diagonal, -math.inf)
    p = exp2(sub_row(s * scale_log2, lse_log2))
    if not scores_first:
        dp = mma_ABt(do, operand(v_s, wgmma), zeros(rt[f32, 16, k_s.shape[0]]))
    ds = p * sub_row(dp, delta)
    return mma_AB(ds.to(dt), operand(columns(k_s, part, cols, dt), wgmma), dq)


@tkc.func
def block_heads(h, b, batch, group, split):
    """A dK/dV block's heads from its grid index h (a K/V head, times `split` with split > 1: each of its parts
    takes group / split of the query heads that read it): (its K/V head, the first query head it loops over, how
    many, and the index along dK/dV's first dimension it stores at: b, or with split > 1 part·batch + b, its part's
    partial sums, which attention_bwd_sum_parts adds up)."""
    if split == 1:
        if group == 1:
            return h, h, 1, b
        return h, h * group, group, b
    heads = group // split
    return h // split, h // split * group + h % split * heads, heads, h % split * batch + b


@tkc.func
def group_steps_end(first, steps, heads):
    """The end of a run-time loop over query steps first .. steps - 1 of each of `heads` query heads that share a
    K/V head, one head after the other (one loop, so that its pipeline runs on from one head into the next)."""
    if heads == 1:
        return steps
    return first + heads * (steps - first)


@tkc.func
def group_step(i, first, steps, first_head, heads):
    """Step i of that loop: (its query head, its query step)."""
    if heads == 1:
        return first_head, i
    g = (i - first) // (steps - first)
    return first_head + g, i - g * (steps - first)


@tkc.func
def query_step(Q, dO, L, Delta, b, i, first, steps, first_head, heads, queries, d, dt):
    """Step i of a dK/dV block's loop over the queries (group_step): (its query step j, the step's Q and dO in shared
    memory, its rows' L · log2(e) and Δ)."""
    hq, j = group_step(i, first, steps, first_head, heads)
    q_s, do_s = load(Q, (b, hq, j, 0), st[dt, queries, d]), load(dO, (b, hq, j, 0), st[dt, queries, d])
    return j, q_s, do_s, load(L, (b, hq, j), rv[f32, queries]) * LOG2E, load(Delta, (b, hq, j), rv[f32, queries])


@tkc.func
def dq_rows(K, V, L, Delta, dQ, q, do, b, h, blk, scale, d, causal, keys, warps, ragged, wgmma, dt, group, part=0,
            cols=0, scores_first=0):
    """dQ of the block's query block `blk` of head h (each warp its 16 rows; q, do: the warp's rows in registers, or
    with `wgmma` its warpgroup's in shared memory): the loop over the keys of head kv_head(h, group), KEYS a step,
    then the store; with `cols` < D, dQ's columns part·cols .. (part + 1)·cols."""
    q_tile = blk * warps + warp_id()
    lse_log2 = load(L, (b, h, q_tile), rv[f32, 16]) * LOG2E
    delta = load(Delta, (b, h, q_tile), rv[f32, 16])
    scale_log2 = scale * LOG2E
    dq = zeros(rt[f32, 16, cols or d])
    n_blocks = cdiv((blk + 1) * 16 * warps, keys) if causal else cdiv(K.shape[2], keys)
    kv_h = kv_head(h, group)
    for j in range(n_blocks):
        k_s, v_s = load(K, (b, kv_h, j, 0), st[dt, keys, d]), load(V, (b, kv_h, j, 0), st[dt, keys, d])
        dq = dq_step(q, do, k_s, v_s, lse_log2, delta, dq, scale_log2, q_tile * 16 - j * keys, causal,
                     K.shape[2] - j * keys, ragged, wgmma, dt, part, cols, scores_first)
    store(dQ, (dq * scale).to(dt), (b, h, q_tile, part))


@tkc.kernel(warps="WARPS", stages="STAGES", min_target="sm_80")
def attention_bwd_dkdv(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], dO: gl["DT", 4], L: gl[f32, 3],
                       Delta: gl[f32, 3], dK: gl["DT", 4], dV: gl["DT", 4], scale: float, D: const = 64,
                       CAUSAL: const = 0, QUERIES: const = 64, KV_IN_SHARED: const = 0, WARPS: const = 4,
                       RAGGED: const = 0, DT: const = bf16, GROUP: const = 1, SPLIT: const = 1, COLS: const = 0,
                       STAGES: const = 3):
    """dK and dV of 16·WARPS keys a block. Grid: (Nk / (16·WARPS) · D / COLS, H / GROUP · SPLIT, B): a head of K and V,
    whose gradients sum over the GROUP query heads that read it (grouped-query attention); with SPLIT > 1 each of
    SPLIT blocks takes GROUP / SPLIT of them and stores its partial sums at dK[part·B + b] (dK and dV of SPLIT·B
    rows). Each warp keeps its 16 keys' K and V and the sums dK, dV in registers (KV_IN_SHARED: K and V wait in
    shared memory and each step reads the warp's rows, which leaves room in registers at D=128); the block streams
    the queries, dO, L and Δ QUERIES at a time. Causal (Nq = Nk): key j is seen by queries i >= j, so the loop starts
    at the block's diagonal. RAGGED: Nq is not a multiple of QUERIES (the last step's columns past it are masked;
    keys past Nk read zeros and are not stored). COLS as in attention_bwd_dkdv_sm90 (D = 256: dK and dV in halves,
    each block all of Sᵀ and dPᵀ). STAGES: the depth of its cp.async pipeline (D = 256: two on a card of 99 KB)."""
    static_assert(D in (32, 64, 96, 128, 256), f"head dim D must be 32, 64, 96, 128 or 256, got {D}")
    static_assert(GROUP % SPLIT == 0, f"SPLIT ({SPLIT}) must divide GROUP ({GROUP})")
    x, block_y, b = block_idx()
    blk, part, cols = column_part(x, D, COLS)
    h, first_head, heads, out_b = block_heads(block_y, b, Q.shape[0], GROUP, SPLIT)
    k_tile = blk * WARPS + warp_id()                         # this warp's keys, in tiles of 16
    if KV_IN_SHARED:
        k, v = load(K, (b, h, blk, 0), st[DT, 16 * WARPS, D]), load(V, (b, h, blk, 0), st[DT, 16 * WARPS, D])
    else:
        k, v = load(K, (b, h, k_tile, 0), rt[DT, 16, D]), load(V, (b, h, k_tile, 0), rt[DT, 16, D])
    scale_log2 = scale * LOG2E                               # exp(x·scale - L) = exp2(x·scale_log2 - L·LOG2E)
    dk, dv = zeros(rt[f32, 16, cols]), zeros(rt[f32, 16, cols])
    first = blk * 16 * WARPS // QUERIES if CAUSAL else 0     # query blocks before it see none of the block's keys
    steps = cdiv(Q.shape[2], QUERIES)
    for i in range(first, group_steps_end(first, steps, heads)):
        j, q_s, do_s, lse_log2, delta = query_step(Q, dO, L, Delta, b, i, first, steps, first_head, heads, QUERIES,
                                                   D, DT)
        dk, dv, _ = dkdv_step(scores_t(k, q_s, KV_IN_SHARED, 0, D, DT), v, q_s, do_s, lse_log2, delta, dk, dv,
                              scale_log2, k_tile * 16 - j * QUERIES, CAUSAL, Q.shape[2] - j * QUERIES, RAGGED,
                              KV_IN_SHARED, 0, D, DT, part, cols)
    store(dK, (dk * scale).to(DT), (out_b, h, k_tile, part))
    store(dV, dv.to(DT), (out_b, h, k_tile, part))


@tkc.kernel(warps=4, min_target="sm_80")
def attention_bwd_sum_parts(Parts: gl["DT", 3], Out: gl["DT", 2], D: const = 128, DT: const = bf16):
    """Out = Parts[0] + Parts[1] + ... (f32 sums, DT out): dK or dV from the SPLIT parts' partial sums, as
    (SPLIT, B·H_kv·Nk, D) and (B·H_kv·Nk, D). Grid: (cdiv(B·H_kv·Nk, 64),); each warp adds 16 rows."""
    tile = block_idx()[0] * 4 + warp_id()
    total = load(Parts, (0, tile, 0), rt[f32, 16, D])
    for part in range(1, Parts.shape[0]):
        total = total + load(Parts, (part, tile, 0), rt[f32, 16, D])
    store(Out, total.to(DT), (tile, 0))


@tkc.kernel(warps="WARPS", blocks_per_sm="BLOCKS", min_target="sm_80")
def attention_bwd_dq(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], dO: gl["DT", 4], L: gl[f32, 3],
                     Delta: gl[f32, 3], dQ: gl["DT", 4], scale: float, D: const = 64, CAUSAL: const = 0,
                     KEYS: const = 64, WARPS: const = 4, RAGGED: const = 0, DT: const = bf16, GROUP: const = 1,
                     BLOCKS: const = 0, COLS: const = 0):
    """dQ of 16·WARPS queries a block. Grid: (Nq / (16·WARPS) · D / COLS, H, B); K and V's head h // GROUP. Each warp
    keeps its 16 queries' Q, dO, L, Δ and the sum dQ in registers; the block streams K and V KEYS keys at a time
    (causal: up to the block's diagonal, the longest blocks first). RAGGED: Nk is not a multiple of KEYS (the last
    step's keys past it are masked). BLOCKS as in attention_bwd_dkdv_sm90. COLS (0: all of D): the columns of dQ a
    block sums, D / COLS blocks next to each other in the grid's x taking the same queries (D = 256: in halves, each
    block all of S and dP)."""
    static_assert(D in (32, 64, 96, 128, 256), f"head dim D must be 32, 64, 96, 128 or 256, got {D}")
    x, h, b = block_idx()
    blk, part, cols = column_part(x, D, COLS)
    if CAUSAL:
        blk = num_blocks()[0] // (D // cols) - 1 - blk
    q_tile = blk * WARPS + warp_id()
    q, do = load(Q, (b, h, q_tile, 0), rt[DT, 16, D]), load(dO, (b, h, q_tile, 0), rt[DT, 16, D])
    dq_rows(K, V, L, Delta, dQ, q, do, b, h, blk, scale, D, CAUSAL, KEYS, WARPS, RAGGED, 0, DT, GROUP, part, cols)


@tkc.func
def panel_tile(j, queries, row_panel):
    """The 16-row tile of dQ that this warp adds of its warpgroup's panel in query step j."""
    return j * (queries // 16) + row_panel * 4 + warp_id() % 4


@tkc.func
def dkdv_block(Q, K, V, dO, L, Delta, dK, dV, dQ_sum, scale, d, causal, queries, warps, ragged, with_dq, defer,
               ds_buffers, dt, group, split, cols=0, scores_first=0):
    """The wgmma dK/dV kernels' block: 16·`warps` keys (a warpgroup per 64), K and V in shared memory, the loop over
    the queries (TMA streams Q and dO), the stores. With `with_dq`, each step's dSᵀ also goes through shared memory
    into dQ += dS·K (one more product, A = dSᵀ read transposed), added into the f32 dQ_sum by atomics. The loop
    runs over the queries of the `group` query heads that read the block's head of K and V (or its part of them,
    `split`: block_heads), one after the other. With `cols` < D, the block sums only those columns of dK and dV
    (D = 256: both whole would take 256 registers a thread): D / cols blocks in a row of the grid take the same
    keys, each its columns, each computing all of Sᵀ and dPᵀ. `scores_first` as in dkdv_step."""
    static_assert(d in (64, 96, 128, 256), f"head dim D must be 64, 96, 128 or 256, got {d}")
    static_assert(not (scores_first and with_dq), "the dK/dV products after the scores' take no dQ product")
    static_assert(group == 1 or not with_dq, "dQ by atomics takes one query head a K/V head (GROUP = 1)")
    static_assert(group % split == 0, f"SPLIT ({split}) must divide GROUP ({group})")
    static_assert(not cols or cols == d or not with_dq, "dQ by atomics takes dK and dV whole (COLS = 0)")
    if with_dq:  # the grid's x is the head: the blocks running at once add into different heads' rows of dQ_sum
        h, blk, b = block_idx()
        first_head, heads, out_b = h, 1, b
    else:
        blk, block_y, b = block_idx()
        h, first_head, heads, out_b = block_heads(block_y, b, Q.shape[0], group, split)
    blk, part, cols = column_part(blk, d, cols)
    k_block = load(K, (b, h, blk, 0), st[dt, 16 * warps, d])
    v_block = load(V, (b, h, blk, 0), st[dt, 16 * warps, d])
    k, v = load(k_block, (warpgroup_id(), 0), st[dt, 64, d]), load(v_block, (warpgroup_id(), 0), st[dt, 64, d])
    k_tile = blk * warps + warp_id()
    scale_log2 = scale * LOG2E
    dk, dv = zeros(rt[f32, 16, cols]), zeros(rt[f32, 16, cols])
    first = blk * 16 * warps // queries if causal else 0
    steps = cdiv(Q.shape[2], queries)
    # each warpgroup one 64×64 panel of the block's dQ (queries × columns) over all the block's keys: one add an
    # element (D=128: the two halves of the columns; D=64 with 128-query steps: of the rows)
    panel = queries // 64 * (d // 64) == warps // 4
    row_panel, col_panel = warpgroup_id() // (d // 64), warpgroup_id() % (d // 64)
    if defer:
        dq = zeros(rt[f32, 16, 64])  # the step before's panel (none before the first)
    for i in range(first, group_steps_end(first, steps, heads)):
        j, q_s, do_s, lse_log2, delta = query_step(Q, dO, L, Delta, b, i, first, steps, first_head, heads, queries,
                                                   d, dt)
        s_t = scores_t(k, q_s, 0, 1, d, dt)
        if defer:  # the step before's dQ panel, added once this step's Sᵀ is in (its wgmma ran on until then)
            atomic_add(dQ_sum, dq, (b, h, panel_tile(j - 1, queries, row_panel), col_panel))
        dk, dv, ds_t = dkdv_step(s_t, v, q_s, do_s, lse_log2, delta, dk, dv, scale_log2, k_tile * 16 - j * queries,
                                 causal, Q.shape[2] - j * queries, ragged, 0, 1, d, dt, part, cols, scores_first)
        if with_dq:  # dSᵀ (the block's keys × the step's queries) is A of dQ's product, read transposed
            ds_s = store(empty(st[dt, 16 * warps, queries], buffers=ds_buffers), ds_t, (warp_id(), 0))
            if panel:
                dq_panel = mma_AtB(load(ds_s, (0, row_panel), st[dt, 16 * warps, 64]),
                                   load(k_block, (0, col_panel), st[dt, 16 * warps, 64]), zeros(rt[f32, 16, 64]))
                if defer:
                    dq = dq_panel
                else:
                    atomic_add(dQ_sum, dq_panel, (b, h, panel_tile(j, queries, row_panel), col_panel))
            else:  # each warpgroup its own 64 keys' part (64-query steps)
                dq_keys = mma_AtB(load(ds_s, (warpgroup_id(), 0), st[dt, 64, queries]), k, zeros(rt[f32, 16, d]))
                atomic_add(dQ_sum, dq_keys, (b, h, j * (queries // 16) + warp_id() % 4, 0))
    if defer:
        atomic_add(dQ_sum, dq, (b, h, panel_tile(steps - 1, queries, row_panel), col_panel))
    store(dK, (dk * scale).to(dt), (out_b, h, k_tile, part))
    store(dV, dv.to(dt), (out_b, h, k_tile, part))


@tkc.func
def dkdv_block_halves(Q, K, V, dO, L, Delta, dK, dV, scale, d, causal, queries, ragged, dt, group, split, buffers,
                      by_product=0):
    """dkdv_block's block for D = 256 with two warpgroups on the same 64 keys, each summing one half of dK's and dV's
    columns: each computes its half of the sums in Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (over its 128 of D), the two pass
    their partial sums to each other through shared memory and add them (f32 addition commutes: both get the same
    Pᵀ and dSᵀ), then dV += Pᵀ·dO and dK += dSᵀ·Q over its columns. Four products' work a step where two blocks of one
    warpgroup, each all of Sᵀ and dPᵀ (COLS = 128), take six. `buffers`: of the shared tiles the partial sums pass
    through (2: one barrier a step, 1: two). With `by_product` (HALVES=2), warpgroup 0 computes all of Sᵀ and 1 all of
    dPᵀ (over all of D) and each reads both from one shared tile: half the bytes of the partial sums, no additions."""
    blk, block_y, b = block_idx()
    h, first_head, heads, out_b = block_heads(block_y, b, Q.shape[0], group, split)
    half, cols = warpgroup_id(), d // 2
    k_all, v_all = load(K, (b, h, blk, 0), st[dt, 64, d]), load(V, (b, h, blk, 0), st[dt, 64, d])
    if not by_product:  # each warpgroup its half of D's columns of K and V
        k, v = columns(k_all, half, cols, dt), columns(v_all, half, cols, dt)
    row = warp_id() % 4                                      # this warp's 16 of the block's keys
    k_tile = blk * 4 + row
    scale_log2 = scale * LOG2E
    dk, dv = zeros(rt[f32, 16, cols]), zeros(rt[f32, 16, cols])
    first = blk * 64 // queries if causal else 0
    steps = cdiv(Q.shape[2], queries)
    for i in range(first, group_steps_end(first, steps, heads)):
        j, q_s, do_s, lse_log2, delta = query_step(Q, dO, L, Delta, b, i, first, steps, first_head, heads, queries,
                                                   d, dt)
        q_half, do_half = columns(q_s, half, cols, dt), columns(do_s, half, cols, dt)
        if by_product:  # warpgroup 0 all of Sᵀ, 1 all of dPᵀ; each reads both from the shared tile (no selects)
            if half == 0:
                own = mma_ABt(k_all, q_s, zeros(rt[f32, 16, queries]))
            else:
                own = mma_ABt(v_all, do_s, zeros(rt[f32, 16, queries]))
            both = store(empty(st[f32, 128, queries], buffers=buffers), own, (warp_id(), 0), conflicts=2)
            s_t = load(both, (row, 0), rt[f32, 16, queries], conflicts=2)
            dp_t = load(both, (row + 4, 0), rt[f32, 16, queries], conflicts=2)
        else:
            s_part = mma_ABt(k, q_half, zeros(rt[f32, 16, queries]))
            dp_part = mma_ABt(v, do_half, zeros(rt[f32, 16, queries]))
            # warp w's partial sums at rows 16·w; the other warpgroup's warp on the same keys reads them (f32 rows of
            # 128 bytes: 2-way bank conflicts, a few hundred bytes a warp a step)
            s_parts = store(empty(st[f32, 128, queries], buffers=buffers), s_part, (warp_id(), 0), conflicts=2)
            dp_parts = store(empty(st[f32, 128, queries], buffers=buffers), dp_part, (warp_id(), 0), conflicts=2)
            other = (warp_id() + 4) % 8                      # (a + b = b + a in f32: both get the same sums)
            s_t = s_part + load(s_parts, (other, 0), rt[f32, 16, queries], conflicts=2)
            dp_t = dp_part + load(dp_parts, (other, 0), rt[f32, 16, queries], conflicts=2)
        rest = Q.shape[2] - j * queries                      # the step's queries (ragged: the last one fewer)
        p_t = probabilities_t(s_t, lse_log2, scale_log2, k_tile * 16 - j * queries, causal, rest, ragged)
        dv = mma_AB(p_t.to(dt), do_half, dv)
        dk = mma_AB((p_t * sub_col(dp_t, delta)).to(dt), q_half, dk)
    store(dK, (dk * scale).to(dt), (out_b, h, k_tile, half))
    store(dV, dv.to(dt), (out_b, h, k_tile, half))


@tkc.kernel(warps="WARPS", stages="STAGES", producer="PRODUCER", blocks_per_sm="BLOCKS", defer="DEFER",
            split_ring="SPLIT_RING", min_target="sm_90a")
def attention_bwd_dkdv_sm90(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], dO: gl["DT", 4], L: gl[f32, 3],
                            Delta: gl[f32, 3], dK: gl["DT", 4], dV: gl["DT", 4], scale: float, D: const = 128,
                            CAUSAL: const = 0, QUERIES: const = 64, WARPS: const = 8, STAGES: const = 2,
                            PRODUCER: const = 0, RAGGED: const = 0, DT: const = bf16, GROUP: const = 1,
                            SPLIT: const = 1, BLOCKS: const = 0, COLS: const = 0, HALVES: const = 0,
                            EXCHANGE_BUFFERS: const = 2, DEFER: const = 0, SPLIT_RING: const = 0):
    """attention_bwd_dkdv on Hopper's wgmma (GROUP and SPLIT as there): a block per 16·WARPS keys (a warpgroup per 64),
    K and V in shared memory, Q and dO streamed by TMA; Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ from shared memory, dV += Pᵀ·dO and dK
    += dSᵀ·Q with Pᵀ and dSᵀ from registers. Grid: (Nk / (16·WARPS) · D / COLS, H, B). PRODUCER=1 adds a warpgroup that
    issues the TMA loads (specialize-warps). RAGGED as in attention_bwd_dkdv. BLOCKS asks ptxas to fit that many blocks
    on a multiprocessor (0: its choice). COLS (0: all of D): the columns of dK and dV a block sums, D / COLS blocks
    next to each other in the grid's x taking the same keys (D = 256: dK and dV in halves). HALVES=1 (D = 256, WARPS
    = 8): instead two warpgroups a block on the same 64 keys, each one half of the columns (dkdv_block_halves); grid
    (Nk / 64, H, B); HALVES=2: warpgroup 0 computes all of Sᵀ, 1 all of dPᵀ, each reads both (by_product there);
    EXCHANGE_BUFFERS: of the tiles the sums pass through. DEFER=1 issues each step's dV and dK products in the next
    step, behind its Sᵀ and dPᵀ (parts) (`defer-wgmma`): they run while the warpgroups exponentiate (and exchange),
    which otherwise leaves the tensor cores idle. SPLIT_RING=1: Q and dO (and L, Δ) with barriers of their own, each
    step k - 1's stages released once step k's Sᵀ is in (one ring released so at D = 64: dK/dV 4-11 % faster, at
    D = 128 slower; RESULTS "early releases in one ring")."""
    if HALVES:
        static_assert(HALVES in (1, 2), f"HALVES must be 0, 1 (partial sums) or 2 (by product), got {HALVES}")
        static_assert(D == 256 and WARPS == 8 and not COLS, "HALVES takes D = 256, WARPS = 8 and COLS = 0")
        dkdv_block_halves(Q, K, V, dO, L, Delta, dK, dV, scale, D, CAUSAL, QUERIES, RAGGED, DT, GROUP, SPLIT,
                          EXCHANGE_BUFFERS, HALVES == 2)
    else:
        dkdv_block(Q, K, V, dO, L, Delta, dK, dV, 0, scale, D, CAUSAL, QUERIES, WARPS, RAGGED, 0, 0, 1, DT, GROUP,
                   SPLIT, COLS, DEFER)


@tkc.kernel(warps="WARPS", stages="STAGES", producer="PRODUCER", min_target="sm_90a")
def attention_bwd_sm90(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], dO: gl["DT", 4], L: gl[f32, 3],
                       Delta: gl[f32, 3], dK: gl["DT", 4], dV: gl["DT", 4], dQ_sum: gl[f32, 4], scale: float,
                       D: const = 128, CAUSAL: const = 0, QUERIES: const = 64, WARPS: const = 8, STAGES: const = 2,
                       PRODUCER: const = 0, RAGGED: const = 0, DEFER_DQ: const = 0, DS_BUFFERS: const = 1,
                       DT: const = bf16):
    """attention_bwd_dkdv_sm90 that also adds each step's dS·K into dQ_sum (f32 (B, H, Nq, D), zeroed before, without
    the scale; attention_bwd_dq_scale turns it into dQ): five products a step where the two kernels take seven.
    With two warpgroups and D=128, or D=64 with QUERIES=128, each warpgroup adds one 64×64 panel of the block's dQ
    over all its keys (fewer bytes than each adding its own keys' part). DEFER_DQ=1 adds each step's dQ in the next
    step, once that step's Sᵀ is in: its wgmma runs on beside the next step's instead of being waited for at once
    (which also waited for the step's dV and dK products). DS_BUFFERS=2 gives dSᵀ two shared buffers that the steps
    take in turn: no write-after-read barrier before each step's store. Grid: (H, Nk / (16·WARPS), B)."""
    static_assert(QUERIES == 64 or QUERIES // 64 * (D // 64) == WARPS // 4,
                  f"QUERIES must be 64, or split with D into a 64×64 panel of dQ a warpgroup, got {QUERIES}")
    static_assert(not DEFER_DQ or QUERIES // 64 * (D // 64) == WARPS // 4,
                  "DEFER_DQ needs a 64×64 panel of dQ a warpgroup (QUERIES // 64 · D // 64 = WARPS // 4)")
    dkdv_block(Q, K, V, dO, L, Delta, dK, dV, dQ_sum, scale, D, CAUSAL, QUERIES, WARPS, RAGGED, 1, DEFER_DQ,
               DS_BUFFERS, DT, 1, 1)


@tkc.kernel(warps=4, min_target="sm_80")
def attention_bwd_dq_scale(dQ_sum: gl[f32, 4], dQ: gl["DT", 4], scale: float, D: const = 128, DT: const = bf16):
    """dQ = scale · dQ_sum in DT. Grid: (Nq / 64, H, B); each warp takes 16 rows."""
    blk, h, b = block_idx()
    tile = blk * 4 + warp_id()
    store(dQ, (load(dQ_sum, (b, h, tile, 0), rt[f32, 16, D]) * scale).to(DT), (b, h, tile, 0))


@tkc.kernel(warps="WARPS", stages="STAGES", producer="PRODUCER", blocks_per_sm="BLOCKS", defer="DEFER",
            split_ring="SPLIT_RING", min_target="sm_90a")
def attention_bwd_dq_sm90(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], dO: gl["DT", 4], L: gl[f32, 3],
                          Delta: gl[f32, 3], dQ: gl["DT", 4], scale: float, D: const = 128, CAUSAL: const = 0,
                          KEYS: const = 64, WARPS: const = 8, STAGES: const = 2, PRODUCER: const = 0,
                          RAGGED: const = 0, DT: const = bf16, GROUP: const = 1, BLOCKS: const = 0,
                          DEFER: const = 0, SPLIT_RING: const = 0):
    """attention_bwd_dq on Hopper's wgmma: a block per 16·WARPS queries (a warpgroup per 64), Q and dO in shared
    memory, K and V streamed by TMA; S = Q·Kᵀ and dP = dO·Vᵀ from shared memory, dQ += dS·K with dS from registers.
    Grid: (Nq / (16·WARPS), H, B). PRODUCER and BLOCKS as in attention_bwd_dkdv_sm90, RAGGED and GROUP as in
    attention_bwd_dq. DEFER=1: S and dP first, each step's dQ product run in the next step under its softmax.
    SPLIT_RING=1: K and V with barriers of their own, V's stage released once dP = dO·Vᵀ is done, K's (read by the
    dQ product, which runs on into the next step) once the next step's S is in."""
    static_assert(D in (64, 96, 128, 256), f"head dim D must be 64, 96, 128 or 256, got {D}")
    blk, h, b = block_idx()
    if CAUSAL:
        blk = num_blocks()[0] - 1 - blk
    q_block = load(Q, (b, h, blk, 0), st[DT, 16 * WARPS, D])
    do_block = load(dO, (b, h, blk, 0), st[DT, 16 * WARPS, D])
    q, do = load(q_block, (warpgroup_id(), 0), st[DT, 64, D]), load(do_block, (warpgroup_id(), 0), st[DT, 64, D])
    dq_rows(K, V, L, Delta, dQ, q, do, b, h, blk, scale, D, CAUSAL, KEYS, WARPS, RAGGED, 1, DT, GROUP, 0, 0, DEFER)

# Per head dim: attention_bwd_dkdv's and attention_bwd_dq's constants, the fastest on the H200 of those ptxas fits
# in 255 registers a thread without spills (RESULTS "attention backward probe — 2026-12-04 17:05": D=64 dkdv
# 64-query steps 463-488 µs vs 582-598 with 32, B·N = 16384, H = 16 / 4; D=128 with K and V in shared memory
# 886 µs vs 1098 in registers with 64-query steps; eight warps a block no faster, 17:31).
CONFIG = {64: ({"QUERIES": 64}, {"KEYS": 64}), 128: ({"QUERIES": 32, "KV_IN_SHARED": 1}, {"KEYS": 32})}
CONFIG[32], CONFIG[96] = CONFIG[64], CONFIG[128]  # not swept: D = 96's dK/dV kernel at 246 registers, no spills
# D = 256 (not swept): dK, dV and dQ each in halves of 128 columns (whole, they would not fit 255 registers a thread),
# 16-query and 16-key steps: 244-253 and 255 registers, no spills; 112 and 48 KB (dK/dV 96 KB in two stages where the
# card has less: sm80_stages)
CONFIG[256] = ({"QUERIES": 16, "KV_IN_SHARED": 1, "COLS": 128}, {"KEYS": 16, "COLS": 128})
# On Hopper, the wgmma kernels' (RESULTS "attention backward probe — 2026-12-04 17:37", B=2 H=8 N=4096, µs not
# causal / causal): D=128 three stages, eight warps: dkdv 499 / 294 (two stages 652 / 349; the mma.sync kernel
# 884 / 549), dq 327 / 205 (591 / 371); D=64 dkdv four warps 379 / 217 (eight 533 / 267), dq three stages 162 / 133;
# D=64 dkdv with three stages 302 / 201 (two 385 / 217; "attention backward, dQ by atomics — 2026-12-04").
# D=64's dK/dV kernel asks ptxas for three blocks a multiprocessor (168 registers a thread, no spills): its causal
# and grouped builds took 172-180 registers, which fit two (RESULTS "attention backward, three dK/dV blocks a
# multiprocessor — 2026-12-05 19:04": causal +4-5 %, grouped causal +10 %, H100).
CONFIG_SM90 = {64: ({"WARPS": 4, "STAGES": 3, "BLOCKS": 3}, {"STAGES": 3}), 128: ({"STAGES": 3}, {"STAGES": 3})}
CONFIG_SM90[96] = CONFIG_SM90[128]  # not swept
# D = 256: dK and dV in halves of 128 columns (both whole would take 256 registers a thread): two warpgroups on the
# same 64 keys, each one half, warpgroup 0 computing all of Sᵀ and 1 all of dPᵀ and each reading both through one
# shared tile (HALVES=2), a lean producer warpgroup, 64-query steps in two stages (240 registers, no spills, 225 KB);
# dQ four warps, 64-key steps in two stages with a producer warpgroup and K and V in rings apart (SPLIT_RING: V's
# stage released once dP is done, K's once the next step's S is in). On an H100 (B=2 H=16 N=4096, µs not causal /
# causal): dkdv 2783 / 1437 against 3006-3062 / 1604-1622 with each warpgroup half of both sums added through shared
# memory (HALVES=1, 32-query steps in three stages; RESULTS "D = 256's dK/dV by product — 2026-12-06"), 3508 / 1924
# for two blocks of one warpgroup a key block, each all of Sᵀ and dPᵀ (COLS=128; "head dim 256 — 2026-12-05 21:30");
# dq 1306-1390 / 802-806 against 1632-1645 / 974-975 with one ring and no producer, 1615 / 949 with a producer alone,
# three stages of 48 keys 1432 / 862 ("the dQ kernel's rings apart — 2026-12-06"). At D <= 128 (three stages) rings
# apart are slower.
CONFIG_SM90[256] = ({"WARPS": 8, "HALVES": 2, "STAGES": 2, "QUERIES": 64, "PRODUCER": 2, "EXCHANGE_BUFFERS": 1},
                    {"WARPS": 4, "KEYS": 64, "STAGES": 2, "PRODUCER": 1, "SPLIT_RING": 1})


def tma_ready(*tensors: torch.Tensor) -> bool:
    """Can TMA read these (B, H, N, D) tensors: 16-byte aligned addresses and strides, the last dimension dense."""
    return all(t.data_ptr() % 16 == 0 and t.stride(3) == 1 and not (t.stride(0) | t.stride(1) | t.stride(2)) % 8
               for t in tensors)


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, grad_out: torch.Tensor,
                       lse: torch.Tensor, *, causal: bool = False, scale: float | None = None,
                       grad_lse: torch.Tensor | None = None,
                       target: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients (dq, dk, dv) of out = attention(q, k, v, causal=causal, scale=scale) given grad_out, the
    forward's `out` and its log-sum-exp `lse` (attention(..., return_lse=True)); with grad_lse, also through lse.
    bf16 or f16 tensors of one dtype, q, out and grad_out (B, H, Nq, D), k and v (B, H_kv, Nk, D) with H_kv dividing
    H (grouped-query attention: dk and dv sum over the query heads that read each K/V head), D ∈ {32, 64, 96, 128,
    256}, any Nq, Nk ≥ 1 (causal: Nq = Nk); lse float32 (B, H, Nq).
    On Hopper (or with target="sm_90a") at D = 64, 96, 128 or 256 the wgmma kernels, where the tensors' strides suit
    TMA (else, and with target="sm_80", the mma.sync kernels)."""
    import torch

    batch, heads, nq, nk, d = check_qkv(q, k, v)
    check_like("out", out, q)
    check_like("grad_out", grad_out, q)
    for name, t in (("lse", lse), ("grad_lse", grad_lse)):
        if t is not None:
            check_tensor(name, t, torch.float32, 3)
            if t.shape != q.shape[:3]:
                fail(f"{name}: expected shape {tuple(q.shape[:3])} (B, H, Nq), got {tuple(t.shape)}")
    if causal and nq != nk:
        fail(f"causal attention's backward needs Nq = Nk, got {nq} and {nk}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if nk == 0 and nq:
        fail("k: attention needs at least one key (Nk = 0)")
    if batch * heads * nq == 0:
        return dq, dk.zero_(), dv.zero_()  # no query sees the keys
    # Hopper: the wgmma kernels where TMA can read the operands; elsewhere (or with target="sm_80") the mma.sync ones,
    # built for sm_80 on every GPU (their sm_90a build, TMA rings instead of cp.async, is slower: RESULTS "attention
    # backward probe — 2026-12-04 17:05", dkdv at D=128 1294 vs 886 µs)
    if d in CONFIG_SM90 and wgmma_path(q.get_device(), target) and tma_ready(q, k, v, grad_out, dq, dk, dv):
        kernels, configs, warps, build = (attention_bwd_dkdv_sm90, attention_bwd_dq_sm90), CONFIG_SM90[d], 8, "sm_90a"
    else:
        kernels, configs, warps = (attention_bwd_dkdv, attention_bwd_dq), CONFIG[d], 4
        build = "sm_80" if target in (None, "sm_90a") else target
    delta = lse.new_empty(lse.shape)
    dt = dtype_constant(q.dtype)
    attention_bwd_delta[(ceil_div(nq, 64), heads, batch)](out, grad_out, lse if grad_lse is None else grad_lse, delta,
                                                          D=d, WITH_DL=int(grad_lse is not None), target="sm_80", **dt)
    kv_heads = k.shape[1]  # dK and dV a block per K/V head's keys, over the query heads that read it
    dkdv, dq_cfg = ({"WARPS": warps, **cfg, **group_constant(heads, kv_heads)} for cfg in configs)
    # RAGGED: a length that its kernel's steps do not divide (the last step masks the columns past it)
    dkdv["RAGGED"], dq_cfg["RAGGED"] = int(nq % dkdv.get("QUERIES", 64) > 0), int(nk % dq_cfg.get("KEYS", 64) > 0)
    if build != "sm_90a":
        dkdv.update(sm80_stages(d, q.get_device()))  # fewer stages on a card of less shared memory
        if kv_heads != heads:  # with the grouped loop's indices ptxas spills at D=64 (K, V in registers); none with
            dkdv["KV_IN_SHARED"] = 1  # K and V in shared memory
    key_blocks = dkdv_blocks(nk, d, dkdv)
    split = (_group_split(heads // kv_heads, key_blocks * kv_heads * batch, multiprocessors(q.get_device()))
             if kv_heads != heads else 1)
    if split > 1:  # each part's partial sums, then their sum (attention_bwd_sum_parts)
        dkdv["SPLIT"] = split
        dk_parts, dv_parts = (k.new_empty((split * batch, kv_heads, nk, d)) for _ in range(2))
        kernels[0][(key_blocks, kv_heads * split, batch)](q, k, v, grad_out, lse, delta, dk_parts, dv_parts, scale,
                                                          D=d, CAUSAL=int(causal), **dkdv, **dt, target=build)
        dk, dv = (torch.empty(k.shape, dtype=k.dtype, device=k.device) for _ in range(2))  # (rows: contiguous)
        rows = batch * kv_heads * nk
        for parts, total in ((dk_parts, dk), (dv_parts, dv)):
            attention_bwd_sum_parts[(ceil_div(rows, 64),)](parts.view(split, rows, d), total.view(rows, d), D=d,
                                                           target="sm_80", **dt)
    else:
        kernels[0][(key_blocks, kv_heads, batch)](q, k, v, grad_out, lse, delta, dk, dv, scale, D=d,
                                                  CAUSAL=int(causal), **dkdv, **dt, target=build)
    query_blocks = ceil_div(nq, 16 * dq_cfg["WARPS"]) * (d // dq_cfg.get("COLS", d))  # COLS: a block each part of dQ
    kernels[1][(query_blocks, heads, batch)](q, k, v, grad_out, lse, delta, dq, scale, D=d, CAUSAL=int(causal),
                                             **dq_cfg, **dt, target=build)
    return dq, dk, dv


def dkdv_blocks(nk: int, d: int, cfg: dict[str, int]) -> int:
    """The dK/dV kernels' grid x for Nk keys under constants `cfg` (WARPS given): a block each 16·WARPS keys, times
    D / COLS (a block each part of dK's and dV's columns), or each 64 keys with HALVES (two warpgroups on them)."""
    if cfg.get("HALVES"):
        return ceil_div(nk, 64)
    return ceil_div(nk, 16 * cfg["WARPS"]) * (d // cfg.get("COLS", d))


def _group_split(group: int, blocks: int, sms: int) -> int:
    """How many parts the dK/dV blocks of a grouped-query backward split each K/V head's query heads into: 1 where
    the grid of `blocks` (a block per K/V head's keys, each looping over its `group` query heads) fills the
    `sms` multiprocessors, else the fewest parts (a divisor of the group) that do, or the whole group. Each part adds
    a partial dK and dV to sum (not yet measured: a grid of fewer blocks than multiprocessors leaves the rest
    idle, e.g. B=1, N=2048, H_kv=4: 64 blocks)."""
    split = 1
    while blocks * split < sms and split < group:
        split += 1
        while group % split:
            split += 1
    return split
