"""Attention over packed sequences of different lengths (FlashAttention's "varlen"): the B sequences lie one after
another in q (total, H, D), k and v (total_k, H_kv, D); cu_seqlens (B + 1,) int32 gives where each starts (0,
len_0, len_0 + len_1, ...), and each sequence attends only to its own keys. No padding, no mask tensor.

A block takes one query block of one sequence and head: it finds which by walking the sequences' ends (its tile
number among all sequences' query blocks, as grouped_gemm's tiles among its groups), reads that sequence's keys
from its first row, masks the keys past its end, and cuts its stores at the sequence's end. The backward's blocks
find theirs alike: dK/dV a key block of a sequence (its queries' steps), dQ a query block (its keys' steps)."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

import tkc
from tkc.kernels._checks import cdiv as ceil_div  # `cdiv` is the DSL's, for kernels
from tkc.kernels._checks import check_like, check_tensor, dtype_constant, fail, unread_lse, wants_grad, wgmma_path
from tkc.kernels.attention import CONFIG, group_constant, kv_head, sm80_stages
from tkc.kernels.attention_bwd import (attention_bwd_delta, dkdv_step, dq_step, group_step, group_steps_end,
                                      scores_t, tma_ready)
from tkc.kernels.grouped_gemm import group_tile
from tkc.lang import *  # noqa: F403

if TYPE_CHECKING:
    import torch


@tkc.func
def query_block(Ends, EndsK, blk, rows, loads):
    """Query block `blk` of all the sequences' (each sequence's rows in blocks of `rows`, the sequences one after
    another): (its first row, its sequence's end, the sequence's first row, its first key row, its number of keys);
    past the last sequence's blocks (0, 0, 0, 0, 0): no keys, no rows. The ends are read `loads` at a time."""
    seq, first_row, end = group_tile(Ends, Ends.shape[0], blk, rows, loads)  # seq -1 past the last sequence's
    start, key_start = Ends[seq - 1], EndsK[seq - 1]  # (index -1 reads 0: the first sequence's start; and past)
    return first_row, end, start, key_start, EndsK[seq] - key_start


@tkc.func
def key_steps(first_row, start, keys, rows, KEYS, CAUSAL):
    """The key steps of a query block of `rows` rows from packed row `first_row` (its sequence's from `start`, with
    `keys` keys): all of them, or with CAUSAL those up to its last query; and the first step whose keys lie past
    some of its queries (causal masks from there on)."""
    key_blocks = cdiv(keys, KEYS)
    steps = min(cdiv(first_row - start + rows, KEYS), key_blocks) if CAUSAL else key_blocks
    return max(steps, 0), (first_row - start) // KEYS


@tkc.func
def sequence_mask(s, j, keys, row, start, first_masked, KEYS, CAUSAL):
    """Key step j's scores s (a warp's rows from packed row `row`) as its sequence sees them: keys past its end
    (the next sequence's) out, and with CAUSAL the keys after each query (within the sequence) from step
    `first_masked` on."""
    if j == cdiv(keys, KEYS) - 1:
        s = keep_cols(s, keys - j * KEYS)
    if CAUSAL:
        if j >= first_masked:
            s = tril(s, row - start - j * KEYS, -math.inf)
    return s


@tkc.kernel(warps="WARPS", stages="STAGES", defer="DEFER", producer="PRODUCER", late_pv="LATE_PV",
            min_target="sm_90a")
