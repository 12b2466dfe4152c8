"""Register-tile and register-vector compute → `ptx` ops.

Work is done on "slots": the f32 values a lane holds for a tile or vector (a 16-bit register holds two slots,
low half first). Operands are unpacked to slots, one instruction family runs over the slots, and the result is
packed back. Which slot of one value meets which slot of another (a row of a tile and its element of a row
vector, the accumulator and operands of an mma) comes from the fragment tables (fragments.py) and must be the
same in every lane, so each op is one table-driven `ptx.op`.
"""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import BFloat16Type, Float16Type, Float32Type
from xdsl.ir import Attribute, SSAValue

from tkc.backend import ptx
from tkc.backend.fragments import LANES, is_packed, reduction_lanes, tile_fragment, vector_fragment
from tkc.backend.index import LANE
from tkc.backend.lowering import LN2, LOG2E, Imm, KernelLowering, handles
from tkc.errors import TkcError
from tkc.ir import ops as t
from tkc.ir.types import FP8_TYPES, Layout, RegTileType, RegVecType, SharedTileType, element_bytes, element_name


def slot_elements(type_: Attribute) -> np.ndarray:
    """Tiles: int [lane, slot, 2] (row, col). Vectors: int [lane, slot] element index (-1 = padding)."""
    if isinstance(type_, RegTileType):
        return tile_fragment(type_).elements.reshape(LANES, -1, 2)
    return vector_fragment(type_).elements  # type: ignore[arg-type]


def nslots(type_: Attribute) -> int:
    return slot_elements(type_).shape[1]


def uniform_map(table: np.ndarray, what: str) -> np.ndarray:
    """A [lane, i] table that must not depend on the lane → [i]."""
    if not (table == table[:1]).all():
        raise TkcError(f"internal: {what} differs between lanes (layouts disagree)")
    return table[0]


def _dtype(type_: Attribute) -> Attribute:
    return type_.element_type  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------------------------
# Unpacking and packing


def unpack(lw: KernelLowering, value: SSAValue, type_: Attribute) -> SSAValue:
    """The slots of a register tile or vector as f32 values, one per register."""
    dtype = _dtype(type_)
    if isinstance(dtype, Float32Type):
        return value
    if isinstance(dtype, FP8_TYPES):  # a register's two bytes (low half): to an f16 pair, then as f16
        pairs = lw.op(f"cvt.rn.f16x2.{_fp8_pair(lw, type_)}", "b32", lw.op("cvt.u16.u32", "b16", value))
        return unpack(lw, pairs, type_.with_element(Float16Type()))  # type: ignore[attr-defined]
    if isinstance(type_, RegVecType):
        if isinstance(dtype, BFloat16Type):
            return lw.op("shl.b32", "b32", value, Imm(16))  # type: ignore[return-value]
        return lw.op("cvt.f32.f16", "b32", value)  # type: ignore[return-value]
    n = ptx.count_of(value)
    out = lw.emit(ptx.RegsOp("b32", 2 * n)).results[0]
    lo, hi = np.arange(n) * 2, np.arange(n) * 2 + 1
    if isinstance(dtype, BFloat16Type):
        lw.op("shl.b32", None, value, Imm(16), into=out, dest=lo, n=n)
        lw.op("and.b32", None, value, Imm(-65536), into=out, dest=hi, n=n)
    else:
        lw.op("cvt.f32.f16", None, value, into=out, dest=lo, n=n)
        upper = lw.op("shr.b32", "b32", value, Imm(16))
        lw.op("cvt.f32.f16", None, upper, into=out, dest=hi, n=n)
    return out


def pack(lw: KernelLowering, slots: SSAValue, type_: Attribute) -> SSAValue:
    """f32 slots → the registers of a tile or vector of `type_`'s dtype (round to nearest even)."""
    dtype = _dtype(type_)
    if isinstance(dtype, Float32Type):
        return slots
    if isinstance(dtype, FP8_TYPES):  # two slots into a register's low two bytes (saturating, as torch's casts)
        n = ptx.count_of(slots) // 2
        idx = np.arange(n)
        pairs = lw.op(f"cvt.rn.satfinite.{_fp8_pair(lw, type_)}.f32", "b16", (slots, 2 * idx + 1), (slots, 2 * idx),
                      n=n)
        return lw.op("cvt.u32.u16", "b32", pairs, n=n)  # type: ignore[return-value]
    name = "bf16" if isinstance(dtype, BFloat16Type) else "f16"
    if isinstance(type_, RegVecType):
        if name == "bf16":  # cvt.rn.bf16.f32 wants a 16-bit register; the x2 form fills both halves
            return lw.op("cvt.rn.bf16x2.f32", "b32", slots, slots)  # type: ignore[return-value]
        return lw.op("cvt.rn.f16.f32", "b32", slots)  # type: ignore[return-value]
    n = ptx.count_of(slots) // 2
    idx = np.arange(n)
    return lw.op(f"cvt.rn.{name}x2.f32", "b32", (slots, 2 * idx + 1), (slots, 2 * idx), n=n)  # type: ignore[return-value]


