"""LayerNorm with a fused residual add: s = x + residual; out = (s - mean(s)) / sqrt(var(s) + eps) · w + b."""

from __future__ import annotations

from typing import TYPE_CHECKING

import tkc
from tkc.lang import *  # noqa: F403

if TYPE_CHECKING:
    import torch


@tkc.func
def block_sum(x, scratch, warps):
    """The sum of the f32 scalar `x` over the block's `warps` warps, which all get it: each warp writes 16 copies
    of its value into its slot of a shared vector, then every warp adds the vector up, one element per lane at a
    time (wider reads would conflict on banks)."""
    slots = store(scratch, zeros(rv[f32, 16]) + x, (warp_id(),))
    n = 32 if warps % 2 == 0 else 16
    partial = load(slots, (0,), rv[f32, n])
    for i in range(1, 16 * warps // n):
        partial = partial + load(slots, (i,), rv[f32, n])
    return sum(partial) / 16


@tkc.kernel(warps="WARPS", min_target="sm_80")
def layernorm_kernel(X: gl[bf16, 2], Residual: gl[bf16, 2], Weight: gl[bf16, 1], Bias: gl[bf16, 1],
                     Out: gl[bf16, 2], OutResidual: gl[bf16, 2], eps: float, D: const = 1024, WARPS: const = 1):
    """Rows of length D. Writes the normalized rows to Out and x + residual to OutResidual.

    Grid: (blocks,): block b takes rows b, b + blocks, ... A row is spread over the block's WARPS warps, D / WARPS
    columns each, and stays in registers: x and the residual are read once, both outputs written once, and the
    mean and the variance (of the centered row, exactly) are block-wide sums through shared memory.
    """
    static_assert(D % (16 * WARPS) == 0, f"D ({D}) must be a multiple of 16 · WARPS ({16 * WARPS})")
    COLS = D // WARPS
    part = warp_id()                                             # this warp's columns, in units of COLS
    scratch = empty(sv[f32, 16 * WARPS])
    for row in range(block_idx()[0], X.shape[0], num_blocks()[0]):
        s = load(X, (row, part), rv[f32, COLS]) + load(Residual, (row, part), rv[f32, COLS])
        store(OutResidual, s, (row, part))
        centered = s - block_sum(sum(s), scratch, WARPS) / D
        rstd = rsqrt(block_sum(sum(centered * centered), scratch, WARPS) / D + eps)
        # weight and bias come from L1 each row (8 KB at D = 4096) rather than sitting in 2·COLS/32 registers for
        # the whole kernel: fewer registers, more warps, more of x in flight.
        w, b = load(Weight, (part,), rv[f32, COLS]), load(Bias, (part,), rv[f32, COLS])
        store(Out, centered * rstd * w + b, (row, part))


_RESIDENT: dict[tuple, int] = {}  # (D, warps, target, device) → blocks resident at once


def layernorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5,
              target: str | None = None, out: torch.Tensor | None = None,
              residual_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer_norm(x + residual)·weight + bias, x + residual) for bf16 CUDA tensors of shape (..., D), with
    weight and bias of shape (D,). D must be a multiple of 16. Returns both (the second is the new residual
    stream of a pre-norm transformer)."""
    import torch

    from tkc.kernels._checks import check_tensor, require

    require(isinstance(x, torch.Tensor) and x.dim() >= 1, "x must be a tensor with at least one dimension")
    d = x.shape[-1]
    check_tensor("x", x, torch.bfloat16, x.dim())
    check_tensor("residual", residual, torch.bfloat16, x.dim())
    check_tensor("weight", weight, torch.bfloat16, 1)
    check_tensor("bias", bias, torch.bfloat16, 1)
    require(residual.shape == x.shape, f"residual: expected shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    require(weight.shape == (d,) and bias.shape == (d,), f"weight and bias must have shape ({d},)")
    require(d % 16 == 0, f"x: the normalized dimension must be a multiple of 16, got {d}")
    require(x.device == residual.device == weight.device == bias.device, "all tensors must be on the same device")

    def rows_of(name: str, t: torch.Tensor) -> torch.Tensor:
        try:
            return t.view(-1, d)
        except RuntimeError:
            raise tkc.TkcError(f"{name}: its leading dimensions cannot be flattened without a copy (strides "
                               f"{tuple(t.stride())}); make it contiguous") from None

    out = torch.empty_like(x) if out is None else out
    residual_out = torch.empty_like(x) if residual_out is None else residual_out
    for name, t in (("out", out), ("residual_out", residual_out)):
        check_tensor(name, t, torch.bfloat16, x.dim())
        require(t.shape == x.shape, f"{name}: expected shape {tuple(x.shape)}, got {tuple(t.shape)}")
    x2, r2, o2, ro2 = (rows_of(n, t) for n, t in (("x", x), ("residual", residual), ("out", out),
                                                  ("residual_out", residual_out)))
    warps = 1  # the most warps, a power of two, that leaves each at least 16 columns per lane
    while warps < 32 and d % (32 * warps) == 0 and d // (2 * warps) >= 512:
        warps *= 2
    args = (x2, r2, weight, bias, o2, ro2, float(eps))
    key = (d, warps, target, x.device)
    if key not in _RESIDENT:  # blocks stride over the rows: twice as many as the GPU holds at once measured best
        _RESIDENT[key] = layernorm_kernel.resident_blocks(*args, D=d, WARPS=warps, target=target)
    layernorm_kernel[(max(1, min(x2.shape[0], 2 * _RESIDENT[key])),)](*args, D=d, WARPS=warps, target=target)
    return out, residual_out
