"""The tile IR: an xDSL dialect whose types are ThunderKittens' tiles and whose ops are its vocabulary."""

from tkc.ir.dialect import Tile, make_context
from tkc.ir.types import GlobalType, Layout, RegTileType, RegVecType, SharedTileType, SharedVecType

__all__ = ["GlobalType", "Layout", "RegTileType", "RegVecType", "SharedTileType", "SharedVecType", "Tile", "make_context"]
