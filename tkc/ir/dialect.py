"""The `tile` dialect and the xDSL context that knows every dialect tkc's IR uses."""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects import arith, builtin, func, math, scf
from xdsl.ir import Dialect

from tkc.ir.ops import TILE_OPS
from tkc.ir.types import GlobalType, RegTileType, RegVecType, SharedTileType, SharedVecType

Tile = Dialect("tile", TILE_OPS, [GlobalType, RegTileType, RegVecType, SharedTileType, SharedVecType])


def make_context() -> Context:
    """A context with builtin, func, arith, math, scf and tile loaded (and later, tkc's lower dialects)."""
    ctx = Context()
    for dialect in (builtin.Builtin, func.Func, arith.Arith, math.Math, scf.Scf, Tile):
        ctx.load_dialect(dialect)
    return ctx
