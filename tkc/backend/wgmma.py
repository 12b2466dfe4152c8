"""Hopper warpgroup mma (`wgmma.mma_async`, sm_90a) as data: shared-memory matrix descriptors for tkc's shared
tiles, the bytes a descriptor makes the tensor cores read, and the register fragments of the accumulator and of an
A operand held in registers. The lowering builds descriptors with these functions and the simulator reads shared
memory through `operand_addresses`, so the two agree by construction and the tests check both against the PTX
ISA's canonical layouts (§9.7.15.5.1.2) and the descriptor constants seen working on the H200
(shared/docs/hopper-ptx.md §3).

A 64-bit descriptor: bits 0–13 start address >> 4, 16–29 leading byte offset (LBO) >> 4, 32–45 stride byte offset
(SBO) >> 4, 62–63 swizzle (1 = 128 B, 2 = 64 B, 3 = 32 B, 0 = none). A wgmma takes 32 bytes of K: k16 for
bf16 / f16 operands, k32 for fp8 (e4m3 / e5m2, K-major only). For tkc's swizzled tiles (column panels S bytes
wide, see shared_layout.py):

    K-major  (tile rows = M or N, cols = K; A, or B given N×K): start = panel of chunk c + (32·c mod S),
             SBO = 8 rows · S, LBO unused (16)
    MN-major (tile rows = K, cols = N; B given K×N, immTransB = 1): start = 16·c rows · S,
             LBO = one panel (K rows · S), SBO = 8 rows · S
"""

from __future__ import annotations

import numpy as np

from tkc.ir.types import SharedTileType, element_bytes

SWIZZLE_CODE = {0: 0, 128: 1, 64: 2, 32: 3}
SWIZZLE_OF_CODE = {code: s for s, code in SWIZZLE_CODE.items()}
K_BYTES = 32  # bytes of K per wgmma: 16 elements of bf16 / f16, 32 of fp8
WARPGROUP = 128


def k_step(elem_bytes: int) -> int:
    """Elements of K one wgmma takes for operands of `elem_bytes` bytes (16, or 32 for fp8)."""
    return K_BYTES // elem_bytes


def descriptor(start: int, lbo: int, sbo: int, swizzle: int) -> int:
    """Encode a shared-memory matrix descriptor (addresses and offsets in bytes, multiples of 16)."""
    for name, value in (("start address", start), ("LBO", lbo), ("SBO", sbo)):
        if value % 16:
            raise ValueError(f"descriptor {name} must be a multiple of 16 bytes, got {value}")
    if swizzle not in SWIZZLE_CODE:
        raise ValueError(f"swizzle must be one of {sorted(SWIZZLE_CODE)}, got {swizzle}")
    return (((start & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32)
            | (SWIZZLE_CODE[swizzle] << 62))


def decode(desc: int) -> tuple[int, int, int, int]:
    """(start, LBO, SBO, swizzle bytes) of a descriptor."""
    return ((desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4,
            SWIZZLE_OF_CODE[(desc >> 62) & 3])


def swizzled(address: np.ndarray, swizzle: int) -> np.ndarray:
    """The byte address the swizzle puts `address` at: the 16-byte chunk index XOR the 128-byte line index."""
    if swizzle == 0:
        return address
    return address ^ (((address >> 7) & (swizzle // 16 - 1)) << 4)


def operand_descriptor(tile: SharedTileType, base: int, chunk: int, major: str, panel_rows: int | None = None) -> int:
    """The descriptor of K step `chunk` (32 bytes of K) of shared tile `tile` (starting at shared byte address `base`, aligned to
    the swizzle's repeat) read as a wgmma operand. `major` is "K" (the tile is rows × K) or "MN" (K × cols).
    `panel_rows`: for a view of rows of a taller tile, the rows between its column panels."""
    swizzle = tile.swizzle or 0
    if swizzle == 0:
        raise ValueError(f"{tile}: a wgmma operand must be a swizzled shared tile")
    rows = panel_rows or tile.shape[0]
    e = element_bytes(tile.element_type)
    if major == "K":
        kbyte = chunk * K_BYTES
        start = base + (kbyte // swizzle) * rows * swizzle + kbyte % swizzle
        return descriptor(start, 16, 8 * swizzle, swizzle)
    if major == "MN":
        return descriptor(base + chunk * k_step(e) * swizzle, rows * swizzle, 8 * swizzle, swizzle)
    raise ValueError(f"major must be 'K' or 'MN', got {major!r}")


def operand_addresses(desc: int, extent: int, major: str, elem_bytes: int = 2) -> np.ndarray:
    """Shared byte address the tensor cores read for element (i, k) of an operand given by descriptor `desc`:
    i < extent along M (or N), k < 32 bytes of K (16 or 32 elements). An [extent, K step] int array, from the
    canonical layouts."""
    start, lbo, sbo, swizzle = decode(desc)
    i = np.arange(extent)[:, None]
    k = np.arange(k_step(elem_bytes))[None, :]
    if major == "K":
        if swizzle:  # rows of `swizzle` bytes, 8-row atoms SBO apart
            linear = start + (i % 8) * swizzle + (i // 8) * sbo + k * elem_bytes
        else:  # 8×16-byte core matrices: SBO between 8-row groups, LBO between the two halves of K
            per_core = 16 // elem_bytes  # elements of K in a core matrix's 16-byte row
            linear = start + (i % 8) * 16 + (i // 8) * sbo + (k // per_core) * lbo + (k % per_core) * elem_bytes
    elif major == "MN":
        if elem_bytes != 2:
            raise ValueError("an MN-major wgmma operand must have 16-bit elements (fp8 operands are K-major)")
        if swizzle:  # K rows of `swizzle` bytes of contiguous MN; LBO between MN panels, SBO between 8-row groups
            per_row = swizzle // elem_bytes
            linear = start + (i % per_row) * elem_bytes + (i // per_row) * lbo + (k % 8) * swizzle + (k // 8) * sbo
        else:
            linear = start + (i % 8) * elem_bytes + (i // 8) * sbo + (k % 8) * 16 + (k // 8) * lbo
    else:
        raise ValueError(f"major must be 'K' or 'MN', got {major!r}")
    return swizzled(np.broadcast_to(linear, (extent, k_step(elem_bytes))).astype(np.int64), swizzle)


def accumulator_fragment(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of f32 accumulator register i of warpgroup thread t for `m64nNk16`: two [128, N/2] arrays."""
    t = np.arange(WARPGROUP)[:, None]
    i = np.arange(n // 2)[None, :]
    w, lane = t // 32, t % 32
    row = 16 * w + lane // 4 + 8 * ((i >> 1) & 1)
    col = 8 * (i >> 2) + 2 * (lane % 4) + (i & 1)
    return np.broadcast_to(row, (WARPGROUP, n // 2)), np.broadcast_to(col, (WARPGROUP, n // 2))


def a_fragment() -> tuple[np.ndarray, np.ndarray]:
    """(row, k) of bf16 element e (0–7; register e // 2, low half first) of warpgroup thread t for an A operand in
    registers (`m64nNk16`): two [128, 8] arrays (the mma.m16n8k16 A layout, per warp on rows 16w..16w+15)."""
    t = np.arange(WARPGROUP)[:, None]
    e = np.arange(8)[None, :]
    w, lane = t // 32, t % 32
    row = 16 * w + lane // 4 + 8 * ((e >> 1) & 1)
    k = 2 * (lane % 4) + (e & 1) + 8 * (e >> 2)
    return np.broadcast_to(row, (WARPGROUP, 8)), np.broadcast_to(k, (WARPGROUP, 8))
