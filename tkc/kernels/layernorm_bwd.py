"""LayerNorm's and RMSNorm's backward (of layernorm() / rmsnorm(), residual fused): with s the normalized input
(x + residual, or x), x̂ = (s - mean(s))·rstd (RMSNorm: s·rstd) and g = dy·w,

    ds = rstd·(g - mean(g) - x̂·mean(g·x̂))   (RMSNorm: rstd·(g - x̂·mean(g·x̂))),  plus the new residual's gradient
    dw = Σ_rows dy·x̂,  db = Σ_rows dy

and dx = dresidual = ds. The mean and rstd are recomputed from s (the forward keeps nothing but s itself)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tkc
from tkc.kernels._checks import cdiv as ceil_div  # `cdiv` is the DSL's, for kernels
from tkc.kernels._checks import cached_plan, current_stream_key, dtype_constant, stream_scratch
from tkc.kernels.layernorm import row_total, row_totals
from tkc.lang import *  # noqa: F403

if TYPE_CHECKING:
    import torch


@tkc.kernel(warps="WARPS", min_target="sm_80")
def layernorm_bwd_kernel(S: gl["DT", 2], dY: gl["DT", 2], dS: gl["DT", 2], Weight: gl["DT", 1], dX: gl["DT", 2],
                         Parts: gl[f32, 2], eps: float, D: const = 1024, WARPS: const = 8, SPLIT: const = 1,
                         DT: const = bf16, RMS: const = 0, DS_IN: const = 0):
    """Rows of length D: S the forward's normalized input, dY the output's gradient, dS (with DS_IN) the new
    residual's; writes ds into dX and the block's partial sums of dy·x̂ and dy (RMS: dy·x̂ only) into row b of
    Parts (blocks, 2·D; RMS: D), side by side, which column_sums_kernel then adds up.

    Grid: (blocks,), as many as the GPU holds at once. A row is spread over SPLIT warps, D / SPLIT columns each,
    its sums exchanged through shared memory (two rounds: the mean, then the other three at once; RMS: one); or,
    SPLIT = 1, each of the WARPS warps takes rows of its own and needs no exchange, and the block adds its warps'
    partial sums in shared memory at the end (WARPS times fewer partial rows for column_sums_kernel). Block b
    (warp w) takes rows b, b + blocks, ... (b·WARPS + w, + blocks·WARPS, ...), keeping its partial sums in
    registers, and reads the next row's s and dy while it works on this one (past the last row they read zeros).
    """
    static_assert(SPLIT == WARPS or SPLIT == 1, f"a row is over all WARPS ({WARPS}) warps or over one (SPLIT={SPLIT})")
    static_assert(D % (16 * WARPS) == 0, f"D ({D}) must be a multiple of 16 · WARPS ({16 * WARPS})")
    COLS = D // SPLIT
    mean_slots, sum_slots = empty(sv[f32, 16 * SPLIT]), empty(sv[f32, 48 * SPLIT])
    if SPLIT == 1:
        part, first, stride = 0, block_idx()[0] * WARPS + warp_id(), num_blocks()[0] * WARPS
    else:
        part, first, stride = warp_id(), block_idx()[0], num_blocks()[0]  # part: this warp's columns, in COLS
    dw, db = zeros(rv[f32, COLS]), zeros(rv[f32, COLS])
    weight = load(Weight, (part,), rv[f32, COLS])
    s_next, dy_next = load(S, (first, part), rv[f32, COLS]), load(dY, (first, part), rv[f32, COLS])
    for row in range(first, S.shape[0], stride):
        s, dy = s_next, dy_next
        s_next, dy_next = load(S, (row + stride, part), rv[f32, COLS]), load(dY, (row + stride, part), rv[f32, COLS])
        g = dy * weight
        if RMS:
            squares, g_s = row_totals((sum(s * s), sum(g * s)), sum_slots, SPLIT)
            rstd = rsqrt(squares / D + eps)
            x_hat = s * rstd
            ds = (g - x_hat * (g_s * rstd / D)) * rstd
        else:
            centered = s - row_total(sum(s), mean_slots, SPLIT) / D
            squares, g_c, g_total = row_totals((sum(centered * centered), sum(g * centered), sum(g)), sum_slots,
                                               SPLIT)
            rstd = rsqrt(squares / D + eps)
            x_hat = centered * rstd
            ds = (g - g_total / D - x_hat * (g_c * rstd / D)) * rstd
            db = db + dy
        dw = dw + dy * x_hat
        if DS_IN:
            ds = ds + load(dS, (row, part), rv[f32, COLS])
        store(dX, ds, (row, part))
    if SPLIT == 1:
        rows = block_parts(Parts, empty(sv[f32, WARPS * D]), dw, 0, WARPS, D)
        if not RMS:
            block_parts(Parts, rows, db, WARPS, WARPS, D)
    else:
        store(Parts, dw, (first, part))
        if not RMS:
            store(Parts, db, (first, WARPS + part))


@tkc.func
def block_parts(Parts, rows, partial, offset, warps, d):
    """The sum of the block's `warps` warps' `partial` rows (rv[f32, d] each) into row b of Parts at columns
    offset·d/warps ...: the warps write theirs to `rows` (sv[f32, warps·d]; returned), then warp w adds up columns
    w·d/warps ... of them. Each lane holds runs of 8 columns (32 bytes of f32): the store conflicts 2-way, once a
    warp at the end of the kernel."""
    rows = store(rows, partial, (warp_id(),), conflicts=2)
    total = load(rows, (warp_id(),), rv[f32, d // warps])
    for i in range(1, warps):
        total = total + load(rows, (i * warps + warp_id(),), rv[f32, d // warps])
    store(Parts, total, (block_idx()[0], offset + warp_id()))
    return rows


@tkc.kernel(warps=16, min_target="sm_80")
def column_sums_kernel(Rows: gl[f32, 2], Sums: gl["DT", 1], DT: const = f32):
    """Sums[c] = Σ_r Rows[r, c], in DT. Grid: (cdiv(C, 32),): block b adds columns 32b .. 32b + 31; warp w rows w,
    w + 16, w + 32, ..., 8 of its rows a step with their loads in flight together (one round trip a step; rows past
    the end read zeros), and the 16 warps' sums meet in shared memory. One launch: at 16384×1024 a launch cost
    the host 17-23 µs against 2-3 µs of the GPU's (RESULTS "layernorm-backward — 2026-12-05 13:50"), where two
    levels (groups of rows, then the groups) took two."""
    cols, w = block_idx()[0], warp_id()
    total = zeros(rv[f32, 32])
    for i in range(w, Rows.shape[0], 128):
        first = (load(Rows, (i, cols), rv[f32, 32]) + load(Rows, (i + 16, cols), rv[f32, 32])
                 + load(Rows, (i + 32, cols), rv[f32, 32]) + load(Rows, (i + 48, cols), rv[f32, 32]))
        second = (load(Rows, (i + 64, cols), rv[f32, 32]) + load(Rows, (i + 80, cols), rv[f32, 32])
                  + load(Rows, (i + 96, cols), rv[f32, 32]) + load(Rows, (i + 112, cols), rv[f32, 32]))
        total = total + (first + second)
    warp_sums = store(empty(sv[f32, 512]), total, (w,))
    total = load(warp_sums, (0,), rv[f32, 32])
    for other in range(1, 16):
        total = total + load(warp_sums, (other,), rv[f32, 32])
    if w == 0:
        store(Sums, total, (cols,))


def layernorm_backward(s: torch.Tensor, grad_y: torch.Tensor, grad_s: torch.Tensor | None, weight: torch.Tensor,
                       eps: float, rms: bool = False,
                       target: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(ds, dw, db) of y = layernorm(s)·w + b (rms: rmsnorm(s)·w, db None) for (rows, D) tensors of one dtype: s the
    normalized input, grad_y y's gradient, grad_s (or None) that of s where s is also an output (the new residual
    stream): ds adds it. ds is both x's and the residual's gradient. Called by autograd through
    torch.ops.tkc.layernorm (tkc/kernels/torch_ops.py) on the tensors it saved and checked."""
    import torch

    rows, d = s.shape
    backward, column_sums, blocks, width = cached_plan(
        _PLANS, (rows, d, s.dtype, s.get_device(), rms, grad_s is not None, target),
        lambda *key: _plan(*key, example=(s, weight, eps)))
    ds, device = torch.empty_like(s), s.device
    # the blocks' partial sums of dw (and db)
    parts = stream_scratch(torch, s, (blocks, width), torch.float32, current_stream_key(torch, s))
    totals = torch.empty(width, dtype=weight.dtype, device=device)
    backward(s, grad_y, s if grad_s is None else grad_s, weight, ds, parts, eps)
    column_sums(parts, totals)
    return ds, totals[:d], None if rms else totals[d:]


