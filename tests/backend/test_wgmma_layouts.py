"""wgmma descriptors and fragments against the PTX ISA's canonical layouts and the constants that worked on the
H200 (shared/docs/hopper-ptx.md §2–3): the descriptor of every k16 step of a tkc shared tile makes the tensor cores
read exactly that step's elements, for each swizzle and both majors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from xdsl.dialects.builtin import BFloat16Type

from tkc.backend import wgmma
from tkc.backend.shared_layout import tile_offsets
from tkc.ir.types import SharedTileType

BF16 = BFloat16Type()


def _tile_bytes(tile: SharedTileType, values: np.ndarray, base: int) -> np.ndarray:
    """Shared memory (bytes) holding `values` in `tile`'s layout at byte address `base`."""
    rows, cols = tile.shape
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    memory = np.zeros(base + rows * cols * 2 + 4096, dtype=np.uint8)
    where = base + tile_offsets(tile, r, c)
    raw = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    memory[where] = raw & 0xFF
    memory[where + 1] = raw >> 8
    return memory


def _read(memory: np.ndarray, addresses: np.ndarray) -> np.ndarray:
    raw = memory[addresses].astype(np.uint16) | (memory[addresses + 1].astype(np.uint16) << 8)
    return raw.view(ml_dtypes.bfloat16).astype(np.float32)


@pytest.mark.parametrize("swizzle, rows, cols, expected", [
    (128, 64, 64, 0x4000004000010000),
    (64, 64, 32, 0x8000002000010000),
    (32, 64, 16, 0xC000001000010000),
])
def test_k_major_descriptors_are_the_ones_that_ran(swizzle: int, rows: int, cols: int, expected: int) -> None:
    tile = SharedTileType(BF16, rows, cols, swizzle)
    assert wgmma.operand_descriptor(tile, 0, 0, "K") == expected
    assert wgmma.operand_descriptor(tile, 0, 1, "K") - expected == (2 if cols * 2 > 32 else 64 * 32 // 16)


def test_mn_major_descriptor_is_the_one_that_ran() -> None:
    # B = V stored K×N (64×128 bf16) as two 128-byte panels: LBO 8192, SBO 1024, k16 step +2048 bytes.
    tile = SharedTileType(BF16, 64, 128, 128)
    assert wgmma.operand_descriptor(tile, 0, 0, "MN") == 0x4000004002000000
    assert wgmma.decode(wgmma.operand_descriptor(tile, 0, 1, "MN"))[0] == 2048


@pytest.mark.parametrize("swizzle", [32, 64, 128])
@pytest.mark.parametrize("rows, cols", [(64, 64), (128, 64), (64, 128), (256, 64)])
def test_k_major_steps_read_their_elements(swizzle: int, rows: int, cols: int) -> None:
    tile = SharedTileType(BF16, rows, cols, swizzle)
    values = np.random.default_rng(rows + cols + swizzle).standard_normal((rows, cols)).astype(np.float32)
    base = 3 * 1024
    memory = _tile_bytes(tile, values, base)
    expected = values.astype(ml_dtypes.bfloat16).astype(np.float32)
    for chunk in range(cols // 16):
        desc = wgmma.operand_descriptor(tile, base, chunk, "K")
        got = _read(memory, wgmma.operand_addresses(desc, rows, "K"))
        np.testing.assert_array_equal(got, expected[:, 16 * chunk:16 * chunk + 16])


@pytest.mark.parametrize("swizzle", [32, 64, 128])
@pytest.mark.parametrize("k_rows, n", [(64, 64), (64, 128), (32, 256), (128, 64)])
def test_mn_major_steps_read_their_elements(swizzle: int, k_rows: int, n: int) -> None:
    tile = SharedTileType(BF16, k_rows, n, swizzle)
    values = np.random.default_rng(k_rows + n + swizzle).standard_normal((k_rows, n)).astype(np.float32)
    base = 2 * 1024
    memory = _tile_bytes(tile, values, base)
    expected = values.astype(ml_dtypes.bfloat16).astype(np.float32)
    for chunk in range(k_rows // 16):
        desc = wgmma.operand_descriptor(tile, base, chunk, "MN")
        got = _read(memory, wgmma.operand_addresses(desc, n, "MN"))  # [n, k]
        np.testing.assert_array_equal(got, expected[16 * chunk:16 * chunk + 16, :].T)


def test_unswizzled_core_matrices_need_lbo_and_sbo_the_right_way_round() -> None:
    # What TMA with SWIZZLE_NONE and 8-element boxes lays down for a 64×16 K-major operand: each 8-column slice as
    # 8 stacked core matrices (1024 bytes), slices 1024 bytes apart → LBO 1024, SBO 128.
    values = np.random.default_rng(7).standard_normal((64, 16)).astype(np.float32)
    memory = np.zeros(16 * 1024, dtype=np.uint8)  # room for what the swapped descriptor reads (on the GPU: a fault)
    raw = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    for r in range(64):
        for k in range(16):
            a = (k // 8) * 1024 + r * 16 + (k % 8) * 2
            memory[a], memory[a + 1] = raw[r, k] & 0xFF, raw[r, k] >> 8
    expected = values.astype(ml_dtypes.bfloat16).astype(np.float32)
    right = wgmma.descriptor(0, 1024, 128, 0)
    assert right == 0x0000000800400000
    np.testing.assert_array_equal(_read(memory, wgmma.operand_addresses(right, 64, "K")), expected)
    swapped = wgmma.descriptor(0, 128, 1024, 0)
    assert not np.array_equal(_read(memory, wgmma.operand_addresses(swapped, 64, "K")), expected)


@pytest.mark.parametrize("n", [8, 64, 128, 256])
def test_accumulator_fragment_covers_the_tile_once(n: int) -> None:
    rows, cols = wgmma.accumulator_fragment(n)
    flat = rows * n + cols
    assert sorted(flat.ravel().tolist()) == list(range(64 * n))
    # A row lives in the 4 lanes of one quad: row reductions are two butterfly shuffles.
    assert all(len(set(rows[t].tolist())) == 2 for t in range(128))
    assert (rows[:, 0] == rows[:, 1]).all() and (rows[:, 2] == rows[:, 0] + 8).all()


def test_a_fragment_matches_the_mma_sync_layout_per_warp() -> None:
    from tkc.backend.fragments import TileFragment
    from tkc.ir.types import Layout

    rows, ks = wgmma.a_fragment()
    sync = TileFragment(16, 16, Layout.ROW, True).elements  # [lane, reg, half, (row, col)]
    for t in range(128):
        w, lane = divmod(t, 32)
        for e in range(8):
            r, c = sync[lane, e // 2, e % 2]
            assert (rows[t, e], ks[t, e]) == (16 * w + r, c)
