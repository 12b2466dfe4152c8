"""Address arithmetic the memory lowerings share (lower_memory.py, lower_copies.py, lower_tma.py): shared buffers'
addresses (hoisted to the kernel's entry), byte offsets inside a shared tile, 64-bit global pointers advanced over
indices, bounds predicates (cut short at a rows(r, end)'s end), rows found through rows_at's index tensor, and
gathering single registers into one bundle. Immediates (`Imm`) fold: a constant index or a zero offset costs no
instruction."""

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
from tkc.ir.types import RegVecType, SharedVecType, element_bytes
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
    """A tile coordinate that already counts rows (`rows(r)` in the DSL): `mul_imm` leaves it as it is. `end`: rows
    from there on (in the tensor, or in rows_at's index) are out (`rows(r, end)`; None: none are)."""

    value: Any
    end: Any = None


def row_limit(lw: KernelLowering, size: SSAValue, end: Any) -> Any:
    """The rows below which a load or store may go: the tensor's (or index's) `size`, or less where an `end` cuts
    them short (a negative end: none)."""
    if end is None:
        return size
    return lw.op("min.s32", "b32", size, lw.op("max.s32", "b32", lw.reg(end), Imm(0), n=1), n=1)


def global_coords(lw: KernelLowering, op: Any) -> list[Any]:
    """The index values of a global load/store (or a copy made of one), the row index marked InRows where it
    counts rows (t.ROWS_ATTR, which the verifier allows on 2-D tiles and register vectors only)."""
    coords = [lw.value(i) for i in op.indices]
    if t.ROWS_ATTR in op.attributes:
        end = getattr(op, "rows_end", None)
        tile = op.result.type if isinstance(op, t.LoadOp) else getattr(getattr(op, "value", None), "type", None)
        row = -1 if isinstance(tile, RegVecType) else -2  # a register vector's only index counts rows
        coords[row] = InRows(coords[row], lw.value(end) if end is not None else None)
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


def gathered_row_pointers(lw: KernelLowering, g: Any, index: Any, row0: Any, rows: list[int],
                          ptr: SSAValue, end: Any = None) -> tuple[SSAValue, SSAValue]:
    """For each of a lane's rows row0 + r (r in `rows`): a pointer to row index[row0 + r] of g (`ptr` already at
    this lane's column), and whether that row is there: row0 + r within the index tensor (and before `end`) and its
    value within g's rows (unsigned: negative values too are out; an i64 value also needs its high word 0)."""
    n, rank = len(rows), g.type.rank
    words = element_bytes(index.type.element_type) // 4      # 1 (i32) or 2 (i64: read as two b32 words)
    at = lw.op("add.s32", "b32", lw.reg(row0), ptx.PerInstr(rows), n=n)
    in_index = lw.op("setp.lt.u32", "pred", at, row_limit(lw, index.dims[0], end), n=n)
    where = lw.op("mad.lo.s64", "b64", lw.op("cvt.s64.s32", "b64", at, n=n), index.strides[0], index.ptr, n=n)
    read = lw.emit(ptx.LoadOp("global", "b32", words, where, np.arange(n), np.zeros(n, dtype=np.int64),
                              np.arange(n) * words, ptx.regs("b32", n * words), in_index, np.arange(n))).results[0]
    low = np.arange(n) * words
    ok = lw.op("and.pred", "pred", rows_within(lw, read, low, words, g.dims[rank - 2]), in_index, n=n)
    wide = lw.op("cvt.u64.u32", "b64", (read, low), n=n)
    return lw.op("mad.lo.s64", "b64", wide, g.strides[rank - 2], ptr, n=n), ok  # type: ignore[return-value]


def rows_within(lw: KernelLowering, read: SSAValue, low: np.ndarray, words: int, limit: SSAValue) -> SSAValue:
    """Whether each row number read (its low word at `low` of `read`, its high word next where words == 2) is a row
    below `limit`."""
    ok = lw.op("setp.lt.u32", "pred", (read, low), limit, n=len(low))
    if words == 2:
        high_zero = lw.op("setp.eq.u32", "pred", (read, low + 1), Imm(0), n=len(low))
        ok = lw.op("and.pred", "pred", ok, high_zero, n=len(low))
    return ok  # type: ignore[return-value]