_PLANS: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # layernorm_backward's launches by (rows, D, dtype, device, ...)


def _plan(rows: int, d: int, dtype: Any, device: int, rms: bool, ds_in: bool, target: str | None,
          example: tuple[Any, ...]) -> tuple[Any, ...]:
    """layernorm_backward's two launches bound to their grids, its blocks and the partial sums' width: the backward
    kernel on as many blocks as the GPU holds at once (fewer where the rows run out), then column_sums_kernel over
    the blocks' partial rows. `example`: (s, weight, eps) of the call, to ask the driver how many blocks fit."""
    import torch

    warps, split = backward_layout(d)
    width = d if rms else 2 * d  # dw, and db: side by side, summed together
    backward = layernorm_bwd_kernel.specialize(D=d, WARPS=warps, SPLIT=split, RMS=int(rms), DS_IN=int(ds_in),
                                               target=target, **dtype_constant(dtype))
    s, weight, eps = example
    resident = backward.resident_blocks(s, s, s, weight, s, torch.empty((1, width), dtype=torch.float32,
                                                                       device=s.device), eps)
    blocks = max(1, min(ceil_div(rows, warps // split), resident))
    # into the weight's dtype; an sm_80 build, as the other small kernels
    column_sums = column_sums_kernel.specialize(DT=dtype_constant(dtype).get("DT", bf16), target="sm_80")
    return backward[(blocks,)], column_sums[(ceil_div(width, 32),)], blocks, width


def backward_layout(d: int) -> tuple[int, int]:
    """(WARPS, SPLIT) for the backward: a warp takes at most 1024 columns of a row (32 a lane: s, dy, the next
    row's s and dy, the weight and the partial sums of dy·x̂ and dy in ~250 registers, no spills (ptxas)). Rows of
    up to 1024 columns: a row a warp, 8 warps a block, with no exchanges and an eighth of the partial rows (16384
    and 65536 rows × 1024 on an H100: RESULTS "norms' backward probe — 2026-12-05 15:58 and 16:16"); wider rows:
    over the fewest warps that hold them, all of the block's, two blocks or more a multiprocessor up to D = 4096;
    from there a block fills its multiprocessor alone, and 16 warps hide its barriers better than 8 (8192×8192:
    0.90 of the copy from a graph with 16 warps of 512 columns, 0.83 with 8 of 1024; 16384×4096: 0.89 with 4 warps
    of 1024, 2 blocks an SM, 0.77 / 0.74 with 8 / 16 warps, 1 block an SM; RESULTS "... 16:24")."""
    if d <= 1024:
        warps = 8
        while d % (16 * warps):
            warps //= 2
        return warps, 1
    splits = [split for split in (2, 4, 8, 16) if d % (16 * split) == 0]
    if not splits:
        return 1, 1  # an odd multiple of 16: a row a warp, whatever its registers
    split = next((split for split in splits if d // split <= 1024), splits[-1])
    if d > 4096:
        split = splits[-1]
    return split, split
