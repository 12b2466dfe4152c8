"""Row softmax of an (M, N) matrix: Y[i, :] = softmax(X[i, :]). N is a compile-time constant; each warp takes
16 rows."""

import tkc
from tkc.lang import *  # noqa: F403

WARPS = 4


@tkc.kernel(warps=WARPS, min_target="sm_80")
def row_softmax(X: gl[bf16, 2], Y: gl[bf16, 2], N: const = 128):
    """X, Y: (M, N). Grid: (cdiv(M, 16 * WARPS),).

    Rows past M read zeros and their stores are dropped. When N is not a multiple of 16 the tile is padded to
    NP columns; the padding reads zeros, so it is pushed to -inf before the max and the sum. (The language has no
    column mask, so the mask vector is built from a triangle: column j of tril(0, N-1, fill=-inf) is 0 in every
    row exactly when j < N, and its column minimum is the mask.)
    """
    NP = cdiv(N, 16) * 16
    row = block_idx()[0] * WARPS + warp_id()
    x = load(X, (row, 0), rt[f32, 16, NP])
    if NP != N:
        x = add_col(x, col_min(tril(zeros(rt[f32, 16, NP]), N - 1, -float("inf"))))
    p = exp(sub_row(x, row_max(x)))
    store(Y, div_row(p, row_sum(p)).to(bf16), (row, 0))