def _fp8_pair(lw: KernelLowering, type_: Attribute) -> str:
    """PTX's name of a pair of `type_`'s fp8 elements; register tiles only (a vector's slots are one a register)."""
    if not lw.target.startswith("sm_90"):
        raise TkcError(f"converting to or from fp8 needs sm_89 or newer: compile for sm_90a (target {lw.target})")
    if not isinstance(type_, RegTileType):
        raise TkcError(f"{type_.spec()}: fp8 vectors are not supported; store and load fp8 as tiles")  # type: ignore[attr-defined]
    return f"{ptx_type_name(_dtype(type_))}x2"


def ptx_type_name(element: Attribute) -> str:
    """PTX's name of an element type: bf16, f16, f32, e4m3, e5m2."""
    return element_name(element).removeprefix("fp8")


def bf16_bits(value: float) -> int:
    """The bf16 bit pattern nearest to `value` (round to nearest even; NaN stays NaN)."""
    bits = int(np.array(value, dtype=np.float32).view(np.uint32))
    if np.isnan(value):
        return (bits >> 16) | 0x40
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def _fill_pattern(value: float, type_: Attribute) -> Imm:
    dtype = _dtype(type_)
    if isinstance(dtype, Float32Type):
        return Imm(float(value))
    if isinstance(dtype, BFloat16Type):
        bits = bf16_bits(value)
    else:
        bits = int(np.array(value, dtype=np.float16).view(np.uint16))
    if isinstance(type_, RegVecType):
        return Imm(bits)
    return Imm(bits | (bits << 16))


@handles(t.FillOp)
def lower_fill(lw: KernelLowering, op: t.FillOp) -> list[object] | None:
    type_ = op.result.type
    if not isinstance(type_, RegTileType | RegVecType):
        from tkc.backend.lower_memory import lower_shared_fill

        return lower_shared_fill(lw, op)
    n = tile_fragment(type_).nregs if isinstance(type_, RegTileType) else vector_fragment(type_).nregs
    return [lw.op("mov.b32", "b32", _fill_pattern(op.fill_value, type_), n=n)]


# --------------------------------------------------------------------------------------------------------------
# Elementwise

_UNARY = {
    "exp2": ["ex2.approx.ftz.f32"],
    "exp": ["mul.f32 LOG2E", "ex2.approx.ftz.f32"],
    "log2": ["lg2.approx.ftz.f32"],
    "log": ["lg2.approx.ftz.f32", "mul.f32 LN2"],
    "abs": ["abs.f32"],
    "relu": ["max.f32 ZERO"],
    "neg": ["neg.f32"],
    "sqrt": ["sqrt.rn.f32"],
    "rsqrt": ["rsqrt.approx.ftz.f32"],
    "tanh": ["tanh.approx.f32"],
    "copy": [],
}
_CONSTANTS = {"LOG2E": Imm(LOG2E), "LN2": Imm(LN2), "ZERO": Imm(0.0)}
_BINARY = {"add": "add.f32", "sub": "sub.f32", "mul": "mul.f32", "div": "div.rn.f32", "max": "max.f32", "min": "min.f32"}
_REDUCE = {"max": "max.f32", "min": "min.f32", "sum": "add.f32", "prod": "mul.f32"}
_IDENTITY = {"max": -np.inf, "min": np.inf, "sum": 0.0, "prod": 1.0}


@handles(t.UnaryOp)
def lower_unary(lw: KernelLowering, op: t.UnaryOp) -> list[object]:
    type_ = op.result.type
    x = unpack(lw, lw.value(op.input), type_)
    poly_every = lw.fn.attributes.get("tkc.exp2_poly")
    for step in _UNARY[op.name.split(".")[1]]:
        opcode, *extra = step.split()
        if opcode == "ex2.approx.ftz.f32" and poly_every is not None and isinstance(type_, RegTileType):
            x = _exp2_split(lw, x, poly_every.value.data)  # type: ignore[attr-defined]
            continue
        x = lw.op(opcode, "b32", x, *(_CONSTANTS[e] for e in extra))  # type: ignore[assignment]
    return [pack(lw, x, type_)]


# 2^f on [0, 1) as 1 + f·(C1 + f·(C2 + f·C3)), least squares in the relative error (at most 1.7e-4)
EXP2_CUBIC = (0.07632546, 0.22830825, 0.69503617, 1.0)
_FLOOR_MAGIC = 12582912.0  # 1.5·2^23: x + it, rounded down, holds floor(x) in its low mantissa bits


