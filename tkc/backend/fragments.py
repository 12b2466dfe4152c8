"""Where each element of a register tile or vector lives: (lane, register, half) for every layout.

Register tiles are built from 16×16 sub-tiles in the fragment layouts of `mma.m16n8k16` (PTX ISA, "Matrix
Fragments for mma.m16n8k16"); g = lane / 4, q = lane % 4. Sub-tile (si, sj) of an R×C tile is number
si·(C/16) + sj, and its registers follow one another.

    row layout, 16-bit:  reg k (0..3) holds (r, c) and (r, c+1), r = g + 8·(k%2), c = 2q + 8·(k/2)
    row layout, f32:     reg e (0..7) holds (r, c),               r = g + 8·((e/2)%2), c = 2q + e%2 + 8·(e/4)
    col layout:          the row layout of the transposed tile: (r, c) ↔ (c, r)

So the row layout is both the A operand and the accumulator of mma, and the col layout is the B operand of
`mma_AB` (a B given N×K, as in `mma_ABt`, is in row layout). The linear layout (tiles that meet only elementwise
ops and global memory) gives each lane 8 consecutive columns of a row, one 16-byte access of a 16-bit tile:

    linear, 16-bit:      reg 4t + j holds (r, c) and (r, c+1), r = 16·si + g + 8h, c = 8·(4b + q) + 2j,
                         t = (si·(C/32) + b)·2 + h (row tile si, 32-column group b, row half h)
    linear, f32:         reg 8t + e holds (r, c + e) for the same r and c = 8·(4b + q)

(a row-layout tile's registers become the linear layout's by a transpose of each quad's 4×4 words:
lower_memory.quad_transpose). Register vectors:

    align:  2 regs per 16 elements; reg 2b+h holds element 16b + g + 8h (the rows of a row-layout tile)
    ortho:  4 regs per 16 elements; reg 4b+e holds element 16b + 2q + e%2 + 8·(e/2) (its columns)
    naive:  chunks of V ≤ 8 consecutive elements round-robin over the lanes: lane l, reg j holds
            element ((j / V)·32 + l)·V + j % V; lanes past the end of a short vector hold padding
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
from xdsl.dialects.builtin import Float32Type
from xdsl.ir import Attribute

from tkc.ir.types import Layout, RegTileType, RegVecType

LANES = 32
LANE = np.arange(LANES)
G, Q = LANE // 4, LANE % 4


def is_packed(element_type: Attribute) -> bool:
    """16-bit elements travel in pairs, one pair per 32-bit register."""
    return not isinstance(element_type, Float32Type)


@dataclass(frozen=True)
class TileFragment:
    """The register image of a register tile: `elements[lane, reg, half]` = (row, col) of the element held
    there (half is 0 for f32 tiles, 0/1 = low/high 16 bits for packed tiles)."""

    rows: int
    cols: int
    layout: Layout
    packed: bool

    @property
    def regs_per_subtile(self) -> int:
        return 4 if self.packed else 8

    @property
    def halves(self) -> int:
        return 2 if self.packed else 1

    @property
    def subtiles(self) -> tuple[int, int]:
        return self.rows // 16, self.cols // 16

    @property
    def nregs(self) -> int:
        si, sj = self.subtiles
        return si * sj * self.regs_per_subtile

    def subtile_index(self, si: int, sj: int) -> int:
        return si * self.subtiles[1] + sj

    def reg(self, si: int, sj: int, k: int) -> int:
        """Register k of sub-tile (si, sj)."""
        return self.subtile_index(si, sj) * self.regs_per_subtile + k

    @property
    def elements(self) -> np.ndarray:
        """int array [lane, reg, half, 2] of (row, col)."""
        return _tile_elements(self.rows, self.cols, self.layout, self.packed)


@cache
def _tile_elements(rows: int, cols: int, layout: Layout, packed: bool) -> np.ndarray:
    if layout == Layout.LINEAR:
        return _linear_elements(rows, cols, packed)
    # Build in the row layout of the (possibly transposed) tile, then swap coordinates for col.
    r_, c_ = (rows, cols) if layout == Layout.ROW else (cols, rows)
    per = 4 if packed else 8
    halves = 2 if packed else 1
    out = np.zeros((LANES, (r_ // 16) * (c_ // 16) * per, halves, 2), dtype=np.int64)
    for si in range(r_ // 16):
        for sj in range(c_ // 16):
            base = (si * (c_ // 16) + sj) * per
            for k in range(per):
                if packed:
                    r = 16 * si + G + 8 * (k % 2)
                    c = 16 * sj + 2 * Q + 8 * (k // 2)
                    for h in range(2):
                        out[:, base + k, h] = np.stack([r, c + h], axis=-1)
                else:
                    r = 16 * si + G + 8 * ((k // 2) % 2)
                    c = 16 * sj + 2 * Q + k % 2 + 8 * (k // 4)
                    out[:, base + k, 0] = np.stack([r, c], axis=-1)
    if layout == Layout.COL:
        out = out[..., ::-1].copy()
    out.setflags(write=False)
    return out


def _linear_elements(rows: int, cols: int, packed: bool) -> np.ndarray:
    halves = 2 if packed else 1
    out = np.zeros((LANES, rows * cols // LANES // halves, halves, 2), dtype=np.int64)
    per = 8 // halves  # registers of one lane's 8 columns
    for t, (si, b, h) in enumerate((si, b, h) for si in range(rows // 16) for b in range(cols // 32) for h in range(2)):
        r, c = 16 * si + G + 8 * h, 8 * (4 * b + Q)
        for k in range(per):
            for half in range(halves):
                out[:, per * t + k, half] = np.stack([r, c + halves * k + half], axis=-1)
    out.setflags(write=False)
    return out


def tile_fragment(t: RegTileType) -> TileFragment:
    if t.layout is None:
        raise ValueError(f"{t} has no layout assigned")
    return TileFragment(t.rows.data, t.cols.data, t.layout, is_packed(t.element_type))


@dataclass(frozen=True)
class VectorFragment:
    """The register image of a register vector: `elements[lane, reg]` = element index, or -1 for padding.
    Vectors hold one element per 32-bit register (16-bit elements in the low half)."""

    length: int
    layout: Layout

    @property
    def chunk(self) -> int:
        for v in (8, 4, 2):  # 8 elements: a 16-byte access per lane for 16-bit vectors, two for f32
            if self.length % (LANES * v) == 0:
                return v
        return 1

    @property
    def nregs(self) -> int:
        if self.layout == Layout.ALIGN:
            return self.length // 8
        if self.layout == Layout.ORTHO:
            return self.length // 4
        return max(1, -(-self.length // (LANES * self.chunk))) * self.chunk

    @property
    def elements(self) -> np.ndarray:
        positions = self.positions
        return np.where(positions < self.length, positions, -1)

    @property
    def positions(self) -> np.ndarray:
        """Like `elements`, but padding slots keep the position the pattern gives them past the end (so that
        addresses stay regular; accesses to them are predicated off)."""
        return _vector_positions(self.length, self.layout)

    def valid_lanes(self) -> np.ndarray:
        """Per register, how many lanes (0, 1, ...) hold a real element; the rest hold padding."""
        valid = self.elements >= 0
        counts = valid.sum(axis=0)
        assert (valid == (LANE[:, None] < counts[None, :])).all()
        return counts


@cache
def _vector_positions(length: int, layout: Layout) -> np.ndarray:
    if layout == Layout.ALIGN:
        out = np.stack([16 * (j // 2) + G + 8 * (j % 2) for j in range(length // 8)], axis=1)
    elif layout == Layout.ORTHO:
        out = np.stack([16 * (j // 4) + 2 * Q + j % 2 + 8 * ((j % 4) // 2) for j in range(length // 4)], axis=1)
    else:
        frag = VectorFragment(length, layout)
        v = frag.chunk
        out = np.stack([((j // v) * LANES + LANE) * v + j % v for j in range(frag.nregs)], axis=1)
    out = out.astype(np.int64)
    out.setflags(write=False)
    return out


def vector_fragment(t: RegVecType) -> VectorFragment:
    if t.layout is None:
        raise ValueError(f"{t} has no layout assigned")
    return VectorFragment(t.length.data, t.layout)


def vector_of(tile_layout: Layout, axis: str) -> Layout:
    """The vector layout that matches a tile's rows (axis "row": one value per row) or columns."""
    per_row = (tile_layout == Layout.ROW) == (axis == "row")
    return Layout.ALIGN if per_row else Layout.ORTHO


def reduction_lanes(vector_layout: Layout) -> tuple[int, ...]:
    """Butterfly shuffle distances that combine the lanes holding parts of one vector element's reduction
    (for reductions of a tile along the axis this vector indexes): the other lanes of a quad for `align`,
    the other quads for `ortho`."""
    return (1, 2) if vector_layout == Layout.ALIGN else (4, 8, 16)


def tile_to_image(frag: TileFragment, regs: np.ndarray) -> np.ndarray:
    """Registers [lane, reg, half] → the R×C tile they hold (for tests and the simulator)."""
    out = np.full((frag.rows, frag.cols), np.nan, dtype=regs.dtype)
    el = frag.elements
    out[el[..., 0], el[..., 1]] = regs
    return out


def image_to_tile(frag: TileFragment, image: np.ndarray) -> np.ndarray:
    """The R×C tile → registers [lane, reg, half]."""
    el = frag.elements
    return image[el[..., 0], el[..., 1]]
