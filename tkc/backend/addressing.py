"""Address arithmetic the memory lowerings share (lower_memory.py, lower_copies.py, lower_tma.py): shared buffers'
addresses (hoisted to the kernel's entry), byte offsets inside a shared tile, 64-bit global pointers advanced over
indices, bounds predicates, and gathering single registers into one bundle. Immediates (`Imm`) fold: a constant
index or a zero offset costs no instruction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.dialects.builtin import IntegerAttr
from xdsl.ir import Operation, SSAValue

from tkc.backend import ptx
from tkc.backend.index import Expr
from tkc.backend.lowering import Imm, KernelLowering
from tkc.backend.shared_layout import tile_offset
from tkc.errors import TkcError
from tkc.ir import ops as t
from tkc.ir.types import SharedVecType, element_bytes
from tkc.passes.allocate_shared import OFFSET_ATTR


def shared_base(lw: KernelLowering, offset: int) -> SSAValue:
    key = f"smem+{offset}"
    if key not in lw.hoisted:
        saved, lw.body = lw.body, lw.prologue
        try:
            lw.hoisted[key] = lw.op("add.s32", "b32", lw.smem, Imm(offset), n=1)  # type: ignore[assignment]
        finally:
            lw.body = saved
    return lw.hoisted[key]


def offset_of(op: Operation) -> int:
    attr = op.attributes.get(OFFSET_ATTR)
    if not isinstance(attr, IntegerAttr):
        raise TkcError("internal: shared buffer without an offset (run allocate-shared first)")
    return attr.value.data


def add_address(lw: KernelLowering, base: SSAValue, offset: Any) -> SSAValue:
    if isinstance(offset, Imm) and offset.value == 0:
        return base
    return lw.op("add.s32", "b32", base, offset, n=1)  # type: ignore[return-value]


def bundle_of(lw: KernelLowering, values: list[Any], cls: str) -> SSAValue:
    """Gather single registers (or immediates) into one bundle (no instructions if there is one register)."""
    if len(values) == 1 and isinstance(values[0], SSAValue):
        return values[0]
    out = lw.emit(ptx.RegsOp(cls, len(values))).results[0]
    for i, v in enumerate(values):
        lw.op(f"mov.{cls}", None, v, into=out, dest=np.array([i]), n=1)
    return out


def shared_offset(st_type: Any, tile_shape: tuple[int, ...], rows: Expr, cols: Expr) -> Expr:
    if isinstance(st_type, SharedVecType):
        return cols * element_bytes(st_type.element_type)
    return tile_offset(st_type, rows, cols)  # type: ignore[return-value]


def lead_pointer(lw: KernelLowering, g: Any, lead: Sequence[Any]) -> tuple[Any, Any]:
    """The tensor's pointer advanced over its leading (untiled) indices, and whether they are all in bounds
    (None without leading indices)."""
    ptr, ok = g.ptr, None
    for d, idx in enumerate(lead):
        ptr = mad64(lw, idx, g.strides[d], ptr)
        p = lw.op("setp.lt.u32", "pred", lw.reg(idx), g.dims[d], n=1)
        ok = p if ok is None else lw.op("and.pred", "pred", ok, p, n=1)
    return ptr, ok


def in_bounds(lw: KernelLowering, base: Any, deltas: list[int], limit: SSAValue) -> SSAValue:
    """Predicates base + delta < limit (unsigned: negative indices are out of bounds too)."""
    idx = lw.op("add.s32", "b32", lw.reg(base), ptx.PerInstr(deltas), n=len(deltas))
    return lw.op("setp.lt.u32", "pred", idx, limit, n=len(deltas))  # type: ignore[return-value]


@dataclass(frozen=True)
class InRows:
    """A tile coordinate that already counts rows (`rows(r)` in the DSL): `mul_imm` leaves it as it is."""

    value: Any


def global_coords(lw: KernelLowering, op: Any) -> list[Any]:
    """The index values of a global load/store (or a copy made of one), the row index marked InRows where it
    counts rows (t.ROWS_ATTR, which the verifier allows on 2-D tiles only)."""
    coords = [lw.value(i) for i in op.indices]
    if t.ROWS_ATTR in op.attributes:
        coords[-2] = InRows(coords[-2])
    return coords


def mul_imm(lw: KernelLowering, value: Any, factor: int) -> Any:
    if isinstance(value, InRows):
        return value.value
    if isinstance(value, Imm):
        return Imm(int(value.value) * factor)
    return lw.op("mul.lo.s32", "b32", value, Imm(factor), n=1)


def add_i32(lw: KernelLowering, a_: Any, b_: Any) -> Any:
    if isinstance(a_, Imm) and isinstance(b_, Imm):
        return Imm(int(a_.value) + int(b_.value))
    if isinstance(a_, Imm) and a_.value == 0:
        return b_
    if isinstance(b_, Imm) and b_.value == 0:
        return a_
    if isinstance(a_, Imm):
        a_, b_ = b_, a_
    return lw.op("add.s32", "b32", a_, b_, n=1)


def mad64(lw: KernelLowering, index: Any, stride: SSAValue, base: SSAValue) -> SSAValue:
    """base + index·stride in 64 bits (index a signed 32-bit value)."""
    if isinstance(index, Imm):
        if index.value == 0:
            return base
        return lw.op("mad.lo.s64", "b64", stride, Imm(int(index.value)), base, n=1)  # type: ignore[return-value]
    wide = lw.op("cvt.s64.s32", "b64", index, n=1)
    return lw.op("mad.lo.s64", "b64", wide, stride, base, n=1)  # type: ignore[return-value]
