"""insert-tma-stores: on sm_90a, in kernels with `tma_store=1`, store register tiles to global memory by TMA.

A `tile.store` of a warp's register tile of 2-byte elements into a 16-byte aligned tensor (2-D, or up to 5-D:
a box one matrix of the last two dimensions deep, as TMA loads of such tensors), the tile's rows
whole 32/64/128-byte swizzle panels and at most 256 of them, is marked `tkc.tma_store`. The lowering then gives
each warp a swizzled staging tile in shared memory (allocate-shared reserves one per computing warp): the warp
waits until its previous TMA store has read the staging tile, writes its registers there, fences them toward the
async proxy, and one lane starts a TMA store per swizzle panel (bulk group; the kernel waits for them before it
exits). The tensor's edges are clipped by TMA, as a masked store would drop them. Semantics do not change.
A `tile.atomic_add` of an f32 tile is marked in every kernel: its TMA store is a reduction (`cp.reduce.async.bulk
.tensor ... .add`), the sum made in L2.

    tile.store %c, %C[%i, %j] : !tile.rt<16x256xbf16, row> -> !tile.gl<?x?xbf16>
becomes
    tile.store %c, %C[%i, %j] {tkc.tma_store} : !tile.rt<16x256xbf16, row> -> !tile.gl<?x?xbf16>
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, StringAttr, UnitAttr
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from tkc.backend.shared_layout import swizzle_for
from tkc.ir import ops as t
from tkc.ir.types import GlobalType, RegTileType, SharedTileType, element_bytes
from tkc.passes import register

TMA_STORE = "tkc.tma_store"


def staging_tile(value: RegTileType) -> SharedTileType:
    """The shared tile a warp's register tile goes through on its way to a TMA store."""
    row_bytes = value.cols.data * element_bytes(value.element_type)
    return SharedTileType(value.element_type, value.rows.data, value.cols.data, swizzle_for(row_bytes))


def tma_storable(op: t.StoreOp | t.AtomicAddOp, fn: func.FuncOp) -> bool:
    from tkc.passes.insert_tma_pipeline import MAX_BOX_ROWS, _aligned_args

    value, dest = op.value.type, op.dest.type
    if not (isinstance(value, RegTileType) and isinstance(dest, GlobalType) and 2 <= dest.rank <= 5):
        return False
    if op.row_index is not None or op.rows_end is not None:  # rows by row numbers, or cut short: not a TMA box
        return False
    e = element_bytes(value.element_type)
    return (e == (4 if isinstance(op, t.AtomicAddOp) else 2) and value.element_type == dest.element_type
            and value.rows.data <= MAX_BOX_ROWS and swizzle_for(value.cols.data * e) >= 32
            and op.dest in _aligned_args(fn))


def goes_by_tma(op: Operation, fn: func.FuncOp) -> bool:
    """Does this pass (on sm_90a) send `op` through a staging tile and TMA? Atomic adds always (a TMA reduction
    moves whole lines; red.global per lane is ~2.4× slower: RESULTS "attention backward, dQ by atomics"), stores in
    kernels with tma_store=1; both where tma_storable."""
    return ((isinstance(op, t.AtomicAddOp) or (isinstance(op, t.StoreOp) and TMA_STORE in fn.attributes))
            and tma_storable(op, fn))


def insert_tma_stores(module: ModuleOp) -> None:
    target = module.attributes.get("tkc.target")
    if not (isinstance(target, StringAttr) and target.data.startswith("sm_90")):
        return
    for fn in module.ops:
        if isinstance(fn, func.FuncOp):
            for op in fn.walk():
                if goes_by_tma(op, fn):
                    op.attributes[TMA_STORE] = UnitAttr()


@register("insert-tma-stores", "on sm_90a (tma_store=1), store register tiles to aligned 2-D tensors by TMA")
class InsertTmaStores(ModulePass):
    name = "insert-tma-stores"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        insert_tma_stores(op)
