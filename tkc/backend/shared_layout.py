"""Where element (row, col) of a shared tile sits, in bytes from the tile's start.

A shared tile with swizzle S ∈ {32, 64, 128} bytes is stored as column panels S bytes wide, one after the other,
each `rows × S` bytes, rows contiguous; inside the tile the 16-byte chunk index is XORed with the 128-byte line
index (the swizzle TMA writes and wgmma reads, PTX ISA §5.5.7 / CuTe `Swizzle<b,4,3>`):

    linear  = panel·rows·S + row·S + (col·e mod S)          panel = col·e div S
    address = linear ^ (((linear >> 7) & (S/16 - 1)) << 4)

Swizzle 0 means plain row-major rows. Every ldmatrix phase (8 rows × 16 bytes) and every row-contiguous copy
then touches 8 distinct 16-byte bank groups. Shared vectors are plain arrays.
"""

from __future__ import annotations

import numpy as np

from tkc.backend.index import Expr
from tkc.ir.types import SharedTileType, element_bytes

BANKS = 32
BANK_BYTES = 4


def swizzle_for(row_bytes: int) -> int:
    """The widest swizzle whose panel width divides a row (rows are at least 32 bytes wide)."""
    for s in (128, 64, 32):
        if row_bytes % s == 0:
            return s
    return 0


def tile_offset(t: SharedTileType, row: Expr | int, col: Expr | int) -> Expr | int:
    """Byte offset of element (row, col) in shared tile `t` (expressions or ints)."""
    rows, cols = t.shape
    e = element_bytes(t.element_type)
    s = t.swizzle or 0
    if s == 0:
        return row * (cols * e) + col * e
    colbyte = col * e
    linear = (colbyte // s) * (rows * s) + row * s + colbyte % s
    return linear ^ (((linear >> 7) & (s // 16 - 1)) << 4)


def tile_offsets(t: SharedTileType, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    return np.asarray(tile_offset(t, np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)))  # type: ignore[arg-type]


def conflict_degree(addresses: np.ndarray, nbytes: int) -> int:
    """How many shared-memory wavefronts one warp-wide access of `nbytes` per lane takes, over its ideal.

    `addresses` holds each lane's byte address (-1 for lanes that do not take part). Lanes reading the same
    4-byte word share it; accesses wider than 4 bytes are split into phases of 128 bytes the way the hardware
    does (8 lanes per phase for 16-byte accesses, 16 for 8-byte ones)."""
    addresses = np.asarray(addresses, dtype=np.int64)
    lanes_per_phase = max(1, 128 // max(nbytes, BANK_BYTES)) if nbytes > BANK_BYTES else 32
    worst = 1
    for start in range(0, len(addresses), lanes_per_phase):
        phase = addresses[start:start + lanes_per_phase]
        phase = phase[phase >= 0]
        if phase.size == 0:
            continue
        words = np.unique(np.concatenate([phase + k for k in range(0, max(nbytes, BANK_BYTES), BANK_BYTES)]) // BANK_BYTES)
        banks = words % BANKS
        worst = max(worst, int(np.bincount(banks, minlength=BANKS).max()))
    return worst
