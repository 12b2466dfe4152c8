"""Rowwise fp8 quantization, the input scaled_mm's rowwise scales expect: Scale[i] = max_j |X[i, j]| / 448 and
Q[i, :] = X[i, :] / Scale[i] in e4m3 (storing an f32 tile into an fp8 tensor converts, saturating)."""

import tkc
from tkc.lang import *  # noqa: F403

WARPS = 4
E4M3_MAX = 448.0


@tkc.kernel(warps=WARPS, min_target="sm_90a")
def quantize_rows_fp8(X: gl[bf16, 2], Q: gl[fp8e4m3, 2], Scale: gl[f32, 1], CHUNK: const = 128):
    """X, Q: (M, N), Scale: (M,). Grid: (cdiv(M, 16 * WARPS),). Each warp takes 16 rows, CHUNK columns at a time:
    one pass for the rows' largest magnitudes, one to scale and convert (the columns past N read zeros)."""
    row = block_idx()[0] * WARPS + warp_id()
    chunks = cdiv(X.shape[1], CHUNK)
    amax = zeros(rv[f32, 16])
    for c in range(chunks):
        amax = max(amax, row_max(abs(load(X, (row, c), rt[f32, 16, CHUNK]))))
    scale = max(amax, 1e-12) / E4M3_MAX  # an all-zero row keeps a finite scale
    for c in range(chunks):
        store(Q, div_row(load(X, (row, c), rt[f32, 16, CHUNK]), scale), (row, c))
    store(Scale, scale, (row,))
