"""TMA tensor maps for kernel launches: the 128-byte `CUtensorMap` of a torch tensor seen as a row-major matrix,
for boxes of a tile's shape and swizzle, built with `cuTensorMapEncodeTiled` (driver.tensor_map_2d) and cached,
since a training loop launches on the same tensors again and again.

A tensor of rank > 2 is seen as rows × (its last dimension) when its leading dimensions collapse into one (each
stride is the next one's times its size), which holds for the contiguous (B, H, N, D) tensors of attention; TMA
needs the row pitch and the address 16-byte aligned and the last dimension contiguous.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from tkc.errors import KernelArgumentError
from tkc.runtime import driver

CACHE_SIZE = 1024
_cache: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
_ELEMENT = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float8_e4m3fn": "u8", "float8_e5m2": "u8"}


def as_matrix(shape: Sequence[int], strides: Sequence[int], name: str = "tensor") -> tuple[int, int, int]:
    """(rows, cols, row stride in elements) of a tensor read as a row-major matrix, or a clear error."""
    if not shape:
        raise KernelArgumentError(f"{name}: a TMA load needs a tensor of rank 1 or more")
    cols = shape[-1]
    if cols > 1 and strides[-1] != 1:
        raise KernelArgumentError(f"{name}: its last dimension must be contiguous for TMA, got strides {tuple(strides)}")
    if len(shape) == 1:
        return 1, cols, cols
    pitch = strides[-2]
    rows = shape[-2]
    for d in range(len(shape) - 3, -1, -1):  # leading dimensions fold into rows while they are dense over the rest
        if shape[d] > 1 and strides[d] != strides[d + 1] * shape[d + 1]:
            raise KernelArgumentError(f"{name}: dimensions {d} and {d + 1} do not collapse into rows for TMA "
                                      f"(shape {tuple(shape)}, strides {tuple(strides)}); make it contiguous")
        rows *= shape[d]
    return rows, cols, pitch


def tensor_map(tensor: Any, box_rows: int, box_cols: int, swizzle: int, name: str = "tensor",
               stack: bool = False) -> bytes:
    """The tensor map of `tensor` for box_rows × box_cols boxes with `swizzle` (bytes), cached by address, shape,
    strides, dtype, box and swizzle. With `stack`, a map of every dimension whose boxes are one matrix (of the last
    two dimensions) deep: boxes stop at each matrix's end, and the outer dimensions may have any 16-byte strides."""
    shape, strides, ptr = tuple(tensor.shape), tuple(tensor.stride()), tensor.data_ptr()
    if 0 in shape:
        # nothing to copy (e.g. K = 0): a kernel's loop over it runs no steps, so the map is never used
        return bytes(128)
    key = (ptr, shape, strides, tensor.dtype, box_rows, box_cols, swizzle, stack)
    found = _cache.get(key)  # the launch path: one lookup per tensor map per launch
    if found is not None:
        _cache.move_to_end(key)
        return found
    element = _ELEMENT.get(str(tensor.dtype).removeprefix("torch."))
    if element is None:
        raise KernelArgumentError(f"{name}: TMA copies bf16, f16, f32 or fp8 tensors, got {tensor.dtype}")
    item = tensor.element_size()
    if stack:
        if len(shape) > 5 or (shape[-1] > 1 and strides[-1] != 1):
            raise KernelArgumentError(f"{name}: TMA reads tensors of at most 5 dimensions, the last contiguous; got "
                                      f"shape {tuple(shape)}, strides {tuple(strides)}")
        rows, cols, pitch = shape[-2], shape[-1], strides[-2]
        outer = [(n, st * item) for n, st in zip(shape[-3::-1], strides[-3::-1])]
    else:
        (rows, cols, pitch), outer = as_matrix(shape, strides, name), []
    if ptr % 16 or (rows > 1 and pitch * item % 16) or any(n > 1 and st % 16 for n, st in outer):
        raise KernelArgumentError(f"{name}: TMA needs a 16-byte aligned address and strides, got address "
                                  f"{ptr:#x} and strides {tuple(strides)} (elements)")
    try:
        tmap = driver.tensor_map_2d(ptr, rows, cols, pitch * item, box_rows, box_cols, swizzle, element, outer)
    except driver.TkcRuntimeError as e:  # what the driver refuses (e.g. overlapping rows), named by argument
        raise KernelArgumentError(f"{name}: TMA cannot read this tensor (shape {tuple(shape)}, strides "
                                  f"{tuple(strides)}): {e}; make it contiguous") from None
    _cache[key] = tmap
    if len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return tmap
