"""LayerNorm with a fused residual add: s = x + residual; out = (s - mean(s)) / sqrt(var(s) + eps) · w + b."""

from __future__ import annotations

from typing import TYPE_CHECKING

import tkc
from tkc.lang import *  # noqa: F403

if TYPE_CHECKING:
    import torch

WARPS = 4


@tkc.kernel(warps=WARPS, min_target="sm_80")
def layernorm_kernel(X: gl[bf16, 2], Residual: gl[bf16, 2], Weight: gl[bf16, 1], Bias: gl[bf16, 1],
                     Out: gl[bf16, 2], OutResidual: gl[bf16, 2], eps: float, D: const = 1024, CHUNK: const = 512):
    """Rows of length D. Writes the normalized rows to Out and x + residual to OutResidual.

    Grid: (blocks,): the block's warps take rows round-robin (warp w of block b: rows 4b + w, then every
    4·blocks rows), so a grid of a few blocks per multiprocessor covers any number of rows. The block keeps the
    weight and bias in shared memory. A row is read in chunks of CHUNK columns, twice: the first pass only loads and
    accumulates (nothing waits on a store, so loads stay in flight) and reduces across the warp once; the second
    adds the residual again, writes both outputs, and normalizes in f32.
    """
    static_assert(D % CHUNK == 0, f"D ({D}) must be a multiple of CHUNK ({CHUNK})")
    w_s, b_s = load(Weight, (0,), sv[bf16, D]), load(Bias, (0,), sv[bf16, D])
    stride = num_blocks()[0] * WARPS
    for row in range(block_idx()[0] * WARPS + warp_id(), X.shape[0], stride):
        acc, acc_sq = zeros(rv[f32, CHUNK]), zeros(rv[f32, CHUNK])
        for c in runtime_range(D // CHUNK):
            s = load(X, (row, c), rv[f32, CHUNK]) + load(Residual, (row, c), rv[f32, CHUNK])
            acc, acc_sq = acc + s, acc_sq + s * s
        mean = sum(acc) / D
        rstd = rsqrt(max(sum(acc_sq) / D - mean * mean, 0.0) + eps)
        for c in runtime_range(D // CHUNK):
            s = load(X, (row, c), rv[f32, CHUNK]) + load(Residual, (row, c), rv[f32, CHUNK])
            store(OutResidual, s, (row, c))
            w, b = load(w_s, (c,), rv[f32, CHUNK]), load(b_s, (c,), rv[f32, CHUNK])
            store(Out, (s - mean) * rstd * w + b, (row, c))


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
    chunk = next(c for c in (512, 256, 128, 64, 32, 16) if d % c == 0)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    blocks = max(1, min(-(-x2.shape[0] // WARPS), 8 * sms))
    layernorm_kernel[(blocks,)](x2, r2, weight, bias, o2, ro2, float(eps), D=d, CHUNK=chunk, target=target)
    return out, residual_out
