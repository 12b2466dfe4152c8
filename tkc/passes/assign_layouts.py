"""assign-layouts: give every register tile and vector a fragment layout, converting where uses disagree.

Each mma operand needs one layout (A: row, B of mma_AB: col, B of mma_ABt: row, accumulator: row); elementwise
ops, conversions, masks and loop-carried values keep their operand's layout; a tile's row vectors are `align`
in a row-layout tile and `ortho` in a col-layout one (and the reverse for column vectors); `transpose` flips
the layout (it is free: the same registers). Loads pick whatever their users need (`ldmatrix` or
`ldmatrix.trans`). Values linked this way form groups solved together (a union-find with a parity bit:
parity 0 = row/align, 1 = col/ortho); a group takes the layout most of its mma uses need, and each use that needs
the other gets the tile loaded again from shared memory in its layout (where it came from there and nothing in
between may write shared memory: CSE merges a kernel's two loads of one shared tile) or else a `tile.relayout`.
Vectors linked to no tile are `naive`. A group of tiles that meets no mma, reduction, broadcast, transpose or shared
memory (loaded from and stored to global memory, elementwise ops between) takes the `linear` layout: 8 consecutive
columns of a row a lane, 16-byte global accesses.

    %b = tile.load %v_s[%c0, %c0] : !tile.st<64x64xbf16> -> !tile.rt<64x64xbf16>
    %o = tile.mma_AB %p, %b, %acc : !tile.rt<16x64xbf16>, !tile.rt<64x64xbf16>, !tile.rt<16x64xf32>
becomes
    %b = tile.load %v_s[%c0, %c0] : !tile.st<64x64xbf16> -> !tile.rt<64x64xbf16, col>
    %o = tile.mma_AB %p, %b, %acc : !tile.rt<16x64xbf16, row>, !tile.rt<64x64xbf16, col>, !tile.rt<16x64xf32, row>
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import scf
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from tkc.errors import SourceLoc, TkcError
from tkc.ir import ops as t
from tkc.ir.types import GlobalType, Layout, RegTileType, RegVecType, SharedTileType
from tkc.passes import register
from tkc.passes.sum_rows_after_loop import holds_partial_sums
from tkc.passes.util import shared_unchanged_between, sync_function_types

TILE_LAYOUT = (Layout.ROW, Layout.COL)
VECTOR_LAYOUT = (Layout.ALIGN, Layout.ORTHO)


def is_register(value: SSAValue) -> bool:
    return isinstance(value.type, RegTileType | RegVecType)


class ParityUnionFind:
    """Groups of values whose layouts are equal or opposite."""

    def __init__(self) -> None:
        self.parent: dict[SSAValue, SSAValue] = {}
        self.parity: dict[SSAValue, int] = {}  # parity relative to the parent

    def find(self, v: SSAValue) -> tuple[SSAValue, int]:
        if v not in self.parent:
            self.parent[v], self.parity[v] = v, 0
            return v, 0
        p = self.parent[v]
        if p is v:
            return v, 0
        root, par = self.find(p)
        self.parent[v], self.parity[v] = root, self.parity[v] ^ par
        return root, self.parity[v]

    def union(self, a: SSAValue, b: SSAValue, parity: int) -> bool:
        """layout(b) = layout(a) ^ parity; False if that contradicts what is known."""
        ra, pa = self.find(a)
        rb, pb = self.find(b)
        if ra is rb:
            return (pa ^ pb) == parity
        self.parent[rb], self.parity[rb] = ra, pa ^ pb ^ parity
        return True


@dataclass(frozen=True)
class Use:
    op: Operation
    index: int  # operand index


def _links(op: Operation) -> list[tuple[Use | None, SSAValue, SSAValue, int]]:
    """(use, a, b, parity): the layout of b must be that of a ^ parity; on conflict, convert at `use`."""
    links: list[tuple[Use | None, SSAValue, SSAValue, int]] = []
    if isinstance(op, t.UnaryOp | t.ConvertOp | t.TriangleOp | t.FinishRowSumOp | t.RotatePairsOp):
        links.append((Use(op, 0), op.results[0], op.operands[0], 0))
    elif isinstance(op, t.BinaryOp):
        for i, operand in enumerate(op.operands):
            if is_register(operand):
                links.append((Use(op, i), op.result, operand, 0))
    elif isinstance(op, t.BroadcastBinaryOp):
        links.append((Use(op, 0), op.result, op.tile, 0))
        links.append((Use(op, 1), op.result, op.vec, 0 if op.axis == "row" else 1))
    elif isinstance(op, t.ReduceOp):
        links.append((Use(op, 0), op.result, op.input, 0 if op.axis == "row" else 1))
        if op.acc is not None:
            links.append((Use(op, 1), op.result, op.acc, 0))
    elif isinstance(op, t.BroadcastOp):
        links.append((Use(op, 0), op.result, op.vec, 0 if op.axis == "row" else 1))
    elif isinstance(op, t.TransposeOp):
        links.append((Use(op, 0), op.result, op.input, 1))
    elif isinstance(op, t.MmaOp | t.WgmmaOp):
        links.append((Use(op, 2), op.result, op.c, 0))
    elif isinstance(op, scf.ForOp):
        body = op.body.block
        yield_op = body.last_op
        for i, (init, arg, result) in enumerate(zip(op.iter_args, body.args[1:], op.results)):
            if is_register(init):
                links.append((Use(op, 3 + i), arg, init, 0))
                links.append((None, arg, result, 0))
                links.append((Use(yield_op, i), arg, yield_op.operands[i], 0))  # type: ignore[union-attr]
    elif isinstance(op, scf.IfOp):
        for region in (op.true_region, op.false_region):
            if region.blocks:
                yield_op = region.block.last_op
                for i, result in enumerate(op.results):
                    if is_register(result):
                        links.append((Use(yield_op, i), result, yield_op.operands[i], 0))  # type: ignore[union-attr]
    return links


def _requirements(op: Operation) -> list[tuple[Use, int]]:
    """Uses that need one parity: the operands of an mma (and its accumulator)."""
    if isinstance(op, t.WgmmaOp):  # a warp's slice of the wgmma accumulator (and of a register A) is row layout
        return [(Use(op, 2), 0)] + ([(Use(op, 0), 0)] if is_register(op.a) else [])
    if not isinstance(op, t.MmaOp):
        return []
    return [(Use(op, 0), 1 if op.transpose_a else 0), (Use(op, 1), 0 if op.transpose_b else 1), (Use(op, 2), 0)]


def assign_layouts(module: ModuleOp) -> None:
    uf = ParityUnionFind()
    values: list[SSAValue] = []
    conflicts: list[tuple[Use, SSAValue, int]] = []  # use must see `value` with layout(anchor) ^ parity
    requirements: list[tuple[Use, int]] = []
    ops = list(module.walk())
    for op in ops:
        for v in [*op.results, *(a for r in op.regions for b in r.blocks for a in b.args)]:
            if is_register(v):
                values.append(v)
                uf.find(v)
        for use, a, b, parity in _links(op):
            if not uf.union(a, b, parity) and use is not None:
                conflicts.append((use, a, parity))
        requirements.extend(_requirements(op))

    # Choose each group's parity: what most of its mma uses need (the accumulator counts double).
    votes: dict[SSAValue, Counter[int]] = defaultdict(Counter)
    for use, need in requirements:
        root, par = uf.find(use.op.operands[use.index])
        votes[root][need ^ par] += 2 if use.index == 2 else 1
    has_tile: set[SSAValue] = {uf.find(v)[0] for v in values if isinstance(v.type, RegTileType)}
    linear = _linear_groups(uf, values, set(votes) | {uf.find(anchor)[0] for _, anchor, _ in conflicts})
    turns = [op for op in ops if isinstance(op, t.RotatePairsOp)]
    for op in turns:  # a pair of columns in one lane: the row layout, where the group is not linear
        root, par = uf.find(op.input)
        if root not in linear:
            votes[root][par] += 1
    chosen: dict[SSAValue, int] = {root: (c.most_common(1)[0][0] if c else 0) for root, c in votes.items()}

    def layout_of(v: SSAValue) -> Layout:
        root, par = uf.find(v)
        parity = chosen.get(root, 0) ^ par
        if isinstance(v.type, RegTileType):
            return Layout.LINEAR if root in linear else TILE_LAYOUT[parity]
        return VECTOR_LAYOUT[parity] if root in has_tile else Layout.NAIVE

    # Uses that see the wrong layout get a relayout of the operand in front of them.
    fixes: list[tuple[Use, Layout]] = []
    for use, need in requirements:
        value = use.op.operands[use.index]
        if layout_of(value) != TILE_LAYOUT[need]:
            fixes.append((use, TILE_LAYOUT[need]))
    for use, anchor, parity in conflicts:
        value = use.op.operands[use.index]
        want_parity = _parity(layout_of(anchor)) ^ parity
        table = TILE_LAYOUT if isinstance(value.type, RegTileType) else VECTOR_LAYOUT
        if layout_of(value) != table[want_parity]:
            fixes.append((use, table[want_parity]))

    for op in turns:
        if layout_of(op.input) == Layout.COL:
            raise TkcError("rotate_pairs needs its tile in the row layout (each pair of columns in one lane), but "
                           "this tile, or a value computed from it, is mostly an mma's B operand, which wants the col "
                           "layout (tkc does not move f32 tiles between the two yet)", SourceLoc.from_attr(op.location))
    layouts = {v: layout_of(v) for v in values}
    for v in values:
        Rewriter.replace_value_with_new_type(v, v.type.with_layout(layouts[v]))  # type: ignore[attr-defined]
    for use, layout in fixes:
        operand = use.op.operands[use.index]
        if operand.type.layout == layout:  # type: ignore[attr-defined]
            continue
        if isinstance(operand.type, RegVecType) and holds_partial_sums(operand):
            raise TkcError("late_sums=1: these row sums would change layout while their lanes hold only parts of "
                           "them (compile without late_sums)", SourceLoc.from_attr(use.op.location))
        if _reloadable(operand, use.op):  # read the shared tile again in the other layout: no register shuffles
            fixed: Operation = t.LoadOp(operand.op.source, operand.op.indices,  # type: ignore[attr-defined]
                                        operand.type.with_layout(layout))  # type: ignore[attr-defined]
        else:
            fixed = t.RelayoutOp(operand, operand.type.with_layout(layout))  # type: ignore[attr-defined]
        fixed.location = use.op.location
        Rewriter.insert_op(fixed, InsertPoint.before(use.op))
        use.op.operands[use.index] = fixed.results[0]
    sync_function_types(module)


def _linear_groups(uf: ParityUnionFind, values: list[SSAValue], constrained: set[SSAValue]) -> set[SSAValue]:
    """The groups that take the linear layout: register tiles (each a multiple of 32 columns wide) that only global
    loads make, only global stores read, and that otherwise meet only elementwise ops and loops: no mma, no
    reduction or broadcast, no transpose, no shared memory (which want the mma fragments)."""
    out: dict[SSAValue, bool] = {}
    for v in values:
        root = uf.find(v)[0]
        fits = (root not in constrained and isinstance(v.type, RegTileType) and v.type.cols.data % 32 == 0
                and _linear_ok(v.owner, v) and all(_linear_ok(use.operation, v) for use in v.uses))
        out[root] = out.get(root, True) and fits
    return {root for root, fits in out.items() if fits}


def _linear_ok(op: Operation | Block, value: SSAValue) -> bool:
    """Can `op`, which makes or reads `value`, take it in the linear layout?"""
    if isinstance(op, Block | t.UnaryOp | t.BinaryOp | t.ConvertOp | t.FillOp | t.RotatePairsOp | scf.ForOp | scf.IfOp
                  | scf.YieldOp):
        return True
    if isinstance(op, t.LoadOp):
        return isinstance(op.source.type, GlobalType)
    return isinstance(op, t.StoreOp) and op.value is value


def _reloadable(value: SSAValue, user: Operation) -> bool:
    """Is `value` a register tile loaded from a shared tile that nothing changes before `user`? Then `user` can load
    it again in its own layout (ldmatrix or ldmatrix.trans) rather than shuffle registers, and the first load's
    registers need not live until `user`."""
    load = value.owner
    return (isinstance(load, t.LoadOp) and isinstance(load.source.type, SharedTileType)
            and isinstance(value.type, RegTileType) and shared_unchanged_between(load, user))


def _parity(layout: Layout) -> int:
    return 0 if layout in (Layout.ROW, Layout.ALIGN) else 1


@register("assign-layouts", "give every register tile and vector a fragment layout (mma.m16n8k16)")
class AssignLayouts(ModulePass):
    name = "assign-layouts"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        assign_layouts(op)
