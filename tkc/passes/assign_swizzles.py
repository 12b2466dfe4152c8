"""assign-swizzles: pick a 32/64/128-byte swizzle for every shared tile and report accesses that still conflict.

A tile is stored as column panels as wide as its swizzle (see backend/shared_layout.py); the widest swizzle
that divides a row is chosen, which makes `ldmatrix` reads (8 rows × 16 bytes per phase) and row-contiguous
copies conflict-free and is the layout TMA and wgmma use on Hopper. Every shared access of the kernel is then
checked lane by lane the way the lowering will issue it; one that needs more than one wavefront per
instruction is reported as a warning with its source line and conflict degree (`--werror` makes it an error).

    %s = tile.load %A[%i, %c0] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>
becomes
    %s = tile.load %A[%i, %c0] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16, swizzle 128>
"""

from __future__ import annotations

import warnings

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter

from tkc.backend.shared_layout import swizzle_for
from tkc.diagnostics import TkcWarning
from tkc.errors import SourceLoc
from tkc.ir import async_ops as a
from tkc.ir import ops as t
from tkc.ir.types import SharedTileType, element_bytes
from tkc.passes import register
from tkc.passes.util import sync_function_types


def swizzled(type_: Attribute) -> Attribute:
    if isinstance(type_, SharedTileType) and type_.swizzle is None:
        return type_.with_swizzle(swizzle_for(type_.cols.data * element_bytes(type_.element_type)))
    if isinstance(type_, a.RingType):
        return type_.with_buffer(swizzled(type_.buffer))
    return type_


def assign_swizzles(module: ModuleOp) -> None:
    values: list[SSAValue] = []
    for op in module.walk():
        values.extend(op.results)
        for region in op.regions:
            for block in region.blocks:
                values.extend(block.args)
    for v in values:
        new = swizzled(v.type)
        if new != v.type:
            Rewriter.replace_value_with_new_type(v, new)
    sync_function_types(module)


def report_conflicts(module: ModuleOp) -> None:
    from tkc.backend.lower_memory import shared_access_patterns

    for op in module.walk():
        expected = op.attributes.get(t.CONFLICTS_ATTR)  # store / load(..., conflicts=n): known to its author
        for what, degree in shared_access_patterns(op):
            if degree > (expected.value.data if expected is not None else 1):
                message = f"{what} has a {degree}-way shared memory bank conflict"
                warnings.warn(TkcWarning(message, SourceLoc.from_attr(op.location)), stacklevel=2)


@register("assign-swizzles", "pick a swizzle for every shared tile; warn about accesses that bank-conflict")
class AssignSwizzles(ModulePass):
    name = "assign-swizzles"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        assign_swizzles(op)
        report_conflicts(op)
