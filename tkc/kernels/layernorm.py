"""LayerNorm with a fused residual add: s = x + residual; out = (s - mean(s)) / sqrt(var(s) + eps) · w + b."""

import tkc
from tkc.lang import *  # noqa: F403


@tkc.kernel(warps=4, min_target="sm_80")
def layernorm_kernel(X: gl[bf16, 2], Residual: gl[bf16, 2], Weight: gl[bf16, 1], Bias: gl[bf16, 1],
                     Out: gl[bf16, 2], OutResidual: gl[bf16, 2], eps: float, D: const = 1024):
    """Rows of length D (a multiple of 16). Writes the normalized rows to Out and x + residual to OutResidual.
    Grid: (cdiv(rows, 4),): one warp per row; the block shares the weight and bias through shared memory."""
    row = block_idx()[0] * 4 + warp_id()
    w = load(load(Weight, (0,), sv[bf16, D]), (0,), rv[f32, D])
    bias = load(load(Bias, (0,), sv[bf16, D]), (0,), rv[f32, D])
    s = load(X, (row, 0), rv[f32, D]) + load(Residual, (row, 0), rv[f32, D])
    store(OutResidual, s, (row, 0))
    mean = sum(s) / D
    centered = s - mean
    rstd = rsqrt(sum(centered * centered) / D + eps)
    store(Out, centered * rstd * w + bias, (row, 0))
