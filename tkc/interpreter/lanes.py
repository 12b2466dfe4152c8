"""How the tile interpreter lays out values: the whole grid runs at once, vectorized over blocks and warps.

Every run-time value is a numpy array whose first two axes are (block, warp). An axis has size 1 when the value
is the same along it, so uniform values stay small and numpy broadcasting does the rest:

    i32 / f32 / i1 scalar   (B|1, W|1)              int64 / float32 / bool
    register tile rt        (B|1, W|1, rows, cols)  float32, rounded to the tile's dtype
    register vector rv      (B|1, W|1, length)
    shared tile st          (B|1, 1, rows, cols)    one per block: warps see the same contents
    shared vector sv        (B|1, 1, length)
    global tensor gl        a GlobalTensor

Control flow that differs between lanes runs under a mask of active (block, warp) lanes; stores write only where
active, and values merged after a branch or a loop select per lane.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
from xdsl.dialects.builtin import BFloat16Type, Float8E4M3FNType, Float8E5M2Type, Float16Type, Float32Type, IntegerType
from xdsl.ir import Attribute

from tkc.errors import TkcError

LANE_AXES = 2


def round_to(x: np.ndarray, element_type: Attribute) -> np.ndarray:
    """Values rounded to `element_type` (round to nearest even), held as float32."""
    x = np.asarray(x, dtype=np.float32)
    if isinstance(element_type, BFloat16Type):
        return x.astype(ml_dtypes.bfloat16).astype(np.float32)
    if isinstance(element_type, Float16Type):
        with np.errstate(over="ignore"):  # past f16's range is inf: the rounding rule, not a mistake to warn of
            return x.astype(np.float16).astype(np.float32)
    if isinstance(element_type, Float32Type | IntegerType):  # (i32: counters, whole numbers exact in float32)
        return x
    if isinstance(element_type, Float8E4M3FNType | Float8E5M2Type):  # saturating, as cvt.satfinite
        fp8 = ml_dtypes.float8_e4m3fn if isinstance(element_type, Float8E4M3FNType) else ml_dtypes.float8_e5m2
        limit = float(ml_dtypes.finfo(fp8).max)
        return np.where(np.isnan(x), x, np.clip(x, -limit, limit)).astype(fp8).astype(np.float32)
    raise TkcError(f"no rounding rule for {element_type}")


@dataclass
class GlobalTensor:
    """A global tensor argument: a working copy of the user's array (float32; int64 for integer tensors), written
    back after the run."""

    name: str
    data: np.ndarray
    element_type: Attribute
    user_array: object  # what the caller passed, to write back into
    written: bool = False


@dataclass
class LaneState:
    """The grid being interpreted and the mask of lanes active at this point of the program."""

    grid: tuple[int, int, int]
    warps: int
    mask_stack: list[np.ndarray] = field(default_factory=list)
    roles: list[np.ndarray] = field(default_factory=list)  # warps of the current role (warp-specialized kernels)

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    def block_index(self, dim: int) -> np.ndarray:
        b = np.arange(self.blocks, dtype=np.int64)
        gx, gy, _ = self.grid
        index = (b % gx, (b // gx) % gy, b // (gx * gy))[dim]
        return index.reshape(-1, 1)

    def warp_index(self) -> np.ndarray:
        return np.arange(self.warps, dtype=np.int64).reshape(1, -1)

    @property
    def mask(self) -> np.ndarray | None:
        return self.mask_stack[-1] if self.mask_stack else None

    def push_mask(self, active: np.ndarray) -> None:
        current = self.mask
        self.mask_stack.append(active if current is None else (current & active))

    def pop_mask(self) -> None:
        self.mask_stack.pop()

    def active(self) -> np.ndarray:
        """The active lanes as a (B|1, W|1) bool array."""
        return self.mask if self.mask is not None else np.ones((1, 1), dtype=bool)

    def require_block_uniform(self, what: str) -> None:
        """Collective ops (those on shared memory) need all warps of a block (of its role, in a warp-specialized
        kernel) to take the same path."""
        mask = self.mask
        if mask is None or mask.shape[1] <= 1:
            return
        if self.roles:
            role = np.broadcast_to(self.roles[-1], mask.shape)
            if (np.where(role, mask, True).all(axis=1) == np.where(role, mask, False).any(axis=1)).all():
                return
        elif (mask == mask[:, :1]).all():
            return
        raise TkcError(f"{what} runs under control flow that differs between the warps of a block")

    def in_role(self) -> bool:
        return bool(self.roles)

    def active_blocks(self) -> np.ndarray:
        """(blocks,) whether any warp of each block runs here (after require_block_uniform: all of its role)."""
        return np.broadcast_to(self.active().any(axis=1), (self.blocks,)).copy()


def lanes_of(value: np.ndarray) -> tuple[int, int]:
    return value.shape[0], value.shape[1]


def expand_to(mask: np.ndarray, value: np.ndarray) -> np.ndarray:
    """A (B|1, W|1) mask with trailing axes added to broadcast against `value`."""
    return mask.reshape(mask.shape + (1,) * (value.ndim - LANE_AXES))


def select(cond: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per lane: a where cond holds, else b."""
    a, b = np.asarray(a), np.asarray(b)
    ndim = max(a.ndim, b.ndim)
    return np.where(cond.reshape(cond.shape + (1,) * (ndim - LANE_AXES)), a, b)


def block_uniform(value: np.ndarray, what: str) -> np.ndarray:
    """`value` with its warp axis reduced to 1, after checking that every warp of a block agrees."""
    if value.shape[1] > 1:
        first = value[:, :1]
        if not np.array_equal(value, np.broadcast_to(first, value.shape), equal_nan=value.dtype.kind == "f"):
            raise TkcError(f"{what} differs between the warps of a block, but the op is collective over the block")
        return first
    return value