def _exp2_split(lw: KernelLowering, x: SSAValue, every: int) -> SSAValue:
    """exp2 of each slot of x: every `every`-th slot on the FMA pipe (kernel option exp2_poly), the others by
    ex2.approx (the multi-function unit, 16 results a cycle per multiprocessor: a softmax-bound loop waits on it).
    On the FMA pipe: x clamped at -127, t = x + 1.5·2^23 rounded down (its bits: 0x4B400000 + floor(x)), the
    fraction x - (t - 1.5·2^23) through the cubic, and floor(x) added to the cubic's exponent as t's low bits
    shifted up by 23 (one integer multiply-add)."""
    n = ptx.count_of(x)
    on_fma = np.arange(every - 1, n, every)
    if not len(on_fma):
        return lw.op("ex2.approx.ftz.f32", "b32", x)  # type: ignore[return-value]
    on_mufu = np.setdiff1d(np.arange(n), on_fma)
    out = lw.emit(ptx.RegsOp("b32", n)).results[0]
    if len(on_mufu):
        lw.op("ex2.approx.ftz.f32", None, (x, on_mufu), into=out, dest=on_mufu, n=len(on_mufu))
    k = len(on_fma)
    clamped = lw.op("max.f32", "b32", (x, on_fma), Imm(-127.0), n=k)
    t = lw.op("add.rm.f32", "b32", clamped, Imm(_FLOOR_MAGIC), n=k)
    whole = lw.op("sub.f32", "b32", t, Imm(_FLOOR_MAGIC), n=k)
    frac = lw.op("sub.f32", "b32", clamped, whole, n=k)
    c3, c2, c1, c0 = EXP2_CUBIC
    p = lw.op("fma.rn.f32", "b32", frac, Imm(c3), Imm(c2), n=k)
    p = lw.op("fma.rn.f32", "b32", p, frac, Imm(c1), n=k)
    p = lw.op("fma.rn.f32", "b32", p, frac, Imm(c0), n=k)
    lw.op("mad.lo.u32", None, t, Imm(1 << 23), p, into=out, dest=on_fma, n=k)
    return out


@handles(t.BinaryOp)
def lower_binary(lw: KernelLowering, op: t.BinaryOp) -> list[object]:
    type_ = op.result.type
    operands = []
    for v in (op.lhs, op.rhs):
        value = lw.value(v)
        operands.append(unpack(lw, value, type_) if isinstance(v.type, RegTileType | RegVecType) else value)
    return [pack(lw, lw.op(_BINARY[op.fn], "b32", *operands, n=nslots(type_)), type_)]  # type: ignore[arg-type]


def _vector_slot_map(tile_type: RegTileType, vec_type: RegVecType, axis: str) -> np.ndarray:
    """For each slot of a tile, the slot of the vector holding its row's (or column's) element."""
    tile = slot_elements(tile_type)[..., 0 if axis == "row" else 1]  # [lane, slot]
    vec = slot_elements(vec_type)  # [lane, vslot]
    match = tile[:, :, None] == vec[:, None, :]
    if not match.any(axis=2).all():
        raise TkcError("internal: a vector does not hold the elements its tile's lanes need")
    return uniform_map(match.argmax(axis=2), "vector slot")


@handles(t.BroadcastBinaryOp)
def lower_broadcast_binary(lw: KernelLowering, op: t.BroadcastBinaryOp) -> list[object]:
    type_ = op.result.type
    tile = unpack(lw, lw.value(op.tile), type_)
    vec = unpack(lw, lw.value(op.vec), op.vec.type)
    vmap = _vector_slot_map(type_, op.vec.type, op.axis)
    fn = op.fn
    # one approximate reciprocal (≤ 1 ulp) per vector element, then a multiply per tile element. Not rcp.rn: its
    # slow path is a subroutine in the driver's JIT, and a call serializes every wgmma of the kernel (C7509)
    if fn == "div":
        vec, fn = lw.op("rcp.approx.ftz.f32", "b32", vec), "mul"
    return [pack(lw, lw.op(_BINARY[fn], "b32", tile, (vec, vmap), n=nslots(type_)), type_)]  # type: ignore[arg-type]


@handles(t.BroadcastOp)
def lower_broadcast(lw: KernelLowering, op: t.BroadcastOp) -> list[object]:
    type_ = op.result.type
    vec = unpack(lw, lw.value(op.vec), op.vec.type)
    vmap = _vector_slot_map(type_, op.vec.type, op.axis)
    return [pack(lw, lw.op("mov.b32", "b32", (vec, vmap), n=nslots(type_)), type_)]  # type: ignore[arg-type]


@handles(t.ConvertOp)
def lower_convert(lw: KernelLowering, op: t.ConvertOp) -> list[object]:
    return [pack(lw, unpack(lw, lw.value(op.input), op.input.type), op.result.type)]


