"""allocate-shared: give every shared buffer an offset in the block's shared memory, within the target's budget.

Each op that creates a shared tile, vector or ring (rather than updating one) owns a buffer for the whole kernel;
stores into a shared tile, loop-carried shared tiles and ring reads use their buffer's. A kernel's TMA stores and
reductions (insert-tma-stores) share one staging buffer, each warp's tile at the largest one's stride
(`tkc.staging_stride`): a warp writes its tile only once its earlier ones have been read. Buffers holding swizzled
tiles start on 1024-byte boundaries (where the swizzle pattern repeats), others on 128 bytes. A double-buffered
`tile.empty` (`tkc.buffers = 2`) gets two buffers side by side, `buffer_stride` apart. The offsets go on
the allocating ops as `tkc.smem_offset`, the total on the kernel as `tkc.smem_bytes`.

    %k_s = tile.load %K[...] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16, swizzle 128>
becomes
    %k_s = tile.load %K[...] {tkc.smem_offset = 0 : i64} : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16, swizzle 128>
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr
from xdsl.ir import Attribute, Operation
from xdsl.passes import ModulePass

from tkc.errors import SourceLoc, TkcError
from tkc.ir import async_ops as a
from tkc.ir import ops as t
from tkc.ir.tma_ops import StageBarriersOp, StageBarriersType
from tkc.ir.types import SharedTileType, SharedVecType
from tkc.passes import register
from tkc.passes.util import double_buffered
from tkc.targets import get_target

OFFSET_ATTR = "tkc.smem_offset"
TOTAL_ATTR = "tkc.smem_bytes"
ALIGNMENT_PAD = 1024  # what a launch asks beyond the buffers, to start them on a 1 KB boundary (swizzled tiles)


STAGING_STRIDE_ATTR = "tkc.staging_stride"  # bytes between two warps' staging tiles (TMA stores and reductions)


def staged(op: Operation) -> bool:
    """A TMA store or reduction of a register tile: it goes through the warp's staging tile."""
    return isinstance(op, t.StoreOp | t.AtomicAddOp) and "tkc.tma_store" in op.attributes


def allocates(op: Operation) -> bool:
    if isinstance(op, a.RingAllocOp | StageBarriersOp):
        return True
    if staged(op):
        return True  # a staging tile per computing warp, one buffer for all of the kernel's (see allocate_shared)
    if isinstance(op, t.LoadOp) and isinstance(op.source.type, SharedTileType):
        return False  # a view of rows of another shared tile
    return isinstance(op, t.LoadOp | t.FillOp | t.EmptyOp) and isinstance(op.results[0].type, SharedTileType | SharedVecType)


def staging_stride(op: Operation) -> int:
    """Bytes between two warps' staging tiles in the kernel's staging buffer (allocate_shared set it on `op`)."""
    return op.attributes[STAGING_STRIDE_ATTR].value.data  # type: ignore[attr-defined]


def _staging_tile_bytes(op: Operation) -> int:
    from tkc.passes.insert_tma_stores import staging_tile

    return staging_tile(op.value.type).nbytes  # type: ignore[attr-defined]


def _size_and_alignment(op: Operation) -> tuple[int, int]:
    if staged(op):
        fn = op.parent_op()
        while fn is not None and not isinstance(fn, func.FuncOp):
            fn = fn.parent_op()
        warps = fn.attributes.get("tkc.consumer_warps", fn.attributes["tkc.warps"])  # type: ignore[union-attr]
        return warps.value.data * staging_stride(op), 1024  # type: ignore[attr-defined]
    type_ = op.results[0].type
    if isinstance(type_, StageBarriersType):
        return type_.nbytes, 8
    if isinstance(type_, a.RingType):
        return type_.nbytes, _alignment(type_.buffer)
    if double_buffered(op):
        return 2 * buffer_stride(op), _alignment(type_)
    return type_.nbytes, _alignment(type_)  # type: ignore[attr-defined]


def _alignment(tile_type: Attribute) -> int:
    """Swizzled tiles start where the swizzle pattern repeats (1024 bytes), others on 128."""
    return 1024 if getattr(tile_type, "swizzle", None) else 128


def buffer_stride(op: t.EmptyOp) -> int:
    """Bytes from a double-buffered tile's first buffer to its second: its size, rounded up to its alignment."""
    align = _alignment(op.result.type)
    return -(-op.result.type.nbytes // align) * align  # type: ignore[attr-defined]


def allocate_shared(module: ModuleOp) -> None:
    target_attr = module.attributes.get("tkc.target")
    target = get_target(target_attr.data if isinstance(target_attr, StringAttr) else "sm_90a")
    for fn in module.ops:
        if not isinstance(fn, func.FuncOp):
            continue
        offset = 0
        # A kernel's TMA stores and reductions share one staging buffer, a tile a warp at the largest one's stride:
        # before writing its tile each warp waits until its own earlier ones have read theirs (lower_tma_store)
        staging = [op for op in fn.walk() if staged(op)]
        stride = max((_staging_tile_bytes(op) for op in staging), default=0)
        for op in staging:
            op.attributes[STAGING_STRIDE_ATTR] = IntegerAttr(stride, 64)
        for op in fn.walk():
            if not allocates(op):
                continue
            if staged(op) and op is not staging[0]:
                op.attributes[OFFSET_ATTR] = staging[0].attributes[OFFSET_ATTR]
                continue
            size, align = _size_and_alignment(op)
            offset = -(-offset // align) * align
            op.attributes[OFFSET_ATTR] = IntegerAttr(offset, 64)
            offset += size
            if offset + ALIGNMENT_PAD > target.shared_bytes:  # the launch asks for the pad too (compile_for_launch)
                raise TkcError(
                    f"shared memory over the {target} budget: kernel `{fn.sym_name.data}` needs "
                    f"{(offset + ALIGNMENT_PAD) / 1024:g} KB with this buffer (pipeline stages count; 1 KB of it aligns "
                    f"the buffers), {target} allows {target.shared_bytes // 1024} KB; use smaller tiles or fewer stages",
                    SourceLoc.from_attr(op.location),
                )
        fn.attributes[TOTAL_ATTR] = IntegerAttr(offset, 64)


@register("allocate-shared", "place every shared buffer in the block's shared memory (offsets, total, budget)")
class AllocateShared(ModulePass):
    name = "allocate-shared"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        allocate_shared(op)