def attention_varlen_sm90(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], O: gl["DT", 4], L: gl[f32, 3],
                          Ends: gl[i32, 1], EndsK: gl[i32, 1], scale: float, D: const = 128, CAUSAL: const = 0,
                          KEYS: const = 128, WARPS: const = 8, STAGES: const = 3, DEFER: const = 2,
                          PRODUCER: const = 1, Q_REGS: const = 1, LATE_PV: const = 1, LSE: const = 0,
                          DT: const = bf16, GROUP: const = 1):
    """softmax(scale · q·kᵀ)·v for each sequence s: query rows Ends[s - 1] .. Ends[s] of Q (1, H, total, D) (packed
    rows: a view of (total, H, D)) over key rows EndsK[s - 1] .. EndsK[s] of K and V (1, H / GROUP, total_k, D), into
    the same rows of O (Ends[-1] read as 0). Causal keeps key j of a sequence for its query i when j ≤ i (torch's
    convention, also where the lengths differ). Grid: (cdiv(total, 16·WARPS) + B) · H blocks, a block a query block
    of 16·WARPS rows of one sequence and head (blocks past the last sequence's do nothing); those of a head next to
    each other (they share its K and V in L2). As attention_sm90 otherwise: the block's queries in shared memory
    (Q_REGS=1: each warp's 16 rows in registers), per step of KEYS keys S = Q·Kᵀ and O += P·V by wgmma, the online
    softmax in registers, a producer warpgroup issuing the TMA loads (PRODUCER=1), each step's P·V deferred under
    the next step's softmax (DEFER=2, `defer-wgmma` and `peel-deferred-step`; LATE_PV=1: behind its row max).
    With LSE, L (1, H, total) gets each row's log-sum-exp ln Σ_j exp(scale · q·k_j) (-inf where a sequence has no
    keys), as attention_sm90's."""
    static_assert(D in (64, 96, 128), f"head dim D must be 64, 96 or 128, got {D}")
    static_assert(KEYS in (64, 128), f"KEYS (keys per step) must be 64 or 128, got {KEYS}")
    static_assert(DEFER or not Q_REGS, "Q_REGS=1 needs DEFER: with P·V running on into the next step, ptxas gives P "
                  "the registers of Q that the next Q·Kᵀ reads (as attention_sm90)")
    BLOCK_ROWS = 16 * WARPS
    scale_log2 = scale * LOG2E
    seqs, heads = Ends.shape[0], Q.shape[1]
    q_blocks = cdiv(Q.shape[2], BLOCK_ROWS) + seqs  # at least each sequence's query blocks
    for tile in range(block_idx()[0], q_blocks * heads, num_blocks()[0]):
        # causal: the tiles from the last, so that each sequence's longest query blocks (its last rows) come first
        order = q_blocks * heads - 1 - tile if CAUSAL else tile
        blk, h = order % q_blocks, order // q_blocks
        # (the ends read 8 at a time: 16 left the producer warpgroup's 40 registers short, spills)
        first_row, end, start, key_start, keys = query_block(Ends, EndsK, blk, BLOCK_ROWS, 8)
        kv_h = kv_head(h, GROUP)
        q_block = load(Q, (0, h, rows(first_row), 0), st[DT, BLOCK_ROWS, D])
        if Q_REGS:  # each warp's 16 rows in registers: Q·Kᵀ then reads only K from shared memory
            q = load(q_block, (warp_id(), 0), rt[DT, 16, D])
        else:
            q = load(q_block, (warpgroup_id(), 0), st[DT, 64, D])
        row = first_row + 16 * warp_id()  # this warp's first query row (packed)
        m, l, o = neg_infty(rv[f32, 16]), zeros(rv[f32, 16]), zeros(rt[f32, 16, D])
        steps, first_masked = key_steps(first_row, start, keys, BLOCK_ROWS, KEYS, CAUSAL)
        for j in range(steps):
            k_s = load(K, (0, kv_h, rows(key_start + j * KEYS), 0), st[DT, KEYS, D])
            v_s = load(V, (0, kv_h, rows(key_start + j * KEYS), 0), st[DT, KEYS, D])
            s = sequence_mask(mma_ABt(q, k_s, zeros(rt[f32, 16, KEYS])), j, keys, row, start, first_masked, KEYS,
                              CAUSAL)
            m_new = max(m, row_max(s))
            correction = exp2((m - m_new) * scale_log2)
            o = mul_row(o, correction)
            l, m = l * correction, m_new
            p = exp2(sub_row(s * scale_log2, m * scale_log2))
            l = l + row_sum(p)
            o = mma_AB(p.to(DT), v_s, o)
        # (l ≥ 1 where a row saw a key, its largest term exp2(0); 0 where the sequence has no keys: zero rows)
        store(O, div_row(o, max(l, 1.0)).to(DT), (0, h, rows(row, end), 0))  # rows of this sequence only
        if LSE:
            store(L, m * scale + log(l), (0, h, rows(row, end)))


@tkc.kernel(warps=4, stages="STAGES", min_target="sm_80")
def attention_varlen_fwd(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], O: gl["DT", 4], L: gl[f32, 3],
                         Ends: gl[i32, 1], EndsK: gl[i32, 1], scale: float, D: const = 64, CAUSAL: const = 0,
                         ROWS: const = 16, KEYS: const = 64, Q_IN_SHARED: const = 0, LSE: const = 0,
                         DT: const = bf16, GROUP: const = 1, STAGES: const = 3):
    """attention_varlen_sm90 on the sm_80 path (mma.sync, cp.async; attention_fwd's loop): a block of 4 warps takes
    4·ROWS query rows of one sequence (LSE as there). Grid: (cdiv(total, 4·ROWS) + B, H)."""
    static_assert(D in (32, 64, 96, 128, 256), f"head dim D must be 32, 64, 96, 128 or 256, got {D}")
    static_assert(Q_IN_SHARED or ROWS * D <= 2048,
                  f"ROWS={ROWS} with D={D} needs more than 255 registers per thread; use ROWS=16 or Q_IN_SHARED=1")
    blk, h = block_idx()[0], block_idx()[1]
    if CAUSAL:  # the GPU starts blocks in order: each sequence's longest query blocks (its last) first
        blk = num_blocks()[0] - 1 - blk
    first_row, end, start, key_start, keys = query_block(Ends, EndsK, blk, 4 * ROWS, 16)
    kv_h = kv_head(h, GROUP)
    row = first_row + ROWS * warp_id()  # this warp's first query row (packed)
    if Q_IN_SHARED:
        q_s = load(Q, (0, h, rows(first_row), 0), st[DT, 4 * ROWS, D])
    else:
        q = load(Q, (0, h, rows(row), 0), rt[DT, ROWS, D])
    scale_log2 = scale * LOG2E
    RESCALE_LOG2 = 8.0  # as attention_fwd: l and o rescaled only where a row's maximum grew by more than 2^8
    m, l, o = neg_infty(rv[f32, ROWS]), zeros(rv[f32, ROWS]), zeros(rt[f32, ROWS, D])
    steps, first_masked = key_steps(first_row, start, keys, 4 * ROWS, KEYS, CAUSAL)
    for j in range(steps):
        k_s = load(K, (0, kv_h, rows(key_start + j * KEYS), 0), st[DT, KEYS, D])
        v_s = load(V, (0, kv_h, rows(key_start + j * KEYS), 0), st[DT, KEYS, D])
        if Q_IN_SHARED:
            q = load(q_s, (warp_id(), 0), rt[DT, ROWS, D])
        s = sequence_mask(mma_ABt(q, load(k_s), zeros(rt[f32, ROWS, KEYS])), j, keys, row, start, first_masked, KEYS,
                          CAUSAL)
        m_new = max(m, row_max(s))
        if max(m_new - m) * scale_log2 > RESCALE_LOG2:
            correction = exp2((m - m_new) * scale_log2)
            l, o, m = l * correction, mul_row(o, correction), m_new
        p = exp2(sub_row(s * scale_log2, m * scale_log2))
        l = l + row_sum(p)
        o = mma_AB(p.to(DT), load(v_s), o)
    store(O, div_row(o, max(l, 1.0)).to(DT), (0, h, rows(row, end), 0))  # (no keys: zero rows)
    if LSE:
        store(L, m * scale + log(l), (0, h, rows(row, end)))


