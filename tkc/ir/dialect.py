"""The `tile` dialect and the xDSL context that knows every dialect tkc's IR uses."""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects import arith, builtin, func, math, scf
from xdsl.ir import Dialect

from tkc.ir.async_ops import ASYNC_OPS, ASYNC_TYPES
from tkc.ir.ops import TILE_OPS
from tkc.ir.tma_ops import TMA_OPS, TMA_TYPES
from tkc.ir.types import GlobalType, RegTileType, RegVecType, SharedTileType, SharedVecType

Tile = Dialect("tile", [*TILE_OPS, *ASYNC_OPS, *TMA_OPS],
               [GlobalType, RegTileType, RegVecType, SharedTileType, SharedVecType, *ASYNC_TYPES, *TMA_TYPES])


def make_context() -> Context:
    """A context with builtin, func, arith, math, scf, tile and ptx loaded."""
    from tkc.backend.ptx import Ptx

    ctx = Context()
    for dialect in (builtin.Builtin, func.Func, arith.Arith, math.Math, scf.Scf, Tile, Ptx):
        ctx.load_dialect(dialect)
    return ctx
