"""Loads and stores of register tiles and vectors → `ptx` ops: global ↔ registers, shared ↔ registers (ldmatrix,
ld/st.shared), views of shared tiles, shared buffers (`empty`, double-buffered in loops), atomic adds. A tile
copied whole between global and shared memory goes through lower_copies.py; address arithmetic is addressing.py's.

Register tiles and vectors move in "runs": consecutive slots (fragments.py) that sit next to each other in a row
become one vector access, as wide as the tensor's alignment allows. Global addresses are a per-thread base plus a
row offset (a register per distinct row) plus an immediate column offset; shared addresses come from the
swizzle formula (shared_layout.py) written once as an index expression, with accesses that differ by a constant
sharing one base register. Out-of-bounds global accesses are predicated off (loads read zeros).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.dialects.builtin import BFloat16Type, Float32Type
from xdsl.ir import Attribute, Operation, SSAValue

from tkc.backend import ptx
from tkc.backend.addressing import (InRows, add_address, add_i32, bundle_of, gathered_row_pointers, global_coords,
                                    in_bounds, lead_pointer, mad64, mul_imm, offset_of, row_limit, shared_base)
from tkc.backend.fragments import G, LANES, Q, is_packed, tile_fragment, vector_fragment
from tkc.backend.index import LANE, TID, Const, Expr, Leaf, share_bases
from tkc.backend.lower_compute import nslots, pack, ptx_type_name, unpack
from tkc.backend.lower_copies import copy_global_to_shared, copy_shared_to_global
from tkc.backend.shared_layout import conflict_degree, tile_offset
from tkc.errors import SourceLoc, TkcError
from tkc.ir import ops as t
from tkc.ir.types import GlobalType, Layout, RegTileType, RegVecType, SharedTileType, SharedVecType, element_bytes
from tkc.backend.lowering import GlobalRef, Imm, KernelLowering, SharedRef, handles
from tkc.passes.util import shared_unchanged_between
from tkc.targets import get_target

# --------------------------------------------------------------------------------------------------------------
# Runs of slots


@dataclass(frozen=True)
class Run:
    start: int  # first slot
    length: int  # slots
    nbytes: int
    reg: int  # first register of the bundle (a 16-bit half run: the register holding it)
    half: int  # for a one-slot run of a packed tile: which half

    def ptx_type_and_vec(self, packed: bool, pairs: bool = False) -> tuple[str, int]:
        """`packed`: a 16-bit tile (two elements per register); `pairs`: a 16-bit vector moved two elements per
        32-bit word (one element per register, split and joined around the access)."""
        if packed and self.nbytes == self.length:  # fp8: a register holds two, in its low two bytes
            return ("b8", 1) if self.length == 1 else ("b16", 1)
        if packed or (pairs and self.length > 1):
            return ("b16", 1) if self.length == 1 else ("b32", self.length // 2)
        return ("b16" if self.nbytes // self.length == 2 else "b32", self.length)


def _pairs(type_: Attribute) -> bool:
    return isinstance(type_, RegVecType) and element_bytes(type_.element_type) == 2


def slot_coords(type_: Attribute) -> np.ndarray:
    """[lane, slot, 2] (row, col) of every slot; vectors are one row (padding slots continue the pattern)."""
    if isinstance(type_, RegTileType):
        return tile_fragment(type_).elements.reshape(LANES, -1, 2)
    el = vector_fragment(type_).positions  # type: ignore[arg-type]
    return np.stack([np.zeros_like(el), el], axis=-1)


def padding_guard(lw: KernelLowering, type_: Attribute, runs: list[Run]) -> SSAValue | None:
    """For a vector with padding slots: per run, whether this lane holds real elements (else None)."""
    if not isinstance(type_, RegVecType):
        return None
    counts = vector_fragment(type_).valid_lanes()
    if (counts == LANES).all():
        return None
    lane = lw.reg(lw.expr(LANE))
    return lw.op("setp.lt.u32", "pred", lane, ptx.PerInstr([int(counts[r.start]) for r in runs]), n=len(runs))  # type: ignore[return-value]


def plan_runs(type_: Attribute, coords: np.ndarray, max_bytes: int) -> list[Run]:
    """Split the slots into the widest aligned accesses: consecutive slots in one row, consecutive columns,
    at most `max_bytes`, whose start column is aligned to the access size in every lane."""
    e = element_bytes(type_.element_type)  # type: ignore[attr-defined]
    packed = isinstance(type_, RegTileType) and is_packed(type_.element_type)
    n = coords.shape[1]
    runs: list[Run] = []
    s = 0
    while s < n:
        best = 1
        length = 2
        most = 2 if e == 1 else 8 if packed or _pairs(type_) else 4  # fp8: one register's two bytes
        while length * e <= max_bytes and s + length <= n and length <= most:
            block = coords[:, s:s + length]
            contiguous = (block[:, :, 0] == block[:, :1, 0]).all() and (
                block[:, :, 1] == block[:, :1, 1] + np.arange(length)).all()
            aligned = ((block[:, 0, 1] * e) % (length * e) == 0).all()
            whole_regs = not packed or s % 2 == 0
            if not (contiguous and aligned and whole_regs):
                break
            best = length
            length *= 2
        if packed and best == 1:
            runs.append(Run(s, 1, e, s // 2, s % 2))
        elif packed:
            runs.append(Run(s, best, best * e, s // 2, 0))
        else:
            runs.append(Run(s, best, best * e, s, 0))
        s += best
    return runs


def _register_type(value_type: Attribute, element: Attribute) -> Attribute:
    return value_type.with_element(element)  # type: ignore[attr-defined]


def _nregs(type_: Attribute) -> int:
    if isinstance(type_, RegTileType):
        return tile_fragment(type_).nregs
    return vector_fragment(type_).nregs  # type: ignore[arg-type]


def _affine(values: np.ndarray) -> tuple[int, int, int]:
    """values[lane] = c + a·(lane // 4) + b·(lane % 4)."""
    lane = np.arange(LANES)
    c, a_, b_ = int(values[0]), int(values[4] - values[0]), int(values[1] - values[0])
    if (values == c + a_ * (lane // 4) + b_ * (lane % 4)).all():
        return a_, b_, c
    raise TkcError("internal: slot coordinates are not affine in the lane")


def _lane_expr(a_: int, b_: int) -> Expr:
    return LANE // 4 * a_ + LANE % 4 * b_


# --------------------------------------------------------------------------------------------------------------
# Shared buffers


def _coord_env(lw: KernelLowering, coords: list[Any], names: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run-time coordinates become leaves of index expressions; constants are substituted."""
    regs, consts = {}, {}
    for name, c in zip(names, coords):
        if isinstance(c, Imm):
            consts[name] = int(c.value)
        else:
            regs[name] = c
    return regs, consts


def _shared_accesses(lw: KernelLowering, exprs: list[Expr], ranges: dict[str, int], regs: dict[str, Any],
                     buffer: SSAValue) -> tuple[SSAValue, np.ndarray, np.ndarray]:
    """Address registers (one per distinct base) and, per access, (base index, immediate offset)."""
    env = {"lane": np.arange(LANES).reshape((LANES,) + (1,) * len(ranges)), "tid": None, "warp": None}
    for axis, (name, size) in enumerate(ranges.items()):
        env[name] = np.arange(size).reshape((1,) + (1,) * axis + (size,) + (1,) * (len(ranges) - axis - 1))
    env = {k: v for k, v in env.items() if v is not None}
    shared = share_bases(exprs, env)
    bases = [add_address(lw, buffer, lw.expr(b, regs)) for b in shared.bases]
    bundle = bundle_of(lw, bases, "b32")
    return bundle, shared.base, shared.offset


def _coord_leaves(lw: KernelLowering, coords: list[Any], outer: tuple[int, ...], inner: tuple[int, ...]) -> tuple[list[Expr], dict[str, int], dict[str, Any]]:
    """Index expressions for the sub-tile coordinates, their ranges, and the registers behind them."""
    exprs: list[Expr] = []
    ranges: dict[str, int] = {}
    regs: dict[str, Any] = {}
    for d, (c, o, i) in enumerate(zip(coords, outer, inner)):
        if isinstance(c, Imm):
            exprs.append(Const(int(c.value)))
        else:
            name = f"c{d}"
            exprs.append(Leaf(name))
            ranges[name] = o // i
            regs[name] = c
    return exprs, ranges, regs


# --------------------------------------------------------------------------------------------------------------
# Shared → registers


def _ldmatrix_plan(rt_type: RegTileType, down_first: bool | None = None) -> tuple[bool, list[tuple[int, int, np.ndarray]]]:
    """(trans, [(si, sj, dest regs of its 4 matrices)]) for loading a 16-bit register tile with ldmatrix.x4.

    The four 8×8 matrices of a 16×16 sub-tile land in four consecutive registers, in the order the lanes give
    their addresses: down first ((0,0), (1,0), (0,1), (1,1)) or across first. The order that puts each mma
    operand in consecutive registers (what the hardware wants; otherwise ptxas adds moves) is down first for an
    A operand in row layout and a B operand in col layout, across first for the other two; `down_first` None
    takes the A-operand order of the layout."""
    frag = tile_fragment(rt_type)
    trans = rt_type.layout.value == "col"
    if down_first is None:
        down_first = not trans
    lane0 = frag.elements[0, :, 0]  # (row, col) of each register's low half in lane 0: a block's corner
    reg_of_block = {(int(r) // 8, int(c) // 8): i for i, (r, c) in enumerate(lane0)}
    order = [(0, 0), (1, 0), (0, 1), (1, 1)] if down_first else [(0, 0), (0, 1), (1, 0), (1, 1)]
    plan = []
    for si in range(frag.rows // 16):
        for sj in range(frag.cols // 16):
            regs = [reg_of_block[(2 * si + br, 2 * sj + bc)] for br, bc in order]
            plan.append((si, sj, np.array(regs)))
    return trans, plan


def _ldmatrix_lane(down_first: bool) -> tuple[Expr, Expr]:
    """Row and column, within a 16×16 sub-tile, of the row address lane l supplies (lanes 8m..8m+7 give the rows
    of matrix m)."""
    m = LANE // 8
    br, bc = (m % 2, LANE // 16) if down_first else (LANE // 16, m % 2)
    return br * 8 + LANE % 8, bc * 8


@dataclass
class StreamedTile:
    """A register tile loaded from shared memory whose only user is an mma: instead of loading it whole, the mma
    loads each 16-column (or 16-row) slice right before the instructions that use it, which keeps far fewer
    registers live (a 64×128 K tile of attention is 128 registers per thread when loaded at once)."""

    ref: SharedRef
    rt_type: RegTileType
    coords: list[Any]
    operand: int = 0  # 0: the mma's A, 1: its B
    plan: list[tuple[int, int, np.ndarray]] | None = None
    trans: bool = False
    bases: tuple[SSAValue, np.ndarray, np.ndarray] | None = None

    def load_registers(self, lw: KernelLowering, needed: set[int]) -> tuple[SSAValue, dict[int, int]]:
        """ldmatrix the sub-tiles holding registers `needed` (register numbers of the whole tile) into a new
        bundle; returns it and where each whole-tile register went in it."""
        if self.bases is None:
            down_first = (self.rt_type.layout.value == "col") == (self.operand == 1)
            self.trans, self.plan = _ldmatrix_plan(self.rt_type, down_first)
            self.bases = _ldmatrix_addresses(lw, self.ref, self.rt_type, self.coords, down_first, self.plan)
        bundle, base_of, offset = self.bases
        chosen = [i for i, (_, _, regs) in enumerate(self.plan) if needed & set(int(r) for r in regs)]  # type: ignore[union-attr]
        where = {int(r): 4 * n + m for n, i in enumerate(chosen) for m, r in enumerate(self.plan[i][2])}  # type: ignore[index]
        dest = np.arange(4 * len(chosen)).reshape(-1, 4)
        regs = lw.emit(ptx.LdmatrixOp(4, self.trans, bundle, base_of[chosen], offset[chosen], dest,
                                      ptx.regs("b32", 4 * len(chosen)))).results[0]
        return regs, where


def _ldmatrix_addresses(lw: KernelLowering, ref: SharedRef, rt_type: RegTileType, coords: list[Any], down_first: bool,
                        plan: list[tuple[int, int, np.ndarray]]) -> tuple[SSAValue, np.ndarray, np.ndarray]:
    st_type = ref.type
    cexprs, ranges, regs = _coord_leaves(lw, coords, st_type.shape, rt_type.shape)
    lane_row, lane_col = _ldmatrix_lane(down_first)
    exprs = []
    for si, sj, _ in plan:
        row = cexprs[0] * rt_type.shape[0] + lane_row + 16 * si
        col = cexprs[1] * rt_type.shape[1] + lane_col + 16 * sj
        exprs.append(tile_offset(st_type, row, col))
    return _shared_accesses(lw, exprs, ranges, regs, ref.addr)


def _lower_ldmatrix(lw: KernelLowering, ref: SharedRef, rt_type: RegTileType, coords: list[Any]) -> SSAValue:
    trans, plan = _ldmatrix_plan(rt_type)
    bundle, base_of, offset = _ldmatrix_addresses(lw, ref, rt_type, coords, not trans, plan)
    dest = np.stack([p[2] for p in plan])
    result_type = ptx.regs("b32", tile_fragment(rt_type).nregs)
    return lw.emit(ptx.LdmatrixOp(4, trans, bundle, base_of, offset, dest, result_type)).results[0]


def _streamable(op: t.LoadOp) -> bool:
    """Is the load's only user an mma operand A or B, later in the same block, with nothing in between that could
    change the shared tile (then the mma reads it from shared memory a 16-wide step of K at a time)?"""
    uses = list(op.result.uses)
    if len(uses) != 1 or not isinstance(uses[0].operation, t.MmaOp) or uses[0].index > 1:
        return False
    return shared_unchanged_between(op, uses[0].operation)


def _run_exprs(container: Any, runs: list[Run], coords: np.ndarray, cexprs: list[Expr], inner: tuple[int, ...]) -> list[Expr]:
    """Shared-memory byte offsets of each run's first element, as expressions of the lane and coordinates."""
    exprs = []
    for run in runs:
        ra, rb, rc = _affine(coords[:, run.start, 0])
        ca, cb, cc = _affine(coords[:, run.start, 1])
        if isinstance(container, SharedVecType):
            col = cexprs[-1] * inner[-1] + _lane_expr(ca, cb) + cc
            exprs.append(col * element_bytes(container.element_type))
        else:
            row = cexprs[0] * inner[0] + _lane_expr(ra, rb) + rc
            col = cexprs[1] * inner[1] + _lane_expr(ca, cb) + cc
            exprs.append(tile_offset(container, row, col))  # type: ignore[arg-type]
    return exprs


def _shared_run_access(lw: KernelLowering, ref: SharedRef, reg_type: Attribute, coords_values: list[Any],
                       max_bytes: int = 16) -> tuple[list[Run], SSAValue, np.ndarray, np.ndarray, SSAValue | None]:
    container = ref.type
    inner = reg_type.shape  # type: ignore[attr-defined]
    coords = slot_coords(reg_type)
    runs = plan_runs(reg_type, coords, max_bytes)
    cexprs, ranges, regs = _coord_leaves(lw, coords_values, container.shape, inner)
    exprs = _run_exprs(container, runs, coords, cexprs, inner)
    bundle, base_of, offset = _shared_accesses(lw, exprs, ranges, regs, ref.addr)
    return runs, bundle, base_of, offset, padding_guard(lw, reg_type, runs)


def _load_runs(lw: KernelLowering, space: str, reg_type: Attribute, runs: list[Run], addr: SSAValue,
               base_of: np.ndarray, offset: np.ndarray, guard: SSAValue | None = None,
               guard_index: np.ndarray | None = None) -> SSAValue:
    """Registers of `reg_type` (in memory's dtype) loaded by `runs`; packed halves are merged with prmt."""
    packed = isinstance(reg_type, RegTileType) and is_packed(reg_type.element_type)
    nregs = _nregs(reg_type)
    groups: dict[tuple[str, int], list[int]] = {}
    for i, run in enumerate(runs):
        groups.setdefault(run.ptx_type_and_vec(packed), []).append(i)
    if packed and all(run.length == 1 for run in runs):
        byte = element_bytes(reg_type.element_type) == 1  # type: ignore[attr-defined]
        halves = lw.emit(ptx.LoadOp(space, "b8" if byte else "b16", 1, addr, base_of, offset, np.arange(len(runs)),
                                    ptx.regs("b32", len(runs)), guard, guard_index)).results[0]
        lo = np.array([i for i, r in enumerate(runs) if r.half == 0])
        hi = np.array([i for i, r in enumerate(runs) if r.half == 1])
        order_lo = [runs[i].reg for i in lo]
        order_hi = {runs[i].reg: i for i in hi}
        # the two halves into one register: 16-bit elements side by side, fp8's two bytes in the low half
        return lw.op("prmt.b32", "b32", (halves, lo), (halves, np.array([order_hi[r] for r in order_lo])),
                     Imm(0x1140 if byte else 0x5410), n=len(lo))  # type: ignore[return-value]
    gi = guard_index if guard is not None else None
    if _pairs(reg_type) and any(run.length > 1 for run in runs):
        return _load_pairs(lw, space, nregs, runs, addr, base_of, offset, guard, gi)
    if len(groups) != 1:
        raise TkcError("internal: a register tile needs accesses of several widths")
    (ptx_type, vec), = groups
    dest = np.array([run.reg for run in runs])
    return lw.emit(ptx.LoadOp(space, ptx_type, vec, addr, base_of, offset, dest, ptx.regs("b32", nregs),
                              guard, gi)).results[0]


def _load_pairs(lw: KernelLowering, space: str, nregs: int, runs: list[Run], addr: SSAValue, base_of: np.ndarray,
                offset: np.ndarray, guard: SSAValue | None, guard_index: np.ndarray | None,
                bf16_as_f32: bool = False) -> SSAValue:
    """16-bit vector elements, one per register, loaded two per 32-bit word and split (low half first); with
    `bf16_as_f32`, bf16 elements split straight into f32 slots (shl / and: an f32 is a bf16 and 16 zero bits)."""
    if len({run.length for run in runs}) != 1:
        raise TkcError("internal: a 16-bit vector needs accesses of several widths")
    words_per_run = runs[0].length // 2
    words = lw.emit(ptx.LoadOp(space, "b32", words_per_run, addr, base_of, offset,
                               np.arange(len(runs)) * words_per_run, ptx.regs("b32", len(runs) * words_per_run),
                               guard, guard_index)).results[0]
    out = lw.emit(ptx.RegsOp("b32", nregs)).results[0]
    lo = np.array([run.reg + 2 * w for run in runs for w in range(words_per_run)])
    if bf16_as_f32:
        lw.op("shl.b32", None, words, Imm(16), into=out, dest=lo, n=len(lo))
        lw.op("and.b32", None, words, Imm(-65536), into=out, dest=lo + 1, n=len(lo))
        return out
    lw.op("and.b32", None, words, Imm(0xFFFF), into=out, dest=lo, n=len(lo))
    lw.op("shr.b32", None, words, Imm(16), into=out, dest=lo + 1, n=len(lo))
    return out


def _load_converted(lw: KernelLowering, space: str, mem_type: Attribute, dst_type: Attribute, runs: list[Run],
                    addr: SSAValue, base_of: np.ndarray, offset: np.ndarray, guard: SSAValue | None) -> SSAValue:
    """Registers of `dst_type` loaded by `runs` of `mem_type` (memory's dtype), converted where the two differ: a
    bf16 vector's words go straight into f32 slots (two instructions a word, not four)."""
    index = np.arange(len(runs))
    if (mem_type != dst_type and _pairs(mem_type) and isinstance(mem_type.element_type, BFloat16Type)
            and any(run.length > 1 for run in runs)):
        slots = _load_pairs(lw, space, _nregs(mem_type), runs, addr, base_of, offset, guard,
                            index if guard is not None else None, bf16_as_f32=True)
        return pack(lw, slots, dst_type)
    regs = _load_runs(lw, space, mem_type, runs, addr, base_of, offset, guard, index)
    return pack(lw, unpack(lw, regs, mem_type), dst_type) if mem_type != dst_type else regs


def _store_converted(lw: KernelLowering, space: str, mem_type: Attribute, value_type: Attribute, value: SSAValue,
                     runs: list[Run], addr: SSAValue, base_of: np.ndarray, offset: np.ndarray,
                     guard: SSAValue | None) -> None:
    """Registers `value` of `value_type` stored by `runs` of `mem_type` (memory's dtype), converted where the two
    differ: a 16-bit vector's straight from its f32 slots into the words stored (_store_runs's f32_slots)."""
    index = np.arange(len(runs))
    if mem_type != value_type and _pairs(mem_type) and any(run.length > 1 for run in runs):
        _store_runs(lw, space, mem_type, value, runs, addr, base_of, offset, guard, index,
                    f32_slots=unpack(lw, value, value_type))
        return
    if mem_type != value_type:
        value = pack(lw, unpack(lw, value, value_type), mem_type)
    _store_runs(lw, space, mem_type, value, runs, addr, base_of, offset, guard, index)


def _store_runs(lw: KernelLowering, space: str, reg_type: Attribute, value: SSAValue, runs: list[Run], addr: SSAValue,
                base_of: np.ndarray, offset: np.ndarray, guard: SSAValue | None = None,
                guard_index: np.ndarray | None = None, f32_slots: SSAValue | None = None) -> None:
    """Store `value` (registers of `reg_type`) by `runs`; a 16-bit vector's elements go two to a word, merged by
    prmt, or with `f32_slots` (the value as f32, one element a register) converted two at a time straight into
    the word (cvt.rn.bf16x2.f32: one instruction a word, not three)."""
    packed = isinstance(reg_type, RegTileType) and is_packed(reg_type.element_type)
    if packed and all(run.length == 1 for run in runs):
        byte = element_bytes(reg_type.element_type) == 1  # type: ignore[attr-defined]
        upper = lw.op("shr.b32", "b32", value, Imm(8 if byte else 16))
        for half, source in ((0, value), (1, upper)):
            sel = np.array([i for i, r in enumerate(runs) if r.half == half])
            lw.emit(ptx.StoreOp(space, "b8" if byte else "b16", 1, addr, base_of[sel], offset[sel], source,
                                np.array([runs[i].reg for i in sel]), guard,
                                guard_index[sel] if guard is not None else None))  # type: ignore[index]
        return
    gi = guard_index if guard is not None else None
    if _pairs(reg_type) and any(run.length > 1 for run in runs):
        words_per_run = runs[0].length // 2
        lo = np.array([run.reg + 2 * w for run in runs for w in range(words_per_run)])
        if f32_slots is not None:
            name = ptx_type_name(reg_type.element_type)  # type: ignore[attr-defined]
            words = lw.op(f"cvt.rn.{name}x2.f32", "b32", (f32_slots, lo + 1), (f32_slots, lo), n=len(lo))
        else:
            words = lw.op("prmt.b32", "b32", (value, lo), (value, lo + 1), Imm(0x5410), n=len(lo))
        lw.emit(ptx.StoreOp(space, "b32", words_per_run, addr, base_of, offset, words,
                            np.arange(len(runs)) * words_per_run, guard, gi))
        return
    ptx_type, vec = runs[0].ptx_type_and_vec(packed)
    lw.emit(ptx.StoreOp(space, ptx_type, vec, addr, base_of, offset, value, np.array([r.reg for r in runs]),
                        guard, gi))


# --------------------------------------------------------------------------------------------------------------
# Global ↔ registers


def _global_access(lw: KernelLowering, g: GlobalRef, reg_type: Attribute, coords: list[Any],
                   sc: np.ndarray | None = None, gathered: GlobalRef | None = None):
    """Runs, address bundle (b64), per-run (base, offset), and guard predicates for a register tile/vector at
    tile coordinates `coords` of global tensor g. A run's row and column are this lane's part (shared by every
    run) plus a constant: one address register per distinct row constant, the column constant an immediate.
    `sc`: where each slot's element lies ([lane, slot, (row, col)]), if not where the fragment puts it.
    `gathered` (rows_at): the index tensor whose elements row0 + r give the rows of g to access."""
    mem_type = _register_type(reg_type, g.type.element_type)
    e = element_bytes(g.type.element_type)
    tile_shape = reg_type.shape  # type: ignore[attr-defined]
    k = len(tile_shape)
    sc = slot_coords(mem_type) if sc is None else sc
    rank = g.type.rank
    lead, tile_coords = coords[:-k], coords[-k:]
    # a register vector at rows(r): its elements start at any element r, so no access wider than one element is
    # known to be aligned (a tile's rows(r) moves whole rows, whose pitch the tensor's alignment covers)
    widest = e if k == 1 and isinstance(tile_coords[0], InRows) else min(16, g.align)
    runs = plan_runs(mem_type, sc, widest)
    parts = {axis: {_affine(sc[:, run.start, axis])[:2] for run in runs} for axis in (0, 1)}
    if len(parts[0]) != 1 or len(parts[1]) != 1:
        raise TkcError("internal: the runs of a tile do not share a per-lane position")
    (ra, rb), (ca, cb) = next(iter(parts[0])), next(iter(parts[1]))
    row_statics = [_affine(sc[:, run.start, 0])[2] for run in runs]
    col_statics = [_affine(sc[:, run.start, 1])[2] for run in runs]
    row0 = add_i32(lw, mul_imm(lw, tile_coords[0], tile_shape[0]), lw.expr(_lane_expr(ra, rb))) if k == 2 else Imm(0)
    col0 = add_i32(lw, mul_imm(lw, tile_coords[-1], tile_shape[-1]), lw.expr(_lane_expr(ca, cb)))
    ptr, ok_lead = lead_pointer(lw, g, lead)
    end = tile_coords[0].end if isinstance(tile_coords[0], InRows) else None  # rows(r, end): a tile's or vector's
    distinct_rows = sorted(set(row_statics))
    if k == 2 and gathered is None:
        ptr = mad64(lw, row0, g.strides[rank - 2], ptr)
    ptr = mad64(lw, col0, g.strides[rank - 1], ptr)
    if gathered is not None:  # each row's own pointer, from the row number the index tensor holds
        addr, rows_ok = gathered_row_pointers(lw, g, gathered, row0, distinct_rows, ptr, end)
    else:
        row_ptrs = [mad64(lw, Imm(r), g.strides[rank - 2], ptr) if k == 2 else ptr for r in distinct_rows]
        addr = bundle_of(lw, row_ptrs, "b64")
    base_of = np.array([distinct_rows.index(r) for r in row_statics])
    offset = np.array([c * e for c in col_statics])
    distinct_cols = sorted(set(col_statics))
    cols_ok = in_bounds(lw, col0, distinct_cols, g.dims[rank - 1] if k == 2 else row_limit(lw, g.dims[rank - 1], end))
    ci = np.array([distinct_cols.index(c) for c in col_statics])
    if k == 2:
        if gathered is None:
            rows_ok = in_bounds(lw, row0, distinct_rows, row_limit(lw, g.dims[rank - 2], end))
        ri = np.array([distinct_rows.index(r) for r in row_statics])
        guard = lw.op("and.pred", "pred", (rows_ok, ri), (cols_ok, ci), n=len(runs))
    else:
        guard = lw.op("mov.pred", "pred", (cols_ok, ci), n=len(runs))
    if ok_lead is not None:
        guard = lw.op("and.pred", "pred", guard, ok_lead, n=len(runs))
    padding = padding_guard(lw, mem_type, runs)
    if padding is not None:
        guard = lw.op("and.pred", "pred", guard, padding, n=len(runs))
    return mem_type, runs, addr, base_of, offset, guard


def _row_numbers(lw: KernelLowering, op: Any) -> GlobalRef | None:
    """The index tensor of a load's / store's rows_at (None without it)."""
    return lw.value(op.row_index) if op.row_index is not None else None


def _load_global_registers(lw: KernelLowering, op: t.LoadOp) -> list[Any]:
    g: GlobalRef = lw.value(op.source)
    coords = global_coords(lw, op)
    reg_type = op.result.type
    gathered = _row_numbers(lw, op)
    if t.repeat_cols(op) > 1:
        return [_load_repeated(lw, g, reg_type, coords, t.repeat_cols(op), gathered)]
    mem_type, runs, addr, base_of, offset, guard = _global_access(lw, g, reg_type, coords, gathered=gathered)
    return [_load_converted(lw, "global", mem_type, reg_type, runs, addr, base_of, offset, guard)]


def _load_repeated(lw: KernelLowering, g: GlobalRef, reg_type: RegTileType, coords: list[Any], k: int,
                   gathered: GlobalRef | None = None) -> SSAValue:
    """An f32 tile whose every k adjacent columns hold one column of g (`load(..., repeat=k)`): in the row and
    linear layouts slots k·j .. k·j + k − 1 of a lane are such columns, so the lane reads each column once (slot
    k·j's, as runs of a tile of 1/k the columns) and copies it into its k slots."""
    sc = slot_coords(reg_type)
    read = sc[:, ::k].copy()
    read[..., 1] //= k
    if not all((sc[:, i::k, 0] == read[..., 0]).all() and (sc[:, i::k, 1] // k == read[..., 1]).all()
               for i in range(k)):
        raise TkcError(f"internal: {reg_type.spec()} does not keep each {k} repeated columns in a lane's "
                       f"consecutive slots")
    read_type = RegTileType(reg_type.element_type, reg_type.rows.data, reg_type.cols.data // k, Layout.ROW)
    mem_type, runs, addr, base_of, offset, guard = _global_access(lw, g, read_type, coords, read, gathered)
    once = _load_converted(lw, "global", mem_type, read_type, runs, addr, base_of, offset, guard)
    n = nslots(reg_type)
    return lw.op("mov.b32", "b32", (once, np.arange(n) // k), n=n)


def _store_global_registers(lw: KernelLowering, op: t.StoreOp) -> None:
    g: GlobalRef = lw.value(op.dest)
    coords = global_coords(lw, op)
    reg_type = op.value.type
    value = lw.reg(lw.value(op.value))
    mem_type = _register_type(reg_type, g.type.element_type)
    # The exchange holds a few more registers; with 512 threads or more (128 registers a thread at entry) the
    # kernel has none to spare (attention_sm90 at D=64 with three consumer warpgroups would spill).
    wide = quad_transposable(mem_type) and g.align >= 16 and lw.threads < 512
    sc = quad_transposed_coords(mem_type) if wide else None
    access_type = mem_type
    mem_type, runs, addr, base_of, offset, guard = _global_access(lw, g, reg_type, coords, sc, _row_numbers(lw, op))
    if not wide:
        _store_converted(lw, "global", mem_type, reg_type, value, runs, addr, base_of, offset, guard)
        return
    if access_type != reg_type:
        value = pack(lw, unpack(lw, value, reg_type), access_type)
    assert all(run.start == 8 * i and run.length == 8 for i, run in enumerate(runs))
    # Each 16-byte run stored as soon as its quad is transposed: few registers live at once.
    quad_transpose(lw, value, mem_type, lambda out, i: _store_runs(
        lw, "global", mem_type, out, runs[i:i + 1], addr, base_of[i:i + 1], offset[i:i + 1], guard, np.array([i])))


def quad_transposable(type_: Attribute) -> bool:
    """A 16-bit row-layout tile whose rows are whole groups of 32 columns: quad_transpose applies."""
    return (isinstance(type_, RegTileType) and type_.layout == Layout.ROW and element_bytes(type_.element_type) == 2
            and type_.cols.data % 32 == 0)


def quad_transposed_coords(type_: RegTileType) -> np.ndarray:
    """[lane, slot, (row, col)] of quad_transpose's result: the linear layout's (fragments.py)."""
    return slot_coords(type_.with_layout(Layout.LINEAR))


def quad_transpose(lw: KernelLowering, value: SSAValue, type_: RegTileType, each: Any) -> None:
    """A row-layout 16-bit tile's registers exchanged within each quad of lanes so that a lane holds 8 consecutive
    columns of a row (one 16-byte access, not four of 4 bytes: a warp's store then writes 64 bytes of each row it
    touches). Per row of a group of 4 column chunks of 8, the quad's 4×4 matrix of 32-bit words (lane, chunk) is
    transposed in two butterfly stages (shuffles at distance 2, then 1), each lane sending the word its partner
    needs. Quad matrix i's words become registers 4i..4i+3 of a new bundle `out` (their elements where
    quad_transposed_coords says), after which `each(out, i)` is called."""
    frag = tile_fragment(type_)
    groups = type_.cols.data // 32
    quads = [[frag.reg(si, 2 * c + i // 2, 2 * (i % 2) + h) for i in range(4)]
             for si in range(type_.rows.data // 16) for c in range(groups) for h in range(2)]
    lane_bit = {d: lw.at_entry(f"lane&{d}", lambda d=d: lw.op(
        "setp.ne.u32", "pred", lw.op("and.b32", "b32", lw.reg(lw.expr(LANE)), Imm(d), n=1), Imm(0), n=1))
        for d in (1, 2)}
    out = lw.emit(ptx.RegsOp("b32", 4 * len(quads))).results[0]

    def exchange(lo: Any, hi: Any, d: int, into: tuple[SSAValue, np.ndarray, np.ndarray] | None = None):
        """Words lo and hi per pair, the lanes with bit d set taking their partner's lo, the others its hi."""
        n = len(lo[1]) if isinstance(lo, tuple) else ptx.count_of(lo)
        p = lane_bit[d]
        sent = lw.op("selp.b32", "b32", lo, hi, p, n=n)
        got = lw.op("shfl.sync.bfly.b32", "b32", sent, Imm(d), Imm(0x1F), Imm(-1), n=n)
        if into is None:
            return lw.op("selp.b32", "b32", got, lo, p, n=n), lw.op("selp.b32", "b32", hi, got, p, n=n)
        bundle, lo_dest, hi_dest = into
        lw.op("selp.b32", None, got, lo, p, into=bundle, dest=lo_dest, n=n)
        lw.op("selp.b32", None, hi, got, p, into=bundle, dest=hi_dest, n=n)
        return None

    pair = np.array([0, 1])
    for t4, quad in zip(range(0, 4 * len(quads), 4), quads):  # one matrix at a time: few registers live at once
        # Stage 1: words (0, 2) and (1, 3) swap across lanes q, q ^ 2 (the off-diagonal 2×2 blocks).
        low, high = exchange((value, np.array(quad[:2])), (value, np.array(quad[2:])), 2)
        # Stage 2: within each block, words (0, 1) and (2, 3) swap across lanes q, q ^ 1.
        for words, base in ((low, t4), (high, t4 + 2)):
            exchange((words, pair[:1]), (words, pair[1:]), 1, into=(out, np.array([base]), np.array([base + 1])))
        each(out, t4 // 4)


# --------------------------------------------------------------------------------------------------------------
# Op handlers


@handles(t.LoadOp)
def lower_load(lw: KernelLowering, op: t.LoadOp) -> list[Any]:
    src_type, dst_type = op.source.type, op.result.type
    if isinstance(src_type, GlobalType) and isinstance(dst_type, RegTileType | RegVecType):
        return _load_global_registers(lw, op)
    if isinstance(src_type, GlobalType):
        dst = SharedRef(shared_base(lw, offset_of(op)), dst_type)
        copy_global_to_shared(lw, lw.value(op.source), global_coords(lw, op), dst, _row_numbers(lw, op))
        lw.emit(ptx.CpAsyncCommitOp())
        lw.emit(ptx.CpAsyncWaitOp(0))
        return [dst]
    ref: SharedRef = lw.value(op.source)
    coords = [lw.value(i) for i in op.indices]
    if isinstance(dst_type, SharedTileType):
        if dst_type.shape[1] != src_type.shape[1]:
            return [_column_view(lw, ref, dst_type, coords[1])]
        return [_row_view(lw, ref, dst_type, coords[0])]
    ref = _plain(ref, "loading registers from")
    if isinstance(dst_type, RegTileType) and is_packed(dst_type.element_type) and dst_type.element_type == src_type.element_type:
        if _streamable(op):
            return [StreamedTile(ref, dst_type, coords, operand=next(iter(op.result.uses)).index)]
        return [_lower_ldmatrix(lw, ref, dst_type, coords)]
    return [_load_shared_runs(lw, ref, dst_type, coords)]


def _load_shared_runs(lw: KernelLowering, ref: SharedRef, dst_type: Attribute, coords: list[Any],
                      space: str = "shared") -> SSAValue:
    """Registers of `dst_type` loaded from the shared tile `ref` by runs of ld.`space` (converted where the tile
    holds another dtype)."""
    mem_type = _register_type(dst_type, ref.type.element_type)
    runs, bundle, base_of, offset, guard = _shared_run_access(lw, ref, mem_type, coords)
    return _load_converted(lw, space, mem_type, dst_type, runs, bundle, base_of, offset, guard)


@handles(t.ClusterLoadOp)
def lower_cluster_load(lw: KernelLowering, op: t.ClusterLoadOp) -> list[Any]:
    """A register sub-tile of block `rank`'s copy of a shared tile: the tile's address mapped into that block's
    window of the cluster's shared memory (`mapa`), then `ld.shared::cluster` runs as for a tile ldmatrix does not
    take (the window is linear, so the offsets of this block's accesses carry over)."""
    ref = _plain(lw.value(op.source), "loading registers from")
    remote = lw.op("mapa.shared::cluster.u32", "b32", ref.addr, lw.reg(lw.value(op.rank)), n=1)
    return [_load_shared_runs(lw, SharedRef(remote, ref.type), op.result.type, [lw.value(i) for i in op.indices],
                              "shared::cluster")]


@handles(t.ClusterSyncOp)
def lower_cluster_sync(lw: KernelLowering, op: t.ClusterSyncOp) -> None:
    lw.emit(ptx.ClusterBarrierOp("arrive"))
    lw.emit(ptx.ClusterBarrierOp("wait"))


@handles(t.ReadOp)
def lower_read(lw: KernelLowering, op: t.ReadOp) -> list[Any]:
    """One element of an int32 tensor into a register of each thread (0 where an index is out of bounds: the guarded
    load is preceded by a mov of 0). Threads reading one element hit one L1 line."""
    ptr, inside = lead_pointer(lw, lw.value(op.source), [lw.value(i) for i in op.indices])
    return [lw.emit(ptx.LoadOp("global", "b32", 1, ptr, [0], [0], [0], ptx.regs("b32", 1), inside,
                               [0] if inside is not None else None)).results[0]]


@handles(t.ArriveLastOp)
def lower_arrive_last(lw: KernelLowering, op: t.ArriveLastOp) -> list[Any]:
    """Every thread fences its global stores (release at the GPU's scope) and the block meets at a barrier; thread 0
    counts the block's arrival (`atom.acq_rel.gpu`) and, arriving last, sets the count back to 0; `bar.red.or.pred`
    gives its verdict to the whole block, whose threads then fence again (acquire: the other blocks' stores)."""
    if lw.role_threads is not None and lw.role_threads != lw.threads:
        raise TkcError("arrive_last counts whole blocks: not in a warp-specialized kernel's roles")
    ref: GlobalRef = lw.value(op.counter)
    address = mad64(lw, lw.value(op.index), lw.op("mov.b64", "b64", Imm(4), n=1), ref.ptr)  # counter + 4·index
    lw.emit(ptx.FenceOp("acq_rel.gpu"))
    lw.emit(ptx.BarSyncOp(0))
    first = lw.op("setp.eq.s32", "pred", lw.thread_env["tid"], Imm(0), n=1)
    one = lw.op("mov.b32", "b32", Imm(1), n=1)
    before = lw.emit(ptx.AtomOp(address, one, first)).results[0]
    arrived = lw.op("add.s32", "b32", before, Imm(1), n=1)
    last = lw.op("and.pred", "pred", lw.op("setp.eq.s32", "pred", arrived, lw.reg(lw.value(op.arrivals)), n=1), first,
                 n=1)
    zero = lw.op("mov.b32", "b32", Imm(0), n=1)
    lw.emit(ptx.StoreOp("global", "u32", 1, address, [0], [0], zero, [0], guard=last, guard_index=[0]))
    verdict = lw.emit(ptx.BarRedOp(last)).results[0]
    lw.emit(ptx.FenceOp("acq_rel.gpu"))
    return [verdict]


def _row_view(lw: KernelLowering, ref: SharedRef, view: SharedTileType, index: Any) -> SharedRef:
    """Rows index·R .. index·R + R − 1 of a shared tile, as a tile of its own: with the rows in one column panel
    (row bytes within the swizzle width) they are contiguous, and the view starts R·row-bytes further on, a whole
    number of swizzle repeats, so the XOR pattern (and a wgmma descriptor) carries over unchanged."""
    row_bytes = view.shape[1] * element_bytes(view.element_type)
    panel_bytes = min(row_bytes, ref.type.swizzle or row_bytes)  # a row's bytes within one column panel
    if view.shape[0] * panel_bytes % 1024:
        raise TkcError(f"a view of {view.shape[0]} rows of {ref.type.spec()} must start on a 1024-byte boundary")
    offset = mul_imm(lw, index, view.shape[0] * panel_bytes)
    # rows wider than the swizzle are column panels: the view's panels keep the parent's spacing
    panel_rows = (ref.panel_rows or ref.type.shape[0]) if row_bytes > panel_bytes else None
    return SharedRef(lw.reg(add_i32(lw, ref.addr, offset)), view, panel_rows)


def _column_view(lw: KernelLowering, ref: SharedRef, view: SharedTileType, index: Any) -> SharedRef:
    """Columns index·C .. index·C + C − 1 (all rows) of a shared tile, as a tile of its own: whole column panels of
    the parent (C columns fill its swizzle width once or more), each contiguous, rows × swizzle bytes from the
    previous one, as a tile of C columns lies; their XOR pattern (and a wgmma descriptor) is the parent's."""
    panel_bytes = ref.type.swizzle or 0
    view_bytes = view.shape[1] * element_bytes(view.element_type)  # a row of the view
    if not panel_bytes or view_bytes % panel_bytes or ref.panel_rows is not None:
        raise TkcError(f"a view of columns of {ref.type.spec()} must be whole column panels: a multiple of "
                       f"{panel_bytes // element_bytes(view.element_type)} columns of a tile stored whole, got "
                       f"{view.spec()}")
    offset = mul_imm(lw, index, ref.type.shape[0] * view_bytes)
    return SharedRef(lw.reg(add_i32(lw, ref.addr, offset)), view, None)


def _plain(ref: SharedRef, what: str) -> SharedRef:
    if ref.panel_rows is not None and ref.panel_rows != ref.type.shape[0]:
        raise TkcError(f"{what} a view of rows of a wider-than-swizzle shared tile is not supported yet (only wgmma "
                       f"reads such views)")
    return ref


@handles(t.StoreOp)
def lower_store(lw: KernelLowering, op: t.StoreOp) -> None:
    if "tkc.tma_store" in op.attributes:
        from tkc.backend.lower_tma import lower_tma_store

        lower_tma_store(lw, op)
        return
    if isinstance(op.value.type, SharedTileType | SharedVecType):
        copy_shared_to_global(lw, _plain(lw.value(op.value), "storing"), lw.value(op.dest), global_coords(lw, op))
        return
    _store_global_registers(lw, op)


@handles(t.AtomicAddOp)
def lower_atomic_add(lw: KernelLowering, op: t.AtomicAddOp) -> None:
    """A TMA reduction where insert-tma-stores marked it, else `red.global.add.f32` per element (sm_80), or per run
    of 2 or 4 consecutive elements (`.v2`/`.v4`, sm_90)."""
    if "tkc.tma_store" in op.attributes:
        from tkc.backend.lower_tma import lower_tma_store

        lower_tma_store(lw, op, reduce="add")
        return
    g: GlobalRef = lw.value(op.dest)
    value = lw.reg(lw.value(op.value))
    _, runs, addr, base_of, offset, guard = _global_access(lw, g, op.value.type, global_coords(lw, op),
                                                           gathered=_row_numbers(lw, op))
    length = runs[0].length
    assert all(run.length == length for run in runs), "internal: runs of several widths"
    vec = length if get_target(lw.target).sm >= 90 and length in (2, 4) else 1
    # each run as length // vec accesses: run[i] of access k, its part j = k % (length // vec)
    run_of = np.repeat(np.arange(len(runs)), length // vec)
    part = np.tile(np.arange(length // vec), len(runs))
    first_reg = np.array([run.reg for run in runs])
    lw.emit(ptx.StoreOp("global", "f32", vec, addr, base_of[run_of], offset[run_of] + 4 * vec * part, value,
                        first_reg[run_of] + vec * part, guard, run_of, reduce="add"))


@handles(t.InsertOp)
def lower_insert(lw: KernelLowering, op: t.InsertOp) -> list[Any]:
    ref: SharedRef = _plain(lw.value(op.dest), "storing into")
    value_type, dest_type = op.value.type, op.dest.type
    value = lw.reg(lw.value(op.value))
    mem_type = _register_type(value_type, dest_type.element_type)
    runs, bundle, base_of, offset, guard = _shared_run_access(lw, ref, mem_type, [lw.value(i) for i in op.indices])
    _store_converted(lw, "shared", mem_type, value_type, value, runs, bundle, base_of, offset, guard)
    return [SharedRef(ref.addr, dest_type)]


def lower_shared_fill(lw: KernelLowering, op: t.FillOp) -> list[Any]:
    from tkc.backend.lower_compute import _fill_pattern

    type_ = op.result.type
    ref = SharedRef(shared_base(lw, offset_of(op)), type_)
    pattern = _fill_pattern(op.fill_value, RegTileType(type_.element_type, 16, 16))
    if isinstance(type_.element_type, Float32Type):
        pattern = Imm(float(op.fill_value))
    words = lw.op("mov.b32", "b32", pattern, n=4)
    total = type_.nbytes // 16
    iters = -(-total // lw.copy_threads)
    exprs = [(TID + j * lw.copy_threads) * 16 for j in range(iters)]
    shared = share_bases(exprs, {"tid": np.arange(lw.copy_threads)})
    bases = bundle_of(lw, [add_address(lw, ref.addr, lw.expr(b)) for b in shared.bases], "b32")
    guard = None
    if total % lw.copy_threads:
        guard = lw.op("setp.lt.u32", "pred", lw.reg(lw.expr(TID)), ptx.PerInstr([total - j * lw.copy_threads for j in range(iters)]), n=iters)
    lw.emit(ptx.StoreOp("shared", "b32", 4, bases, shared.base, shared.offset, words, np.zeros(iters, dtype=np.int64),
                        guard, np.arange(iters) if guard is not None else None))
    return [ref]


@handles(t.EmptyOp)
def lower_empty(lw: KernelLowering, op: t.EmptyOp) -> list[Any]:
    base = shared_base(lw, offset_of(op))
    return [SharedRef(base if op.buffers == 1 else this_steps_buffer(lw, op, base), op.result.type)]


def this_steps_buffer(lw: KernelLowering, op: t.EmptyOp, base: SSAValue) -> SSAValue:
    """The address of the buffer a double-buffered tile's loop step takes: the (k mod 2)-th at step k."""
    from tkc.passes.allocate_shared import buffer_stride
    from tkc.passes.util import constant_int, innermost_for

    loop = innermost_for(op)  # its steps take the two buffers in turn: step k the (k mod 2)-th
    if loop is None or constant_int(loop.step) != 1:  # type: ignore[attr-defined]
        raise TkcError("a double-buffered shared tile must be made in a loop of step 1 (its buffers alternate "
                       "with the loop index)", SourceLoc.from_attr(op.location))
    parity = lw.op("and.b32", "b32", lw.reg(lw.value(loop.body.block.args[0])), Imm(1), n=1)  # type: ignore[attr-defined]
    return lw.op("mad.lo.s32", "b32", parity, Imm(buffer_stride(op)), base, n=1)  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------------------------
# Bank-conflict analysis for assign-swizzles


def _degree_of_runs(container: Any, reg_type: Attribute) -> int:
    coords = slot_coords(reg_type)
    runs = plan_runs(reg_type, coords, 16)
    worst = 1
    for run in runs:
        rows, cols = coords[:, run.start, 0], coords[:, run.start, 1]
        if isinstance(container, SharedVecType):
            addresses = np.where(cols >= 0, cols * element_bytes(container.element_type), -1)
        else:
            addresses = np.asarray(tile_offset(container, rows, cols))
        worst = max(worst, conflict_degree(addresses, run.nbytes))
    return worst


def shared_access_patterns(op: Operation) -> list[tuple[str, int]]:
    """(what, conflict degree) of each warp-wide shared access the lowering of `op` will issue."""
    if isinstance(op, t.LoadOp) and isinstance(op.source.type, SharedTileType | SharedVecType):
        container, reg_type = op.source.type, op.result.type
        if isinstance(reg_type, RegTileType) and is_packed(reg_type.element_type) and reg_type.element_type == container.element_type:
            if reg_type.layout is None:
                return []
            trans, plan = _ldmatrix_plan(reg_type)
            lane_row, lane_col = _ldmatrix_lane(not trans)
            lanes = {"lane": np.arange(LANES)}
            worst = 1
            for si, sj, _ in plan:
                rows = (lane_row + 16 * si).eval(lanes)
                cols = (lane_col + 16 * sj).eval(lanes)
                worst = max(worst, conflict_degree(np.asarray(tile_offset(container, rows, cols)), 16))
            return [("this load into registers (ldmatrix)", worst)]
        if getattr(reg_type, "layout", None) is None:
            return []
        return [("this load from shared memory", _degree_of_runs(container, _register_type(reg_type, container.element_type)))]
    if isinstance(op, t.InsertOp):
        reg_type = op.value.type
        if getattr(reg_type, "layout", None) is None:
            return []
        return [("this store into shared memory", _degree_of_runs(op.dest.type, _register_type(reg_type, op.dest.type.element_type)))]
    return []