# The forward's head dims: attention_varlen_sm90 takes HOPPER_DIMS; attention_varlen_fwd (the sm_80 build) the others
# on every GPU (as attention() at D = 32)
VARLEN_HEAD_DIMS = (32, 64, 96, 128, 256)
HOPPER_DIMS = (64, 96, 128)


def _check_varlen(q: Any, k: Any, v: Any, cu_seqlens: Any, cu_seqlens_k: Any, scale: Any, out: Any) -> Any:
    """attention_varlen's operands, checked (one error naming the first that is wrong); its cu_seqlens_k (cu_seqlens
    where None)."""
    import torch

    dtype = q.dtype if getattr(q, "dtype", None) is torch.float16 else torch.bfloat16  # else: check_tensor's error
    check_tensor("q", q, dtype, 3)
    check_tensor("k", k, dtype, 3)
    check_tensor("v", v, dtype, 3)
    check_tensor("cu_seqlens", cu_seqlens, torch.int32, 1)
    total, heads, d = q.shape
    kv_heads = k.shape[1]
    if d not in VARLEN_HEAD_DIMS:
        fail(f"q: head dim must be 32, 64, 96, 128 or 256, got {d}")
    if k.shape[2] != d or (kv_heads == 0) != (heads == 0) or heads and heads % kv_heads:
        fail(f"k: expected shape (total_k, H_kv, {d}) with H_kv dividing q's {heads} heads, got {tuple(k.shape)}")
    if v.shape != k.shape:
        fail(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if cu_seqlens.shape[0] < 1:
        fail("cu_seqlens: (B + 1,) offsets, 0 first: got an empty tensor")
    if cu_seqlens_k is None:
        if k.shape[0] != total:
            fail(f"k: {k.shape[0]} rows but q has {total}: give cu_seqlens_k where the keys' lengths differ")
        cu_seqlens_k = cu_seqlens
    else:
        check_tensor("cu_seqlens_k", cu_seqlens_k, torch.int32, 1)
        if cu_seqlens_k.shape != cu_seqlens.shape:
            fail(f"cu_seqlens_k: one offset a sequence as cu_seqlens {tuple(cu_seqlens.shape)}, got "
                 f"{tuple(cu_seqlens_k.shape)}")
    if scale is not None and not (isinstance(scale, numbers.Real) and 0 < scale < math.inf):
        fail(f"scale: must be a positive finite number, got {scale!r}")
    for name, t in (("k", k), ("v", v), ("cu_seqlens", cu_seqlens), ("cu_seqlens_k", cu_seqlens_k), ("out", out)):
        if t is not None and t.device != q.device:
            fail(f"{name} is on {t.device} but q is on {q.device}")
    return cu_seqlens_k


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, *,
                     cu_seqlens_k: torch.Tensor | None = None, causal: bool = False, scale: float | None = None,
                     target: str | None = None, out: torch.Tensor | None = None,
                     return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention over packed sequences: q (total, H, D), k and v (total_k, H_kv, D), bf16 (or f16) CUDA tensors,
    D ∈ {32, 64, 96, 128, 256}, H_kv dividing H (grouped-query attention); cu_seqlens (B + 1,) int32, 0 first,
    non-decreasing, sequence s being rows cu_seqlens[s] .. cu_seqlens[s + 1] of q, and of k and v (or cu_seqlens_k's
    rows where the keys' lengths differ: same B). Returns out (total, H, D): each sequence's
    softmax(scale · q·kᵀ)·v, scale 1/√D by default; causal keeps key j for query i of a sequence when j ≤ i (torch's
    convention). Rows of q past cu_seqlens[-1] are left as they are. With return_lse, also each row's log-sum-exp
    ln Σ_j exp(scale · q·k_j), float32 (H, total) (FlashAttention's varlen layout; -inf where a sequence has no
    keys): (out, lse). On Hopper (or target="sm_90a") at D = 64, 96 or 128 attention_varlen_sm90, elsewhere (or
    target="sm_80"), and at D = 32 and 256 on every GPU, attention_varlen_fwd. On inputs requiring grad (D ≤ 128),
    autograd's backward runs attention_varlen_backward's kernels.
    (cu_seqlens' values are not read on the host — that would wait for the GPU: lengths past the tensors' rows read
    zeros and write nothing, never out of bounds.) Rows of k and v past the last sequence's keys, where the tensors
    have them, must hold finite values (an unwritten buffer's NaN there makes the last sequence's outputs NaN): the
    last key block reads them, weighted by 0; in the backward, rows of q and grad_out past the last sequence too."""
    import torch

    if wants_grad(torch, q, k, v) and getattr(q, "shape", (0, 0, 0))[-1] not in BACKWARD_STEPS:
        fail(f"q: attention_varlen's backward takes head dims 32, 64, 96 and 128, got {q.shape[-1]} (on inputs that "
             "require grad)")
    if torch.compiler.is_compiling() or wants_grad(torch, q, k, v):  # one op of the graph / of autograd
        from tkc.kernels import torch_ops

        o, lse = torch_ops.attention_varlen(q, k, v, cu_seqlens, cu_seqlens_k, bool(causal),
                                            None if scale is None else float(scale), target)
        o = o if out is None else out.copy_(o)
        return (o, lse) if return_lse else o
    cu_seqlens_k = _check_varlen(q, k, v, cu_seqlens, cu_seqlens_k, scale, out)
    total, heads, d = q.shape
    kv_heads = k.shape[1]
    if out is None:
        out = torch.empty_like(q)
    else:
        check_like("out", out, q)
    if target == "sm_90a" and d not in HOPPER_DIMS:
        fail(f"q: target sm_90a's varlen kernel takes head dims 64, 96 and 128, got {d} (D = 32 and 256 run the sm_80 "
             "kernel: target=None or \"sm_80\")")
    hopper = wgmma_path(q.get_device(), target) and d in HOPPER_DIMS
    if hopper:
        for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
            strides = t.stride()
            if (strides[2] != 1 and d > 1) or (strides[0] | strides[1]) % 8 or t.data_ptr() % 16:
                fail(f"{name}: the Hopper kernel reads and writes through TMA: the last dimension must be contiguous "
                     f"and the other strides multiples of 8 elements (16 bytes), got strides {tuple(strides)}")
    lse = torch.empty((heads, total), dtype=torch.float32, device=q.device) if return_lse else None
    seqs = cu_seqlens.shape[0] - 1
    if seqs == 0 or total == 0 or heads == 0:
        return (out, lse) if return_lse else out
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    constants = {"D": d, "CAUSAL": int(bool(causal)), "LSE": int(return_lse), **dtype_constant(q.dtype),
                 **group_constant(heads, kv_heads)}
    packed = [t.unsqueeze(0).transpose(1, 2) for t in (q, k, v, out)]  # (1, H, total, D) views of the same rows
    arguments = (*packed, lse.unsqueeze(0) if return_lse else unread_lse(q), cu_seqlens[1:], cu_seqlens_k[1:],
                 scale)  # the sequences' ends
    if hopper:  # P·V behind the row max at D = 64 only, as attention()'s (D = 128 not causal: 3 % faster without,
        # causal level; RESULTS "probe-varlen — 2026-12-07 23:10")
        spec = attention_varlen_sm90.specialize(target="sm_90a", LATE_PV=int(d == 64), **constants)
        spec.launch(((ceil_div(total, 16 * 8) + seqs) * heads, 1, 1), arguments)  # WARPS = 8
    else:
        rows, keys, q_in_shared = CONFIG[d]  # attention_fwd's
        build = "sm_80" if target in (None, "sm_90a") else target  # (D = 32 / 256 on Hopper: the sm_80 build)
        spec = attention_varlen_fwd.specialize(target=build, ROWS=rows, KEYS=keys, Q_IN_SHARED=q_in_shared,
                                               **sm80_stages(d, q.get_device()), **constants)
        spec.launch((ceil_div(total, 4 * rows) + seqs, heads, 1), arguments)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------------------------
# The backward (as attention_backward's: the wgmma kernels on Hopper, the mma.sync ones' sm_80 build elsewhere): Δ by
# attention_bwd_delta on the packed views (its rows are independent of the sequences), then dK/dV a block per key
# block of a sequence and dQ a block per query block of one.


@tkc.func
def sequence_dkdv(Q, dO, L, Delta, k, v, h, first_key, key_row, key_start, start, queries, scale, D, CAUSAL,
                  QUERIES, GROUP, kv_in_shared, wgmma, DT):
    """dK and dV (without the scale) of a warp's 16 keys from packed key row `key_row` (k, v: in registers, or in
    shared memory with `kv_in_shared` or `wgmma`) of a key block from `first_key`, in the sequence whose keys start
    at `key_start` and whose `queries` queries at `start`: the loop over its query steps (QUERIES a step) and the
    GROUP query heads that read K/V head h, one after the other."""
    scale_log2 = scale * LOG2E
    dk, dv = zeros(rt[f32, 16, D]), zeros(rt[f32, 16, D])
    first = (first_key - key_start) // QUERIES if CAUSAL else 0  # query steps before see none of the block's keys
    # (at least one step from `first`: group_step divides by steps - first, also where the pipeline computes the
    # addresses of steps that do not run; a step past the queries masks them all and adds nothing)
    steps = max(cdiv(queries, QUERIES), first + 1)
    for i in range(first, group_steps_end(first, steps, GROUP)):
        hq, j = group_step(i, first, steps, h * GROUP, GROUP)
        q_row = start + j * QUERIES  # (rows past the sequence's queries: the next one's, or zeros; masked)
        q_s, do_s = load(Q, (0, hq, rows(q_row), 0), st[DT, QUERIES, D]), load(dO, (0, hq, rows(q_row), 0),
                                                                              st[DT, QUERIES, D])
        # (read up to the sequence's end, zeros past it: another sequence's L of -inf would make its masked P NaN)
        lse_log2 = load(L, (0, hq, rows(q_row, start + queries)), rv[f32, QUERIES]) * LOG2E
        delta = load(Delta, (0, hq, rows(q_row, start + queries)), rv[f32, QUERIES])
        dk, dv, _ = dkdv_step(scores_t(k, q_s, kv_in_shared, wgmma, D, DT), v, q_s, do_s, lse_log2, delta, dk, dv,
                              scale_log2, key_row - key_start - j * QUERIES, CAUSAL, queries - j * QUERIES, 1,
                              kv_in_shared, wgmma, D, DT)
    return dk, dv


@tkc.func
def sequence_dq(K, V, L, Delta, dQ, q, do, h, first_row, row, end, start, key_start, keys, block_rows, scale, D,
                CAUSAL, KEYS, GROUP, wgmma, DT):
    """dQ of a warp's 16 query rows from packed row `row` (q, do: in registers, or with `wgmma` its warpgroup's in
    shared memory) of a query block of `block_rows` from `first_row`, in the sequence from `start` (its end `end`;
    its `keys` keys from `key_start`): the loop over the keys, KEYS a step, then the store cut at the end."""
    lse_log2 = load(L, (0, h, rows(row, end)), rv[f32, 16]) * LOG2E
    delta = load(Delta, (0, h, rows(row, end)), rv[f32, 16])
    scale_log2 = scale * LOG2E
    dq = zeros(rt[f32, 16, D])
    kv_h = kv_head(h, GROUP)
    steps, _ = key_steps(first_row, start, keys, block_rows, KEYS, CAUSAL)
    for j in range(steps):
        k_s = load(K, (0, kv_h, rows(key_start + j * KEYS), 0), st[DT, KEYS, D])
        v_s = load(V, (0, kv_h, rows(key_start + j * KEYS), 0), st[DT, KEYS, D])
        dq = dq_step(q, do, k_s, v_s, lse_log2, delta, dq, scale_log2, row - start - j * KEYS, CAUSAL,
                     keys - j * KEYS, 1, wgmma, DT)
    store(dQ, (dq * scale).to(DT), (0, h, rows(row, end), 0))


@tkc.kernel(warps=4, stages="STAGES", min_target="sm_80")
def attention_varlen_bwd_dkdv(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], dO: gl["DT", 4], L: gl[f32, 3],
                              Delta: gl[f32, 3], dK: gl["DT", 4], dV: gl["DT", 4], Ends: gl[i32, 1],
                              EndsK: gl[i32, 1], scale: float, D: const = 64, CAUSAL: const = 0,
                              QUERIES: const = 64, KV_IN_SHARED: const = 0, DT: const = bf16, GROUP: const = 1,
                              STAGES: const = 3):
    """dK and dV of 64 keys of one sequence (16 a warp; the keys' rows of K, V (1, H / GROUP, total_k, D)), summed over
    its queries (and the GROUP query heads that read the K/V head) QUERIES at a time, as attention_bwd_dkdv: each
    step's Sᵀ masked to the sequence's queries (and causal: a query sees a key at or before its place), P from
    L (1, H, total), Δ. Grid: (cdiv(total_k, 64) + B, H / GROUP)."""
    static_assert(D in (32, 64, 96, 128), f"head dim D must be 32, 64, 96 or 128, got {D}")
    h = block_idx()[1]
    # the block's keys: block x of all the sequences' key blocks
    first_key, key_end, key_start, start, queries = query_block(EndsK, Ends, block_idx()[0], 64, 16)
    key_row = first_key + 16 * warp_id()  # this warp's first key (packed)
    if KV_IN_SHARED:
        k = load(K, (0, h, rows(first_key), 0), st[DT, 64, D])
        v = load(V, (0, h, rows(first_key), 0), st[DT, 64, D])
    else:
        k, v = load(K, (0, h, rows(key_row), 0), rt[DT, 16, D]), load(V, (0, h, rows(key_row), 0), rt[DT, 16, D])
    dk, dv = sequence_dkdv(Q, dO, L, Delta, k, v, h, first_key, key_row, key_start, start, queries, scale, D, CAUSAL,
                           QUERIES, GROUP, KV_IN_SHARED, 0, DT)
    store(dK, (dk * scale).to(DT), (0, h, rows(key_row, key_end), 0))
    store(dV, dv.to(DT), (0, h, rows(key_row, key_end), 0))


@tkc.kernel(warps=4, min_target="sm_80")
def attention_varlen_bwd_dq(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], dO: gl["DT", 4], L: gl[f32, 3],
                            Delta: gl[f32, 3], dQ: gl["DT", 4], Ends: gl[i32, 1], EndsK: gl[i32, 1], scale: float,
                            D: const = 64, CAUSAL: const = 0, KEYS: const = 64, DT: const = bf16, GROUP: const = 1):
    """dQ of 64 queries of one sequence (16 a warp), over its keys KEYS at a time, as attention_bwd_dq. Grid:
    (cdiv(total, 64) + B, H)."""
    static_assert(D in (32, 64, 96, 128), f"head dim D must be 32, 64, 96 or 128, got {D}")
    h = block_idx()[1]
    first_row, end, start, key_start, keys = query_block(Ends, EndsK, block_idx()[0], 64, 16)
    row = first_row + 16 * warp_id()
    q, do = load(Q, (0, h, rows(row), 0), rt[DT, 16, D]), load(dO, (0, h, rows(row), 0), rt[DT, 16, D])
    sequence_dq(K, V, L, Delta, dQ, q, do, h, first_row, row, end, start, key_start, keys, 64, scale, D, CAUSAL, KEYS,
                GROUP, 0, DT)


@tkc.kernel(warps="WARPS", stages="STAGES", producer="PRODUCER", blocks_per_sm="BLOCKS", min_target="sm_90a")
def attention_varlen_bwd_dkdv_sm90(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], dO: gl["DT", 4], L: gl[f32, 3],
                                   Delta: gl[f32, 3], dK: gl["DT", 4], dV: gl["DT", 4], Ends: gl[i32, 1],
                                   EndsK: gl[i32, 1], scale: float, D: const = 128, CAUSAL: const = 0,
                                   QUERIES: const = 64, WARPS: const = 8, STAGES: const = 3, PRODUCER: const = 0,
                                   BLOCKS: const = 0, DT: const = bf16, GROUP: const = 1):
    """attention_varlen_bwd_dkdv on Hopper's wgmma (as attention_bwd_dkdv_sm90): a block per 16·WARPS keys of one
    sequence (a warpgroup per 64), K and V in shared memory, Q and dO streamed by TMA from the sequence's first query
    row, QUERIES a step; Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ from shared memory, dV += Pᵀ·dO and dK += dSᵀ·Q. Grid:
    (cdiv(total_k, 16·WARPS) + B, H / GROUP)."""
    static_assert(D in (64, 96, 128), f"head dim D must be 64, 96 or 128, got {D}")
    h = block_idx()[1]
    first_key, key_end, key_start, start, queries = query_block(EndsK, Ends, block_idx()[0], 16 * WARPS, 8)
    k_block = load(K, (0, h, rows(first_key), 0), st[DT, 16 * WARPS, D])
    v_block = load(V, (0, h, rows(first_key), 0), st[DT, 16 * WARPS, D])
    k, v = load(k_block, (warpgroup_id(), 0), st[DT, 64, D]), load(v_block, (warpgroup_id(), 0), st[DT, 64, D])
    key_row = first_key + 16 * warp_id()  # this warp's first key (packed)
    dk, dv = sequence_dkdv(Q, dO, L, Delta, k, v, h, first_key, key_row, key_start, start, queries, scale, D, CAUSAL,
                           QUERIES, GROUP, 0, 1, DT)
    store(dK, (dk * scale).to(DT), (0, h, rows(key_row, key_end), 0))
    store(dV, dv.to(DT), (0, h, rows(key_row, key_end), 0))


@tkc.kernel(warps="WARPS", stages="STAGES", producer="PRODUCER", blocks_per_sm="BLOCKS", min_target="sm_90a")
def attention_varlen_bwd_dq_sm90(Q: gl["DT", 4], K: gl["DT", 4], V: gl["DT", 4], dO: gl["DT", 4], L: gl[f32, 3],
                                 Delta: gl[f32, 3], dQ: gl["DT", 4], Ends: gl[i32, 1], EndsK: gl[i32, 1],
                                 scale: float, D: const = 128, CAUSAL: const = 0, KEYS: const = 64,
                                 WARPS: const = 8, STAGES: const = 3, PRODUCER: const = 0, BLOCKS: const = 0,
                                 DT: const = bf16, GROUP: const = 1):
    """attention_varlen_bwd_dq on Hopper's wgmma (as attention_bwd_dq_sm90): a block per 16·WARPS queries of one
    sequence (a warpgroup per 64), Q and dO in shared memory, K and V streamed by TMA, KEYS a step. Grid:
    (cdiv(total, 16·WARPS) + B, H)."""
    static_assert(D in (64, 96, 128), f"head dim D must be 64, 96 or 128, got {D}")
    blk, h = block_idx()[0], block_idx()[1]
    if CAUSAL:  # each sequence's last query blocks, which see the most keys, first
        blk = num_blocks()[0] - 1 - blk
    first_row, end, start, key_start, keys = query_block(Ends, EndsK, blk, 16 * WARPS, 8)
    q_block = load(Q, (0, h, rows(first_row), 0), st[DT, 16 * WARPS, D])
    do_block = load(dO, (0, h, rows(first_row), 0), st[DT, 16 * WARPS, D])
    q, do = load(q_block, (warpgroup_id(), 0), st[DT, 64, D]), load(do_block, (warpgroup_id(), 0), st[DT, 64, D])
    row = first_row + 16 * warp_id()
    sequence_dq(K, V, L, Delta, dQ, q, do, h, first_row, row, end, start, key_start, keys, 16 * WARPS, scale, D,
                CAUSAL, KEYS, GROUP, 1, DT)


@tkc.func
def zero_tail(X, end, h, row, D, DT):
    """Zeros into the 16 rows of X (1, H, rows, D) from `row` that lie at or past `end` (its head h, where X has it)."""
    if h < X.shape[1] and row < X.shape[2] and row + 16 > end:  # (a tile across the end: from it on, overlapping)
        store(X, zeros(rt[f32, 16, D]).to(DT), (0, h, rows(max(row, end), X.shape[2]), 0))


@tkc.kernel(warps=4, min_target="sm_80")
def attention_varlen_zero_tail(dQ: gl["DT", 4], dK: gl["DT", 4], dV: gl["DT", 4], Ends: gl[i32, 1],
                               EndsK: gl[i32, 1], D: const = 64, DT: const = bf16):
    """Zeros into the rows of dQ from Ends[-1] on and of dK, dV from EndsK[-1] on (each (1, heads, rows, D): the
    packed rows past the last sequence, which no gradient reaches), one launch for the three: a warp each 16 rows,
    those before the end leave theirs. Grid: (cdiv(most rows, 64), most heads)."""
    h, row = block_idx()[1], block_idx()[0] * 64 + 16 * warp_id()
    zero_tail(dQ, Ends[Ends.shape[0] - 1], h, row, D, DT)
    key_end = EndsK[EndsK.shape[0] - 1]
    zero_tail(dK, key_end, h, row, D, DT)
    zero_tail(dV, key_end, h, row, D, DT)


# per head dim: (dK/dV's queries a step, dQ's keys a step), K and V in shared memory in the dK/dV kernel: the
# builds without spills for sm_80 and sm_90 (the H200 JIT), causal and grouped-query too (in registers, K and V
# spilled at D = 64 causal; 32 queries a step at D = 128 causal, and 64 keys at D = 64 with 4 query heads a K/V
# head, spilled a few bytes)
BACKWARD_STEPS = {32: (64, 32), 64: (64, 32), 96: (16, 32), 128: (16, 32)}  # (D = 256: dK and dV would not fit)
# On Hopper, attention_bwd's wgmma constants (dK/dV, dQ) but as bench/probe_varlen.py --backward found them on an
# H100 (RESULTS "probe-varlen-backward — 2026-12-07 23:09 / 23:10", 16384 tokens in 8 or 31 sequences, H = 16, µs
# shipped before → now): D = 128 dQ with a producer warpgroup (939 vs 992 not causal, 582 vs 638 causal; 32-query
# dK/dV steps, which fit without the 8 bytes spilled at causal grouped, 1106-2152 vs 872-1494: kept at 64); D = 64
# dK/dV ptxas's choice of blocks (1118 vs 1197, causal level; three would spill: the sequences' indices), dQ of four
# warps when causal (142 vs 154 at short sequences; not causal 198 vs 190, kept at eight). D = 96 as 128 (not swept).
BACKWARD_SM90 = {64: ({"WARPS": 4, "STAGES": 3}, {"STAGES": 3}), 128: ({"STAGES": 3}, {"STAGES": 3, "PRODUCER": 1})}
BACKWARD_SM90[96] = BACKWARD_SM90[128]
CAUSAL_DQ_SM90 = {64: {"WARPS": 4}}  # dQ's constants where causal


def attention_varlen_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                              grad_out: torch.Tensor, lse: torch.Tensor, cu_seqlens: torch.Tensor, *,
                              cu_seqlens_k: torch.Tensor | None = None, causal: bool = False,
                              scale: float | None = None, grad_lse: torch.Tensor | None = None,
                              target: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients (dq, dk, dv) of out = attention_varlen(q, k, v, cu_seqlens, ...) given grad_out, the forward's
    `out` and its log-sum-exps `lse` ((H, total) float32, return_lse=True); with grad_lse, also through lse. dk and
    dv sum over the query heads that read each K/V head; rows of dq past cu_seqlens[-1] are zeros, as those of dk and
    dv past the keys' last offset. Rows of q, k, v and grad_out past the last sequence must be finite (read, weighted
    by 0: NaN there reaches the last sequence's gradients). On Hopper (or with target="sm_90a") at D = 64, 96 and
    128 the wgmma kernels where TMA can read the tensors; elsewhere (and with target="sm_80", and at D = 32) the
    mma.sync kernels."""
    import torch

    _check_varlen(q, k, v, cu_seqlens, cu_seqlens_k, scale, None)
    if q.shape[2] not in BACKWARD_STEPS:
        fail(f"q: attention_varlen's backward takes head dims 32, 64, 96 and 128, got {q.shape[2]}")
    check_like("out", out, q)
    check_like("grad_out", grad_out, q)
    for name, t in (("lse", lse), ("grad_lse", grad_lse)):
        if t is not None:
            check_tensor(name, t, torch.float32, 2)
            if t.shape != (q.shape[1], q.shape[0]):
                fail(f"{name}: expected shape ({q.shape[1]}, {q.shape[0]}) (H, total), got {tuple(t.shape)}")
    cu_seqlens_k = cu_seqlens if cu_seqlens_k is None else cu_seqlens_k
    total, heads, d = q.shape
    total_k, kv_heads = k.shape[0], k.shape[1]
    seqs = cu_seqlens.shape[0] - 1
    if seqs == 0 or total == 0 or heads == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    dt = dtype_constant(q.dtype)
    packed = lambda t: t.unsqueeze(0).transpose(1, 2)  # noqa: E731  (1, H, rows, D) views
    delta = lse.new_empty(lse.shape)
    attention_bwd_delta[(ceil_div(total, 64), heads, 1)](packed(out), packed(grad_out),
                                                       (lse if grad_lse is None else grad_lse).unsqueeze(0),
                                                       delta.unsqueeze(0), D=d, WITH_DL=int(grad_lse is not None),
                                                       target="sm_80", **dt)
    constants = {"D": d, "CAUSAL": int(bool(causal)), **dt, **group_constant(heads, kv_heads)}
    ends, key_ends = cu_seqlens[1:], cu_seqlens_k[1:]
    views = [packed(t) for t in (q, k, v, grad_out, dq, dk, dv)]
    common = (*views[:4], lse.unsqueeze(0), delta.unsqueeze(0))
    hopper = wgmma_path(q.get_device(), target) and tma_ready(*views)
    (dkdv_kernel, dkdv, key_rows), (dq_kernel, dq_cfg, query_rows) = backward_kernels(d, hopper, bool(causal))
    build = "sm_90a" if hopper and d in BACKWARD_SM90 else "sm_80" if target in (None, "sm_90a") else target
    dkdv_kernel[(ceil_div(total_k, key_rows) + seqs, kv_heads, 1)](*common, views[5], views[6], ends, key_ends, scale,
                                                                   **dkdv, **constants, target=build)
    dq_kernel[(ceil_div(total, query_rows) + seqs, heads, 1)](*common, views[4], ends, key_ends, scale, **dq_cfg,
                                                             **constants, target=build)
    # the rows past the last sequence (no gradient reaches them): zeros, written where the host cannot see them
    # (reading cu_seqlens[-1] would wait for the GPU) instead of memsets of whole tensors
    attention_varlen_zero_tail[(ceil_div(max(total, total_k), 64), max(heads, kv_heads), 1)](*views[4:], ends,
                                                                                         key_ends, D=d, **dt,
                                                                                         target="sm_80")
    return dq, dk, dv


def backward_kernels(d: int, hopper: bool,
                     causal: bool = False) -> tuple[tuple[Any, dict[str, int], int], tuple[Any, dict[str, int], int]]:
    """attention_varlen_backward's dK/dV and dQ kernels at head dim d, each (kernel, its constants, the rows of a
    block): with `hopper` (and D = 64, 96, 128) the wgmma ones, else the mma.sync ones."""
    if hopper and d in BACKWARD_SM90:
        dkdv, dq = BACKWARD_SM90[d]
        if causal:
            dq = {**dq, **CAUSAL_DQ_SM90.get(d, {})}
        return ((attention_varlen_bwd_dkdv_sm90, dkdv, 16 * dkdv.get("WARPS", 8)),
                (attention_varlen_bwd_dq_sm90, dq, 16 * dq.get("WARPS", 8)))
    queries, keys = BACKWARD_STEPS[d]
    return ((attention_varlen_bwd_dkdv, {"QUERIES": queries, "KV_IN_SHARED": 1}, 64),
            (attention_varlen_bwd_dq, {"KEYS": keys}, 64))
