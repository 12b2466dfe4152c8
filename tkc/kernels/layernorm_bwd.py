"""LayerNorm's and RMSNorm's backward (of layernorm() / rmsnorm(), residual fused): with s the normalized input
(x + residual, or x), x̂ = (s - mean(s))·rstd (RMSNorm: s·rstd) and g = dy·w,

    ds = rstd·(g - mean(g) - x̂·mean(g·x̂))   (RMSNorm: rstd·(g - x̂·mean(g·x̂))),  plus the new residual's gradient
    dw = Σ_rows dy·x̂,  db = Σ_rows dy

and dx = dresidual = ds. The mean and rstd are recomputed from s (the forward keeps nothing but s itself)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tkc
from tkc.kernels._checks import cdiv as ceil_div  # `cdiv` is the DSL's, for kernels
from tkc.kernels._checks import cached_plan, dtype_constant, multiprocessors
from tkc.kernels.layernorm import row_total
from tkc.lang import *  # noqa: F403

if TYPE_CHECKING:
    import torch


@tkc.kernel(warps="WARPS", min_target="sm_80")
def layernorm_bwd_kernel(S: gl["DT", 2], dY: gl["DT", 2], dS: gl["DT", 2], Weight: gl["DT", 1], dX: gl["DT", 2],
                         Parts: gl[f32, 2], eps: float, D: const = 1024, WARPS: const = 1, DT: const = bf16,
                         RMS: const = 0, DS_IN: const = 0):
    """Rows of length D: S the forward's normalized input, dY the output's gradient, dS (with DS_IN) the new
    residual's; writes ds into dX and each block's partial sums of dy·x̂ and dy (RMS: dy·x̂ only) into row b of
    Parts (blocks, 2·D; RMS: D), side by side, which column_sums_kernel then adds up.

    Grid: (blocks,): block b takes rows b, b + blocks, ... (a few blocks a multiprocessor, each keeping its partial
    sums in registers over its rows), reading the next row's s and dy while it reduces this one (past the last row
    they read zeros, unused). A row is spread over the WARPS warps, D / WARPS columns each; the row sums are
    block-wide through shared memory, as in layernorm_kernel.
    """
    static_assert(D % (16 * WARPS) == 0, f"D ({D}) must be a multiple of 16 · WARPS ({16 * WARPS})")
    COLS = D // WARPS
    part = warp_id()                                             # this warp's columns, in units of COLS
    scratch = empty(sv[f32, 16 * WARPS])
    dw, db = zeros(rv[f32, COLS]), zeros(rv[f32, COLS])
    first, stride = block_idx()[0], num_blocks()[0]
    s_next, dy_next = load(S, (first, part), rv[f32, COLS]), load(dY, (first, part), rv[f32, COLS])
    for row in range(first, S.shape[0], stride):
        s, dy = s_next, dy_next
        s_next, dy_next = load(S, (row + stride, part), rv[f32, COLS]), load(dY, (row + stride, part), rv[f32, COLS])
        centered = s if RMS else s - row_total(sum(s), scratch, WARPS) / D
        rstd = rsqrt(row_total(sum(centered * centered), scratch, WARPS) / D + eps)
        x_hat = centered * rstd
        g = dy * load(Weight, (part,), rv[f32, COLS])
        dw = dw + dy * x_hat
        if not RMS:
            db = db + dy
        mean_gx = row_total(sum(g * x_hat), scratch, WARPS) / D
        if RMS:
            ds = (g - x_hat * mean_gx) * rstd
        else:
            ds = (g - row_total(sum(g), scratch, WARPS) / D - x_hat * mean_gx) * rstd
        if DS_IN:
            ds = ds + load(dS, (row, part), rv[f32, COLS])
        store(dX, ds, (row, part))
    store(Parts, dw, (first, part))
    if not RMS:
        store(Parts, db, (first, WARPS + part))


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


BLOCKS_PER_SM = 4  # the backward's grid: blocks a multiprocessor (each sums dy·x̂ and dy over its rows)


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
        _PLANS, (rows, d, s.dtype, s.get_device(), rms, grad_s is not None, target, BLOCKS_PER_SM), _plan)
    ds, device = torch.empty_like(s), s.device
    parts = torch.empty((blocks, width), dtype=torch.float32, device=device)
    totals = torch.empty(width, dtype=weight.dtype, device=device)
    backward(s, grad_y, s if grad_s is None else grad_s, weight, ds, parts, eps)
    column_sums(parts, totals)
    return ds, totals[:d], None if rms else totals[d:]


_PLANS: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # layernorm_backward's launches by (rows, D, dtype, device, ...)


def _plan(rows: int, d: int, dtype: Any, device: int, rms: bool, ds_in: bool, target: str | None,
          blocks_per_sm: int) -> tuple[Any, ...]:
    """layernorm_backward's two launches bound to their grids, its blocks and the partial sums' width: the backward
    kernel on a few blocks a multiprocessor (at most a block a row), then column_sums_kernel over the blocks'
    partial rows."""
    blocks = max(1, min(rows, blocks_per_sm * multiprocessors(device)))
    width = d if rms else 2 * d  # dw, and db: side by side, summed together
    backward = layernorm_bwd_kernel.specialize(D=d, WARPS=backward_warps(d), RMS=int(rms), DS_IN=int(ds_in),
                                               target=target, **dtype_constant(dtype))
    # into the weight's dtype; an sm_80 build, as the other small kernels
    column_sums = column_sums_kernel.specialize(DT=dtype_constant(dtype).get("DT", bf16), target="sm_80")
    return backward[(blocks,)], column_sums[(ceil_div(width, 32),)], blocks, width


def backward_warps(d: int) -> int:
    """Warps a row for the backward: up to 16, until a warp's share is at most 256 columns. It holds more of a row
    than the forward (s, dy, the weight, ds, and the partial sums of dy·x̂ and dy): the forward's warps (up to 1024
    columns each) take 225-255 registers a thread from D = 4096 (ptxas), 256 columns 48-63."""
    warps = 1
    while warps < 16 and d // warps > 256 and d % (32 * warps) == 0:
        warps *= 2
    return warps