@handles(t.TransposeOp)
def lower_transpose(lw: KernelLowering, op: t.TransposeOp) -> list[object]:
    src, dst = op.input.type, op.result.type
    if src.layout == dst.layout:
        raise TkcError("internal: transpose must flip the layout (assign-layouts does this)")
    return [lw.value(op.input)]  # the row layout of T is the col layout of Tᵀ: the same registers


@handles(t.RotatePairsOp)
def lower_rotate_pairs(lw: KernelLowering, op: t.RotatePairsOp) -> list[object]:
    """(a, b) → (−b, a) for each pair of adjacent columns: in the row and linear layouts an f32 pair is registers 2k
    and 2k + 1 of one lane, so this is a negation and a move, no lanes exchanged."""
    type_ = op.input.type
    if type_.layout == Layout.COL:
        raise TkcError("internal: rotate_pairs in the col layout (a pair of columns across lanes)")
    el = slot_elements(type_)
    if not ((el[:, 1::2, 1] == el[:, ::2, 1] + 1).all() and (el[:, ::2, 1] % 2 == 0).all()):
        raise TkcError("internal: rotate_pairs' layout does not keep a pair of columns in registers 2k, 2k + 1")
    x = lw.value(op.input)
    n = nslots(type_)
    out = lw.emit(ptx.RegsOp("b32", n)).results[0]
    even, odd = np.arange(0, n, 2), np.arange(1, n, 2)
    lw.op("neg.f32", None, (x, odd), into=out, dest=even, n=n // 2)
    lw.op("mov.b32", None, (x, even), into=out, dest=odd, n=n // 2)
    return [out]


@handles(t.RelayoutOp)
def lower_relayout(lw: KernelLowering, op: t.RelayoutOp) -> list[object]:
    src, dst = op.input.type, op.result.type
    value = lw.value(op.input)
    if src.layout == dst.layout:
        return [value]
    if isinstance(src, RegTileType) and is_packed(src.element_type):
        # Each 16-bit register holds one 8×8 block in mma fragment form; movmatrix transposes it in place.
        src_el = tile_fragment(src).elements[0, :, 0]  # lane 0, low half: (row, col) per register
        dst_el = tile_fragment(dst).elements[0, :, 0]
        block_of_src = {(r // 8, c // 8): i for i, (r, c) in enumerate(src_el)}
        source = np.array([block_of_src[(r // 8, c // 8)] for r, c in dst_el])
        return [lw.op("movmatrix.sync.aligned.m8n8.trans.b16", "b32", (value, source), n=len(source))]
    raise TkcError(
        f"changing the layout of {src.spec()} from {src.layout.value} to {dst.layout.value} is not supported yet; "
        "use it only in one role (or convert it to bf16 first)"
    )


def _affine_lane(values: np.ndarray) -> tuple[int, int, int]:
    """values[lane] = c + a·(lane/4) + b·(lane%4), as (a, b, c); the fragment coordinates are of this form."""
    c = int(values[0])
    a = int(values[4] - values[0])
    b = int(values[1] - values[0])
    lane = np.arange(LANES)
    if not (values == c + a * (lane // 4) + b * (lane % 4)).all():
        raise TkcError("internal: a fragment coordinate is not affine in the lane")
    return a, b, c


@handles(t.TriangleOp)
def lower_triangle(lw: KernelLowering, op: t.TriangleOp) -> list[object]:
    type_ = op.result.type
    x = unpack(lw, lw.value(op.input), type_)
    el = slot_elements(type_)
    cols_only, rows_only = isinstance(op, t.KeepColsOp), isinstance(op, t.KeepRowsOp)
    diff = el[..., 1] if cols_only else el[..., 0] if rows_only else el[..., 1] - el[..., 0]  # col / row / col - row
    a, b, _ = _affine_lane(diff[:, 0])
    lane_part = lw.expr(LANE // 4 * a + LANE % 4 * b) if (a >= 0 and b >= 0) else _signed_lane(lw, a, b)
    statics = diff[0] - diff[0, 0]
    base0 = int(diff[0, 0])
    for s in range(diff.shape[1]):
        if not (diff[:, s] - diff[:, 0] == statics[s]).all():
            raise TkcError("internal: tile mask offsets differ between lanes")
    diagonal = lw.value(op.diagonal)
    keep_cmp = "lt" if cols_only or rows_only else "le" if isinstance(op, t.TrilOp) else "ge"
    offsets = sorted(set(int(v) for v in statics))
    shifts = [base0 + off for off in offsets]  # keep iff lane_part + shift <= diagonal ⇔ lane_part <= diagonal - shift
    # (keep_cols / keep_rows: lane_part + shift < n ⇔ lane_part < n - shift)
    if isinstance(diagonal, Imm):
        bounds: object = ptx.PerInstr([int(diagonal.value) - s for s in shifts])
    else:
        bounds = lw.op("sub.s32", "b32", diagonal, ptx.PerInstr(shifts), n=len(shifts))
    preds = lw.op(f"setp.{keep_cmp}.s32", "pred", lw.reg(lane_part), bounds, n=len(shifts))
    which = np.array([offsets.index(int(v)) for v in statics])
    result = lw.op("selp.b32", "b32", x, Imm(float(op.fill_value)), (preds, which), n=diff.shape[1])
    return [pack(lw, result, type_)]  # type: ignore[arg-type]


def _signed_lane(lw: KernelLowering, a: int, b: int) -> SSAValue:
    g = lw.expr(LANE // 4)
    q = lw.expr(LANE % 4)
    ga = lw.op("mul.lo.s32", "b32", g, Imm(a))
    return lw.op("mad.lo.s32", "b32", q, Imm(b), ga)  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------------------------
# Reductions


def _reduce_slots(lw: KernelLowering, slots: SSAValue, groups: list[list[int]], opcode: str) -> SSAValue:
    """out[i] = op over slots[groups[i]], as a tree of table-driven ops: pairs first, so that a warp's
    reduction has many independent ops in flight rather than one chain of dependent ones (the row max and row
    sum of attention's softmax, 32 values per row, wait on latency as a chain)."""
    depth = max(len(g) for g in groups)
    if min(len(g) for g in groups) != depth:
        raise TkcError("internal: uneven reduction groups")
    bundle, index = slots, np.array(groups).reshape(len(groups), depth)
    while index.shape[1] > 1 and index.shape[1] % 2 == 0:
        half = index.shape[1] // 2
        bundle = lw.op(opcode, "b32", (bundle, index[:, 0::2].reshape(-1)), (bundle, index[:, 1::2].reshape(-1)),
                       n=len(groups) * half)
        index = np.arange(len(groups) * half).reshape(len(groups), half)
    if index.shape[1] == 1 and bundle is not slots:
        return bundle  # the tree's last level: one register per group, in order
    acc = lw.op("mov.b32", "b32", (bundle, index[:, 0]), n=len(groups))
    for j in range(1, index.shape[1]):  # an odd count left: a chain over it
        acc = lw.op(opcode, "b32", acc, (bundle, index[:, j]), n=len(groups))
    return acc  # type: ignore[return-value]


def _shuffle_reduce(lw: KernelLowering, acc: SSAValue, distances: tuple[int, ...], opcode: str) -> SSAValue:
    for d in distances:
        other = lw.op("shfl.sync.bfly.b32", "b32", acc, Imm(d), Imm(0x1F), Imm(-1))
        acc = lw.op(opcode, "b32", acc, other)  # type: ignore[assignment]
    return acc


@handles(t.ReduceOp)
def lower_reduce(lw: KernelLowering, op: t.ReduceOp) -> list[object]:
    tile_type, vec_type = op.input.type, op.result.type
    tile = unpack(lw, lw.value(op.input), tile_type)
    vmap = _vector_slot_map(tile_type, vec_type, op.axis)  # tile slot → vector slot
    groups = [list(np.nonzero(vmap == v)[0]) for v in range(nslots(vec_type))]
    opcode = _REDUCE[op.fn]
    acc = _reduce_slots(lw, tile, groups, opcode)
    if t.PARTIAL not in op.attributes:  # (a partial sum: the lanes' parts meet in a finish_row_sum after the loop)
        acc = _shuffle_reduce(lw, acc, reduction_lanes(vec_type.layout), opcode)
    if op.acc is not None:
        acc = lw.op(opcode, "b32", acc, unpack(lw, lw.value(op.acc), vec_type))  # type: ignore[assignment]
    return [pack(lw, acc, vec_type)]


@handles(t.FinishRowSumOp)
def lower_finish_row_sum(lw: KernelLowering, op: t.FinishRowSumOp) -> list[object]:
    vec_type = op.result.type
    parts = unpack(lw, lw.value(op.input), vec_type)
    return [pack(lw, _shuffle_reduce(lw, parts, reduction_lanes(vec_type.layout), "add.f32"), vec_type)]


@handles(t.VectorReduceOp)
def lower_vector_reduce(lw: KernelLowering, op: t.VectorReduceOp) -> list[object]:
    vec_type = op.input.type
    slots = unpack(lw, lw.value(op.input), vec_type)
    opcode = _REDUCE[op.fn]
    el = slot_elements(vec_type)
    n = el.shape[1]
    if (el < 0).any():  # padding slots contribute the identity
        counts = vector_fragment(vec_type).valid_lanes()
        valid = lw.op("setp.lt.u32", "pred", lw.reg(lw.expr(LANE)), ptx.PerInstr([int(c) for c in counts]), n=n)
        slots = lw.op("selp.b32", "b32", slots, Imm(float(_IDENTITY[op.fn])), valid, n=n)  # type: ignore[assignment]
    acc = _reduce_slots(lw, slots, [list(range(n))], opcode)
    layout = vec_type.layout
    distances = {Layout.ALIGN: (4, 8, 16), Layout.ORTHO: (1, 2)}.get(layout, (16, 8, 4, 2, 1))
    return [_shuffle_reduce(lw, acc, distances, opcode)]


# --------------------------------------------------------------------------------------------------------------
# mma.sync m16n8k16


@handles(t.MmaOp)
def lower_mma(lw: KernelLowering, op: t.MmaOp) -> list[object]:
    """One ptx.mma per 16-wide step of K (so that operands streamed from shared memory are loaded step by step);
    register numbers follow the fragment layouts: A (i, kk) and B (n16, kk) sub-tiles, C/D (i, n16) sub-tiles."""
    a_type, c_type = op.a.type, op.c.type
    m, n = c_type.shape
    k = a_type.shape[0] if op.transpose_a else a_type.shape[1]
    kt, nt = k // 16, n // 16
    if not isinstance(a_type.element_type, BFloat16Type | Float16Type):
        raise TkcError(f"mma needs bf16 or f16 operands, got {a_type.spec()}")
    dtype = "bf16" if isinstance(a_type.element_type, BFloat16Type) else "f16"
    shape = f"m16n8k16.row.col.f32.{dtype}.{dtype}.f32"
    a_value, b_value = lw.value(op.a), lw.value(op.b)
    acc = lw.reg(lw.value(op.c))
    for kk in range(kt):
        rows = []
        for i in range(m // 16):
            for j in range(n // 8):
                d = (i * nt + j // 2) * 8 + 4 * (j % 2) + np.arange(4)
                a_regs = (i * kt + kk) * 4 + np.arange(4)
                h = j % 2
                b_regs = ((j // 2) * kt + kk) * 4 + np.array([h, 2 + h])
                rows.append(np.concatenate([d, a_regs, b_regs, d]))
        table = np.array(rows)
        a_bundle, table[:, 4:8] = _operand(lw, a_value, table[:, 4:8])
        b_bundle, table[:, 8:10] = _operand(lw, b_value, table[:, 8:10])
        acc = lw.emit(ptx.MmaOp(shape, a_bundle, b_bundle, acc, table)).results[0]
    return [acc]


def _operand(lw: KernelLowering, value: object, regs: np.ndarray) -> tuple[SSAValue, np.ndarray]:
    """The bundle to read mma operand registers `regs` from: the operand itself, or for a tile streamed from shared
    memory, the slice loaded just now (with the register numbers mapped into it)."""
    from tkc.backend.lower_memory import StreamedTile

    if isinstance(value, StreamedTile):
        bundle, where = value.load_registers(lw, set(int(r) for r in regs.reshape(-1)))
        return bundle, np.vectorize(where.__getitem__)(regs)
    return lw.reg(value), regs  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------------------
# wgmma m64nNk16 / m64nNk32 for fp8 (sm_90a)


@handles(t.WgmmaOp)
def lower_wgmma(lw: KernelLowering, op: t.WgmmaOp) -> list[object]:
    """The warpgroup's `wgmma`s, one per 32 bytes of K (16 elements, 32 of fp8), reading B (and A, unless it is in registers) through
    shared-memory descriptors (backend/wgmma.py) into a copy of C; fenced before, committed and waited for after,
    so that the result is an ordinary register tile. A loop's accumulator, where the pipeline left room, is
    updated in place and only the previous step's group is waited for (`_accumulates_in_flight`); attention's P·V
    is accumulated in the loop-carried registers and waited for with the next step's Q·Kᵀ
    (`_waited_by_the_next_step`); overlap-wgmma's early Q·Kᵀ with the P·V after it (`_waited_by_a_later_wgmma`);
    two independent products in a row, or one in parts along K (`_chained`), with the second
    (`_waited_by_the_next_wgmma`). A warp's rt[f32, 16, N] (row layout) is its slice of the m64nN accumulator,
    register for register."""
    from tkc.backend import wgmma

    if not lw.target.startswith("sm_90"):
        raise TkcError(f"{op.fn.removeprefix('wg')} on shared tiles is Hopper's wgmma: compile for sm_90a "
                       f"(target {lw.target} has only mma.sync: load the operands into register tiles)")
    if lw.threads % wgmma.WARPGROUP:
        raise TkcError(f"{op.fn.removeprefix('wg')} on shared tiles runs on whole warpgroups: the kernel's warps "
                       f"must be a multiple of 4, got {lw.threads // 32}")
    a_value, b_ref = lw.value(op.a), lw.value(op.b)
    n = op.c.type.shape[1]
    a_type, b_type = (ptx_type_name(x.type.element_type) for x in (op.a, op.b))
    k_steps = op.a.type.shape[0 if op.transpose_a else 1] // wgmma.k_step(element_bytes(op.a.type.element_type))
    b_major = "K" if op.transpose_b else "MN"
    desc_b = _descriptors(lw, b_ref.addr, [wgmma.operand_descriptor(op.b.type, 0, kk, b_major, b_ref.panel_rows)
                                          for kk in range(k_steps)])
    if isinstance(op.a.type, RegTileType):
        # a warp's rt[bf16, 16, K]: k step kk's four registers are the mma.sync A fragment, which wgmma takes as is
        a_bundle, a_regs = _operand(lw, a_value, np.arange(4 * k_steps).reshape(k_steps, 4))
    else:
        a_major = "MN" if op.transpose_a else "K"
        a_bundle = _descriptors(lw, a_value.addr, [wgmma.operand_descriptor(op.a.type, 0, kk, a_major,
                                                                            a_value.panel_rows)
                                                   for kk in range(k_steps)])
        a_regs = np.arange(k_steps).reshape(k_steps, 1)
    waited_by_an_op, in_flight, into_next_step, deferred = _wait_policy(op)
    if in_flight or into_next_step:  # the loop waits for it after its last step
        lw.wgmma_loops.add(op.parent_op())
    if (in_flight or (waited_by_an_op and _only_use_of_a_loop_argument(op)) or _last_use_in_its_branch(op)
            or _chained(op)):
        # the accumulator's own registers, in place: nothing else reads them before the wait covers it (or ever)
        acc = lw.value(op.c)
    elif into_next_step:
        # straight into the registers the loop carries it in: a copy at the yield would read the accumulator while
        # the wgmma runs (ptxas then serializes every wgmma, C7514)
        from tkc.passes.util import yielded_at

        acc = lw.values[op.parent_block().args[yielded_at(op, op.parent_block()) + 1]]
        if acc is not lw.value(op.c):
            lw.op("mov.b32", None, lw.reg(lw.value(op.c)), into=acc)
    else:
        acc = lw.op("mov.b32", "b32", lw.reg(lw.value(op.c)), n=n // 2)  # wgmma writes in place: keep C as it was
    lw.emit(ptx.WgmmaSyncOp("fence"))
    for kk in range(k_steps):
        lw.emit(ptx.WgmmaOp(n, acc, range(n // 2), a_bundle, a_regs[kk], desc_b, kk, scale_d=1,
                            trans_a=int(op.transpose_a), trans_b=int(b_major == "MN"), a_type=a_type, b_type=b_type))
    lw.emit(ptx.WgmmaSyncOp("commit"))
    if isinstance(op.next_op, t.TurnPassOp):
        # the turn passes once the wgmmas are issued, not done: the other warpgroup's queue up right behind them
        from tkc.backend.lower_control import lower_turn_pass_now

        lower_turn_pass_now(lw)
        lw.passed_at_commit.add(op.next_op)
    if not deferred:
        lw.emit(ptx.WgmmaSyncOp("wait", 1 if in_flight else 0))
    return [acc]


def _wait_policy(op: t.WgmmaOp) -> tuple[bool, bool, bool, bool]:
    """How the wgmma is waited for: (waited_by_an_op: defer-wgmma placed tile.wgmma_waits for it; in_flight: waited
    for at the loop's next step, one group left running; into_next_step: by the next step's first wgmma; deferred:
    no wait right behind it, one of these or a later wgmma's wait covering it)."""
    from tkc.passes.defer_wgmma import DEFERRED

    waited_by_an_op = DEFERRED in op.attributes
    in_flight = not waited_by_an_op and _accumulates_in_flight(op)
    into_next_step = not (in_flight or waited_by_an_op) and _waited_by_the_next_step(op)
    deferred = waited_by_an_op or into_next_step or (not in_flight and (_waited_by_a_later_wgmma(op)
                                                                         or _waited_by_the_next_wgmma(op)))
    return waited_by_an_op, in_flight, into_next_step, deferred


def _waited_by_the_next_wgmma(op: t.WgmmaOp) -> bool:
    """May this wgmma run on beside the next wgmma of its block, both waited for by that one's wait (which covers
    every older group)? When only index arithmetic, zero fills and views of shared tiles come between them (nothing
    reads its result, writes its operands or releases their memory) and the next one is itself waited for at once:
    two independent products (the dK/dV block's Sᵀ and dPᵀ parts) then queue on the tensor cores back to back instead
    of each waiting out its own pipeline."""
    later = op.next_op
    while later is not None and not isinstance(later, t.WgmmaOp):
        view = (isinstance(later, t.LoadOp) and isinstance(later.source.type, SharedTileType)
                and isinstance(later.result.type, SharedTileType))
        if not (view or isinstance(later, t.FillOp) and not later.operands or later.dialect_name() == "arith"):
            return False
        later = later.next_op
    if later is None or any(operand is op.results[0] for operand in later.operands) and not _chained(later):
        return False
    waited_by_an_op, in_flight, into_next_step, deferred = _wait_policy(later)
    return not deferred


def _chained(op: t.WgmmaOp) -> bool:
    """Does the wgmma accumulate onto another wgmma's result that nothing else reads (a product split in parts along
    K: Q·Kᵀ over two halves of D)? Then it adds in place, behind that one: wgmmas of one shape on the same
    accumulator registers run in order without a wait between them."""
    source = op.c.owner
    return isinstance(source, t.WgmmaOp) and source.parent_block() is op.parent_block() and len(list(op.c.uses)) == 1


def _last_use_in_its_branch(op: t.WgmmaOp) -> bool:
    """Is the wgmma, in one branch of an if, the only reader of its accumulator there, the other branch the only
    other reader (defer-wgmma's last P·V after the loop: `if ran { O + P·V } else { O }`; rotate-tile-loop's
    last P·V beside the next tile's step 0, or in order in the other branch)? Then it may write C in place."""
    from xdsl.dialects import scf

    branch, parent = op.parent_region(), op.parent_op()
    if not isinstance(parent, scf.IfOp) or op.c.owner is parent or branch is None:
        return False
    other = parent.false_region if branch is parent.true_region else parent.true_region
    for use in op.c.uses:
        if use.operation is op:
            continue
        holder = use.operation
        while holder is not None and holder.parent_region() is not other:
            holder = holder.parent_op()
        if holder is None:
            return False
    return True


def _only_use_of_a_loop_argument(op: t.WgmmaOp) -> bool:
    from xdsl.ir import BlockArgument

    c = op.c
    return isinstance(c, BlockArgument) and c.owner is op.parent_block() and len(list(c.uses)) == 1


def _waited_by_a_later_wgmma(op: t.WgmmaOp) -> bool:
    """May this wgmma run on until a later wgmma of its block waits (which waits for every older group)? When its
    result only goes to the loop's next step (overlap-wgmma's early Q·Kᵀ): nothing reads it before that wait, and
    no stage is released before it (split_ring=1 releases a ring right after its last reader: a refill could then
    land under this wgmma's B)."""
    from tkc.ir import tma_ops as m
    from tkc.passes.util import yielded_at

    if yielded_at(op, op.parent_block()) is None:
        return False
    later = op.next_op
    while later is not None and not isinstance(later, t.WgmmaOp):
        if any(isinstance(inner, m.StageReleaseOp) for inner in later.walk()):
            return False
        later = later.next_op
    return later is not None


def _waited_by_the_next_step(op: t.WgmmaOp) -> bool:
    """May this wgmma run on until the next step's first wgmma is waited for (attention's P·V; passes/util.py says
    when)? Only where the pipeline releases stages one step late, as its B may be read until then."""
    from xdsl.dialects import scf

    from tkc.passes.insert_async_pipeline import WGMMA_IN_FLIGHT
    from tkc.passes.util import waited_by_the_next_step

    loop = op.parent_op()
    return (isinstance(loop, scf.ForOp) and WGMMA_IN_FLIGHT in loop.attributes
            and waited_by_the_next_step(op, loop))


def _accumulates_in_flight(op: t.WgmmaOp) -> bool:
    """May this wgmma run on while the loop goes on (waited for at the next step, and after the loop)? When the
    pipeline left a stage of room for it (insert-async-pipeline marks the loop), A is in shared memory, and it only carries the loop's
    accumulator forward: C is the loop's argument, used by nothing else, and the result goes only to the yield."""
    from xdsl.dialects import scf

    from tkc.passes.insert_async_pipeline import WGMMA_IN_FLIGHT
    from tkc.passes.util import carries_only_the_accumulator

    loop = op.parent_op()
    if not (isinstance(loop, scf.ForOp) and WGMMA_IN_FLIGHT in loop.attributes):
        return False
    if isinstance(op.a.type, RegTileType):
        return False  # the tensor cores read A's registers until the wait, and the next step rewrites them
    return carries_only_the_accumulator(op, loop)


def _descriptors(lw: KernelLowering, addr: SSAValue, templates: list[int]) -> SSAValue:
    """One b64 descriptor register per template (descriptors of a tile at address 0), for the tile at `addr`: the
    start-address field of each is the template's plus addr >> 4."""
    field = lw.op("and.b32", "b32", lw.op("shr.u32", "b32", addr, Imm(4)), Imm(0x3FFF))
    first = lw.op("or.b64", "b64", lw.op("cvt.u64.u32", "b64", field), Imm(templates[0], "b64"))
    return lw.op("add.s64", "b64", (first, np.zeros(len(templates), dtype=np.int64)),
                 ptx.PerInstr([t_ - templates[0] for t_ in templates]), n=len(templates))  # type: ignore[return-value]
