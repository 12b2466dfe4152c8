"""Operations of the `tile` dialect.

Tiles are values: every op returns a new tile (SSA), shared tiles included; a store into a shared tile
(`tile.insert`) returns the updated tile. Register ops are per warp; ops that produce shared tiles are
collective over the block. Loads and stores address a global tensor in units of the tile: for a tile of R×C,
index (.., i, j) names rows [i·R, (i+1)·R) and columns [j·C, (j+1)·C); leading indices are plain element
indices. Loads past the end of a global tensor read zeros and stores past the end are dropped.

    %q = tile.load %Q[%b, %h, %i, %c0] : !tile.gl<?x?x?x?xbf16> -> !tile.rt<16x64xbf16>
    %s = tile.mma_ABt %q, %k, %z : !tile.rt<16x64xbf16>, !tile.rt<64x64xbf16>, !tile.rt<16x64xf32>
    %m = tile.row_max %s : !tile.rt<16x64xf32> -> !tile.rv<16xf32>
    %p = tile.sub_row %s, %m : !tile.rt<16x64xf32>, !tile.rv<16xf32>
    tile.store %o, %O[%b, %h, %i, %c0] : !tile.rt<16x64xbf16> -> !tile.gl<?x?x?x?xbf16>
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects import func, scf
from xdsl.dialects.builtin import (
    ArrayAttr,
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    f32,
    i1,
    i32,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    VarConstraint,
    base,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import (EffectInstance, MemoryAllocEffect, MemoryEffect, MemoryEffectKind, MemoryReadEffect,
                         MemoryWriteEffect, Pure)
from xdsl.utils.exceptions import VerifyException

from tkc.ir.async_ops import GroupWaitOp
from tkc.ir.types import (
    FP8_TYPES,
    I32,
    INDEX_TYPES,
    GlobalType,
    Layout,
    RegTileType,
    RegVecType,
    SharedTileType,
    SharedVecType,
    element_name,
)

REGISTER = base(RegTileType) | base(RegVecType)
ANY_TILE = base(RegTileType) | base(RegVecType) | base(SharedTileType) | base(SharedVecType)
SCALAR = base(Float32Type)
DIM_NAMES = ("x", "y", "z")


def spec(t: Attribute) -> str:
    """How the DSL spells a type, for messages: `rt[bf16, 16, 64]`, `f32`. An assigned layout or swizzle is added,
    `rt[bf16, 16, 64] (col layout)`, so that types that differ only there do not read the same."""
    if not hasattr(t, "spec"):
        return str(t)
    text = t.spec()  # type: ignore[attr-defined]
    if getattr(t, "layout", None) is not None:
        text += f" ({t.layout.value} layout)"  # type: ignore[attr-defined]
    if getattr(t, "swizzle", None) is not None:
        text += f" (swizzle {t.swizzle})"  # type: ignore[attr-defined]
    return text


def _f64(value: float) -> FloatAttr:
    return FloatAttr(value, Float64Type())


def _print_number(printer: Printer, value: float) -> None:
    if math.isnan(value):
        printer.print_string("nan")
    elif math.isinf(value):
        printer.print_string("inf" if value > 0 else "-inf")
    else:
        # repr is the shortest text that reads back exactly, but may lack a `.` (`1e-05`), which the IR lexer
        # would take for the integer 1 followed by `e`: add one
        mantissa, e, exponent = repr(float(value)).partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        printer.print_string(mantissa + e + exponent)


def _parse_number(parser: Parser) -> float:
    negative = parser.parse_optional_punctuation("-") is not None
    if parser.parse_optional_keyword("inf") is not None:
        value = math.inf
    elif parser.parse_optional_keyword("nan") is not None:
        value = math.nan
    else:
        value = float(parser.expect(parser.parse_optional_number, "expected a number, inf or nan"))
    return -value if negative else value


# --------------------------------------------------------------------------------------------------------------
# Indices and sizes


class _GridIndexOp(IRDLOperation):
    """Base of ops that read one dimension (x, y, z) of the launch grid."""

    dim = prop_def(IntegerAttr[IntegerType])
    result = result_def(i32)
    traits = traits_def(Pure())

    def __init__(self, dim: int):
        super().__init__(properties={"dim": IntegerAttr(dim, 64)}, result_types=[i32])

    def verify_(self) -> None:
        if not 0 <= self.dim.value.data < 3:
            raise VerifyException(
                f"{self.name.split('.')[1]}: dimension must be 0, 1 or 2 (x, y or z), got {self.dim.value.data}"
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(f" {DIM_NAMES[self.dim.value.data]}")
        printer.print_op_attributes(self.attributes)

    @classmethod
    def parse(cls, parser: Parser) -> _GridIndexOp:
        name = parser.parse_identifier()
        if name not in DIM_NAMES:
            parser.raise_error(f"expected x, y or z, got {name}")
        op = cls(DIM_NAMES.index(name))
        op.attributes |= parser.parse_optional_attr_dict()
        return op


@irdl_op_definition
class BlockIdxOp(_GridIndexOp):
    """`%b = tile.block_idx x`: the index of this block in the grid."""

    name = "tile.block_idx"


@irdl_op_definition
class NumBlocksOp(_GridIndexOp):
    """`%n = tile.num_blocks x`: the number of blocks of the grid along one dimension."""

    name = "tile.num_blocks"


class _NullaryIndexOp(IRDLOperation):
    result = result_def(i32)
    traits = traits_def(Pure())
    assembly_format = "attr-dict"

    def __init__(self):
        super().__init__(result_types=[i32])


@irdl_op_definition
class WarpIdOp(_NullaryIndexOp):
    """`%w = tile.warp_id`: the index of this warp in its block."""

    name = "tile.warp_id"


@irdl_op_definition
class WarpgroupIdOp(_NullaryIndexOp):
    """`%g = tile.warpgroup_id`: the index of this warpgroup (4 consecutive warps) in its block."""

    name = "tile.warpgroup_id"


@irdl_op_definition
class ClusterRankOp(_NullaryIndexOp):
    """`%r = tile.cluster_rank`: the index of this block in its cluster (`@tkc.kernel(cluster=N)`: N blocks
    consecutive in x; 0 without clusters)."""

    name = "tile.cluster_rank"


@irdl_op_definition
class DimOp(IRDLOperation):
    """`%n = tile.dim %A[2] : !tile.gl<?x?x?xbf16>`: a size of a global tensor, known at run time."""

    name = "tile.dim"
    source = operand_def(GlobalType)
    index = prop_def(IntegerAttr[IntegerType])
    result = result_def(i32)
    traits = traits_def(Pure())

    def __init__(self, source: SSAValue | Operation, index: int):
        super().__init__(operands=[source], properties={"index": IntegerAttr(index, 64)}, result_types=[i32])

    def verify_(self) -> None:
        index, rank = self.index.value.data, self.source.type.rank  # type: ignore[attr-defined]
        if not 0 <= index < rank:
            raise VerifyException(
                f"dim: index {index} is out of range for {spec(self.source.type)}, which has dimensions 0 to {rank - 1}"
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.source)
        printer.print_string(f"[{self.index.value.data}]")
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.source.type)

    @classmethod
    def parse(cls, parser: Parser) -> DimOp:
        source = parser.parse_unresolved_operand()
        parser.parse_punctuation("[")
        index = parser.parse_integer(allow_boolean=False, allow_negative=False)
        parser.parse_punctuation("]")
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        op = cls(parser.resolve_operand(source, parser.parse_type()), index)
        op.attributes |= attrs
        return op


# --------------------------------------------------------------------------------------------------------------
# Fills


_ALLOCATES = frozenset((EffectInstance(MemoryEffectKind.ALLOC),))


class _AllocatesWhenShared(MemoryEffect):
    """An op whose shared result is a buffer of its own: it allocates (so CSE never merges two such ops into one
    buffer that both then write); a register result is a plain value."""

    @classmethod
    def get_effects(cls, op: Operation) -> frozenset[EffectInstance]:
        return _ALLOCATES if isinstance(op.results[0].type, SharedTileType | SharedVecType) else frozenset()


@irdl_op_definition
class FillOp(IRDLOperation):
    """`%t = tile.fill -inf : !tile.rv<16xf32>`: a tile or vector with every element set to one value."""

    name = "tile.fill"
    value = prop_def(FloatAttr)
    result = result_def(ANY_TILE)
    traits = traits_def(_AllocatesWhenShared())

    def __init__(self, value: float, result_type: Attribute):
        super().__init__(properties={"value": _f64(value)}, result_types=[result_type])

    @property
    def fill_value(self) -> float:
        return self.value.value.data

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        _print_number(printer, self.fill_value)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.result.type)

    @classmethod
    def parse(cls, parser: Parser) -> FillOp:
        value = _parse_number(parser)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        op = cls(value, parser.parse_type())
        op.attributes |= attrs
        return op


BUFFERS_ATTR = "tkc.buffers"


@irdl_op_definition
class EmptyOp(IRDLOperation):
    """`%s = tile.empty : !tile.st<64x64xbf16>`: a shared tile or vector whose contents are undefined. In a loop,
    `{tkc.buffers = 2}` gives it two buffers that the loop's steps take in turn (step k the (k mod 2)-th): a step
    may write its tile while the step before's is still being read, with no barrier between them."""

    name = "tile.empty"
    result = result_def(base(SharedTileType) | base(SharedVecType))
    traits = traits_def(MemoryAllocEffect())  # not Pure: CSE would merge two allocations of one type into one buffer
    assembly_format = "attr-dict `:` type($result)"

    def __init__(self, result_type: Attribute, buffers: int = 1):
        super().__init__(result_types=[result_type])
        if buffers != 1:
            self.attributes[BUFFERS_ATTR] = IntegerAttr(buffers, 64)

    @property
    def buffers(self) -> int:
        attr = self.attributes.get(BUFFERS_ATTR)
        return attr.value.data if isinstance(attr, IntegerAttr) else 1

    def verify_(self) -> None:
        attr = self.attributes.get(BUFFERS_ATTR)
        if attr is not None and not (isinstance(attr, IntegerAttr) and attr.value.data in (1, 2)):
            raise VerifyException(f"empty's buffers ({BUFFERS_ATTR}) must be 1 or 2, got {attr}")


# --------------------------------------------------------------------------------------------------------------
# Elementwise


class UnaryOp(IRDLOperation):
    """Base of elementwise unary ops on register tiles and vectors: `%r = tile.exp2 %t : !tile.rt<16x64xf32>`."""

    T: ClassVar = VarConstraint("T", REGISTER)
    input = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input)"

    def __init__(self, input: SSAValue | Operation):
        super().__init__(operands=[input], result_types=[SSAValue.get(input).type])


UNARY_FUNCTIONS = ("exp", "exp2", "log", "log2", "abs", "relu", "neg", "sqrt", "rsqrt", "tanh", "copy")


def _unary(fn: str) -> type[UnaryOp]:
    cls = type(f"{fn.capitalize()}Op", (UnaryOp,), {"name": f"tile.{fn}", "__doc__": f"Elementwise {fn}."})
    return irdl_op_definition(cls)


UNARY_OPS: dict[str, type[UnaryOp]] = {fn: _unary(fn) for fn in UNARY_FUNCTIONS}


class BinaryOp(IRDLOperation):
    """Base of elementwise binary ops: tile ⊕ tile of one type, or tile ⊕ f32 scalar, or f32 scalar ⊕ tile.

    `%r = tile.add %a, %b : !tile.rt<16x64xf32>`, `%r = tile.mul %a, %s : !tile.rt<16x64xf32>, f32`
    """

    lhs = operand_def(REGISTER | SCALAR)
    rhs = operand_def(REGISTER | SCALAR)
    result = result_def(REGISTER)
    traits = traits_def(Pure())

    def __init__(self, lhs: SSAValue | Operation, rhs: SSAValue | Operation):
        lhs, rhs = SSAValue.get(lhs), SSAValue.get(rhs)
        tile = lhs.type if lhs.type != f32 else rhs.type
        super().__init__(operands=[lhs, rhs], result_types=[tile])

    @property
    def fn(self) -> str:
        return self.name.split(".")[1]

    def verify_(self) -> None:
        lt, rt = self.lhs.type, self.rhs.type
        if lt == f32 and rt == f32:
            raise VerifyException(f"{self.fn}: one operand must be a register tile or vector (use arith for scalars)")
        if lt != f32 and rt != f32 and lt != rt:
            raise VerifyException(f"{self.fn}: operands differ: {spec(lt)} and {spec(rt)}")
        tile = lt if lt != f32 else rt
        if self.result.type != tile:
            raise VerifyException(f"{self.fn}: result must be {spec(tile)}")

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.lhs)
        printer.print_string(", ")
        printer.print_operand(self.rhs)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.lhs.type)
        if self.rhs.type != self.lhs.type:
            printer.print_string(", ")
            printer.print_attribute(self.rhs.type)

    @classmethod
    def parse(cls, parser: Parser) -> BinaryOp:
        lhs = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        rhs = parser.parse_unresolved_operand()
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        lt = parser.parse_type()
        rt = parser.parse_type() if parser.parse_optional_punctuation(",") is not None else lt
        if lt == f32 and rt == f32:  # caught here: the result type constraint would fail first, less readably
            fn = cls.name.split(".")[1]
            parser.raise_error(f"{fn}: one operand must be a register tile or vector (use arith for scalars)")
        op = cls(parser.resolve_operand(lhs, lt), parser.resolve_operand(rhs, rt))
        op.attributes |= attrs
        return op


BINARY_FUNCTIONS = ("add", "sub", "mul", "div", "max", "min")


def _binary(fn: str) -> type[BinaryOp]:
    doc = f"Elementwise {fn} of two register tiles (or vectors), or of one and an f32 scalar."
    return irdl_op_definition(type(f"{fn.capitalize()}Op", (BinaryOp,), {"name": f"tile.{fn}", "__doc__": doc}))


BINARY_OPS: dict[str, type[BinaryOp]] = {fn: _binary(fn) for fn in BINARY_FUNCTIONS}


class BroadcastBinaryOp(IRDLOperation):
    """Base of `sub_row`-style ops: combine every row (or column) of a tile with one vector element.

    `%r = tile.sub_row %t, %v : !tile.rt<16x64xf32>, !tile.rv<16xf32>` subtracts v[i] from row i;
    `tile.add_col` adds v[j] to column j.
    """

    T: ClassVar = VarConstraint("T", base(RegTileType))
    tile = operand_def(T)
    vec = operand_def(RegVecType)
    result = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$tile `,` $vec attr-dict `:` type($tile) `,` type($vec)"

    def __init__(self, tile: SSAValue | Operation, vec: SSAValue | Operation):
        super().__init__(operands=[tile, vec], result_types=[SSAValue.get(tile).type])

    @property
    def fn(self) -> str:
        return self.name.split(".")[1].rsplit("_", 1)[0]

    @property
    def axis(self) -> str:
        return self.name.rsplit("_", 1)[1]

    def verify_(self) -> None:
        _verify_vector_fits(self.name, self.tile.type, self.vec.type, self.axis)


def _verify_vector_fits(op: str, tile: RegTileType, vec: RegVecType, axis: str) -> None:
    rows, cols = tile.shape
    want = rows if axis == "row" else cols
    what = "rows" if axis == "row" else "columns"
    if vec.length.data != want:
        raise VerifyException(
            f"{op.split('.')[-1]}: {spec(tile)} has {want} {what} but the vector is {spec(vec)}"
        )
    if vec.element_type != tile.element_type:
        raise VerifyException(f"{op.split('.')[-1]}: dtype mismatch: {spec(tile)} with {spec(vec)}")


def _broadcast_binary(fn: str, axis: str) -> type[BroadcastBinaryOp]:
    doc = f"`{fn}_{axis}`: {fn} the vector's i-th element to every element of {axis} i."
    return irdl_op_definition(
        type(
            f"{fn.capitalize()}{axis.capitalize()}Op",
            (BroadcastBinaryOp,),
            {"name": f"tile.{fn}_{axis}", "__doc__": doc},
        )
    )


BROADCAST_BINARY_OPS: dict[tuple[str, str], type[BroadcastBinaryOp]] = {
    (fn, axis): _broadcast_binary(fn, axis) for fn in BINARY_FUNCTIONS for axis in ("row", "col")
}


class BroadcastOp(IRDLOperation):
    """Base of `broadcast_row` / `broadcast_col`: a tile whose row i (column j) is filled with v[i] (v[j]).

    `%t = tile.broadcast_row %v : !tile.rv<16xf32> -> !tile.rt<16x64xf32>`
    """

    vec = operand_def(RegVecType)
    result = result_def(RegTileType)
    traits = traits_def(Pure())
    assembly_format = "$vec attr-dict `:` type($vec) `->` type($result)"

    def __init__(self, vec: SSAValue | Operation, result_type: Attribute):
        super().__init__(operands=[vec], result_types=[result_type])

    @property
    def axis(self) -> str:
        return self.name.rsplit("_", 1)[1]

    def verify_(self) -> None:
        _verify_vector_fits(self.name, self.result.type, self.vec.type, self.axis)


@irdl_op_definition
class BroadcastRowOp(BroadcastOp):
    """`broadcast_row`: row i of the result holds v[i] everywhere."""

    name = "tile.broadcast_row"


@irdl_op_definition
class BroadcastColOp(BroadcastOp):
    """`broadcast_col`: column j of the result holds v[j] everywhere."""

    name = "tile.broadcast_col"


# --------------------------------------------------------------------------------------------------------------
# Reductions


REDUCE_FUNCTIONS = ("max", "min", "sum", "prod")


class ReduceOp(IRDLOperation):
    """Base of row/column reductions of a register tile into a register vector, with an optional accumulator.

    `%m = tile.row_max %s : !tile.rt<16x64xf32> -> !tile.rv<16xf32>`;
    `%l = tile.row_sum %p, %l0 : !tile.rt<16x64xf32> -> !tile.rv<16xf32>` adds the row sums to %l0.
    """

    T: ClassVar = VarConstraint("T", base(RegVecType))
    input = operand_def(RegTileType)
    acc = opt_operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$input (`,` $acc^)? attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue | Operation, result_type: Attribute, acc: SSAValue | Operation | None = None):
        super().__init__(operands=[input, [acc] if acc is not None else []], result_types=[result_type])

    @property
    def fn(self) -> str:
        return self.name.split("_", 1)[1]

    @property
    def axis(self) -> str:
        return self.name.split(".")[1].split("_")[0]

    def verify_(self) -> None:
        _verify_vector_fits(self.name, self.input.type, self.result.type, self.axis)


def _reduce(fn: str, axis: str) -> type[ReduceOp]:
    doc = f"`{axis}_{fn}`: the {fn} of each {axis} of a tile (combined with the accumulator if given)."
    return irdl_op_definition(
        type(f"{axis.capitalize()}{fn.capitalize()}Op", (ReduceOp,), {"name": f"tile.{axis}_{fn}", "__doc__": doc})
    )


REDUCE_OPS: dict[tuple[str, str], type[ReduceOp]] = {
    (fn, axis): _reduce(fn, axis) for fn in REDUCE_FUNCTIONS for axis in ("row", "col")
}


PARTIAL = "tkc.partial"  # on a row_sum: each lane keeps its own part of the row's sum (sum-rows-after-loop)


@irdl_op_definition
class FinishRowSumOp(IRDLOperation):
    """`tile.finish_row_sum`: the row sums whose parts lanes kept apart (row_sums marked `tkc.partial`, scaled and
    added up per lane in a loop), added up across the lanes that share each row.

    `%l = tile.finish_row_sum %parts : !tile.rv<16xf32>`
    """

    name = "tile.finish_row_sum"
    T: ClassVar = VarConstraint("T", base(RegVecType))
    input = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input)"

    def __init__(self, input: SSAValue | Operation):
        super().__init__(operands=[input], result_types=[SSAValue.get(input).type])


class VectorReduceOp(IRDLOperation):
    """Base of reductions of a whole register vector to an f32 scalar: `%s = tile.vec_sum %v : !tile.rv<1024xf32>`."""

    input = operand_def(RegVecType)
    result = result_def(f32)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input)"

    def __init__(self, input: SSAValue | Operation):
        super().__init__(operands=[input], result_types=[f32])

    @property
    def fn(self) -> str:
        return self.name.split("_", 1)[1]


def _vec_reduce(fn: str) -> type[VectorReduceOp]:
    doc = f"`vec_{fn}`: the {fn} of all elements of a register vector, as an f32 scalar."
    return irdl_op_definition(type(f"Vec{fn.capitalize()}Op", (VectorReduceOp,), {"name": f"tile.vec_{fn}", "__doc__": doc}))


VECTOR_REDUCE_OPS: dict[str, type[VectorReduceOp]] = {fn: _vec_reduce(fn) for fn in REDUCE_FUNCTIONS}


# --------------------------------------------------------------------------------------------------------------
# Conversions, layout and masking


class _RetypeOp(IRDLOperation):
    """Base of the ops that give a register tile or vector another type: one operand, one result of the type asked
    for, `%r = tile.NAME %t : TYPE -> TYPE`."""

    input = operand_def(REGISTER)
    result = result_def(REGISTER)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue | Operation, result_type: Attribute):
        super().__init__(operands=[input], result_types=[result_type])


@irdl_op_definition
class ConvertOp(_RetypeOp):
    """`%r = tile.convert %t : !tile.rt<16x64xf32> -> !tile.rt<16x64xbf16>`: change the element type (round to nearest even)."""

    name = "tile.convert"

    def verify_(self) -> None:
        src, dst = self.input.type, self.result.type
        if type(src) is not type(dst) or src.shape != dst.shape or src.layout != dst.layout:  # type: ignore[attr-defined]
            raise VerifyException(
                f"convert changes only the dtype, not the kind, shape or layout: {spec(src)} cannot become {spec(dst)}"
            )
        if isinstance(src.element_type, FP8_TYPES) or isinstance(dst.element_type, FP8_TYPES):  # type: ignore[attr-defined]
            raise VerifyException(f"registers do not hold fp8 ({spec(src)} -> {spec(dst)}): store an f32 (or bf16) "
                                  "tile into an fp8 tensor, which converts (saturating), and load one into rt[f32, ...]")


@irdl_op_definition
class RelayoutOp(_RetypeOp):
    """`%r = tile.relayout %t : !tile.rt<16x16xbf16, row> -> !tile.rt<16x16xbf16, col>`: move elements between lanes
    so that the same tile is held in another fragment layout (TK's `swap_layout`). Inserted by layout assignment."""

    name = "tile.relayout"

    def verify_(self) -> None:
        src, dst = self.input.type, self.result.type
        if type(src) is not type(dst) or src.shape != dst.shape or src.element_type != dst.element_type:  # type: ignore[attr-defined]
            raise VerifyException(
                f"relayout changes only the layout, not the kind, shape or dtype: {spec(src)} cannot become {spec(dst)}"
            )


@irdl_op_definition
class TransposeOp(_RetypeOp):
    """`%r = tile.transpose %t : !tile.rt<16x32xbf16> -> !tile.rt<32x16xbf16>`."""

    name = "tile.transpose"
    input = operand_def(RegTileType)
    result = result_def(RegTileType)

    def verify_(self) -> None:
        src, dst = self.input.type, self.result.type
        if dst.shape != src.shape[::-1] or dst.element_type != src.element_type:
            want = f"rt[{element_name(src.element_type)}, {src.shape[1]}, {src.shape[0]}]"
            raise VerifyException(f"transpose of {spec(src)} is {want}, not {spec(dst)}")


class TriangleOp(IRDLOperation):
    """Base of `tril` / `triu`: keep one triangle of a register tile and set the rest to `fill`.

    `%r = tile.tril %t, %d fill -inf : !tile.rt<16x64xf32>` keeps (i, j) with j <= i + d (`triu`: j >= i + d).
    The diagonal offset %d is an i32, so a kernel can mask a block that sits off the main diagonal.
    """

    T: ClassVar = VarConstraint("T", base(RegTileType))
    input = operand_def(T)
    diagonal = operand_def(i32)
    fill = prop_def(FloatAttr)
    result = result_def(T)
    traits = traits_def(Pure())

    def __init__(self, input: SSAValue | Operation, diagonal: SSAValue | Operation, fill: float):
        super().__init__(
            operands=[input, diagonal], properties={"fill": _f64(fill)}, result_types=[SSAValue.get(input).type]
        )

    @property
    def fill_value(self) -> float:
        return self.fill.value.data

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.input)
        printer.print_string(", ")
        printer.print_operand(self.diagonal)
        printer.print_string(" fill ")
        _print_number(printer, self.fill_value)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.input.type)

    @classmethod
    def parse(cls, parser: Parser) -> TriangleOp:
        input = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        diagonal = parser.parse_unresolved_operand()
        parser.parse_keyword("fill")
        fill = _parse_number(parser)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        op = cls(parser.resolve_operand(input, parser.parse_type()), parser.resolve_operand(diagonal, i32), fill)
        op.attributes |= attrs
        return op


@irdl_op_definition
class TrilOp(TriangleOp):
    """`tril`: keep j <= i + diagonal (the lower triangle), fill the rest."""

    name = "tile.tril"


@irdl_op_definition
class TriuOp(TriangleOp):
    """`triu`: keep j >= i + diagonal (the upper triangle), fill the rest."""

    name = "tile.triu"


@irdl_op_definition
class KeepColsOp(TriangleOp):
    """`keep_cols`: keep the columns j < n (the operand), fill the rest: a block of keys past a sequence's end."""

    name = "tile.keep_cols"


@irdl_op_definition
class KeepRowsOp(TriangleOp):
    """`keep_rows`: keep the rows i < n (the operand), fill the rest: a tile of values whose rows past a cache's
    length may hold anything (an unwritten cache's NaN, which a probability of 0 does not cancel in P·V)."""

    name = "tile.keep_rows"


# --------------------------------------------------------------------------------------------------------------
# Matrix multiply-accumulate


class _AccumulateMethods:
    """What mma_* and wgmma_* share: D = op(A)·op(B) + C with C's type, named by the op."""

    def __init__(self, a: SSAValue | Operation, b: SSAValue | Operation, c: SSAValue | Operation):
        super().__init__(operands=[a, b, c], result_types=[SSAValue.get(c).type])  # type: ignore[call-arg]

    @property
    def fn(self) -> str:
        return self.name.split(".")[1]  # type: ignore[attr-defined]

    @property
    def transpose_a(self) -> bool:
        return self.fn.split("_", 1)[1].startswith("At")

    @property
    def transpose_b(self) -> bool:
        return self.fn.endswith("Bt")


class MmaOp(_AccumulateMethods, IRDLOperation):
    """Base of `mma_AB`, `mma_ABt`, `mma_AtB`, `mma_AtBt`: D = op(A)·op(B) + C on the tensor cores.

    `%d = tile.mma_AB %a, %b, %c : !tile.rt<16x64xbf16>, !tile.rt<64x32xbf16>, !tile.rt<16x32xf32>`
    A and B are bf16 or f16 (the same); C and D are f32. The result has C's type.
    """

    T: ClassVar = VarConstraint("T", base(RegTileType))
    a = operand_def(RegTileType)
    b = operand_def(RegTileType)
    c = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$a `,` $b `,` $c attr-dict `:` type($a) `,` type($b) `,` type($c)"

    def verify_(self) -> None:
        a, b, c = self.a.type, self.b.type, self.c.type
        fn = self.fn
        if a.element_type != b.element_type:
            raise VerifyException(f"{fn}: dtype mismatch: A is {spec(a)} but B is {spec(b)}")
        if not isinstance(a.element_type, BFloat16Type | Float16Type):
            raise VerifyException(f"{fn}: A and B must be bf16 or f16 tiles, got {spec(a)} (convert with .to(bf16))")
        if not isinstance(c.element_type, Float32Type):
            raise VerifyException(f"{fn}: the accumulator must be an f32 tile, got {spec(c)}")
        m, k = a.shape[::-1] if self.transpose_a else a.shape
        kb, n = b.shape[::-1] if self.transpose_b else b.shape
        a_form = "Aᵀ" if self.transpose_a else "A"
        b_form = "Bᵀ" if self.transpose_b else "B"
        if k != kb:
            raise VerifyException(
                f"{fn}: K mismatch: A is {spec(a)}, so K = {k}, but B is {spec(b)}, so K = {kb} "
                f"({fn} computes {a_form}·{b_form} + C with {a_form} M×K and {b_form} K×N)"
            )
        if c.shape != (m, n):
            raise VerifyException(
                f"{fn}: shape mismatch: {a_form}·{b_form} is {m}x{n} but the accumulator is {spec(c)}; "
                f"it must be rt[f32, {m}, {n}]"
            )


def _mma(fn: str, ta: bool, tb: bool) -> type[MmaOp]:
    cls = type(f"{fn.capitalize()}Op", (MmaOp,), {"name": f"tile.{fn}"})
    cls.__doc__ = f"`{fn}`: D = {'Aᵀ' if ta else 'A'}·{'Bᵀ' if tb else 'B'} + C."
    return irdl_op_definition(cls)


MMA_OPS: dict[str, type[MmaOp]] = {
    fn: _mma(fn, ta, tb)
    for fn, ta, tb in (("mma_AB", False, False), ("mma_ABt", False, True), ("mma_AtB", True, False), ("mma_AtBt", True, True))
}


class WgmmaOp(_AccumulateMethods, IRDLOperation):
    """Base of `wgmma_AB`, `wgmma_ABt`, `wgmma_AtB`, `wgmma_AtBt`: a warpgroup's D = op(A)·op(B) + C with B in
    shared memory (Hopper's `wgmma`, sm_90a). The 4 warps of a warpgroup compute it together; warp w of the
    warpgroup holds rows 16w..16w+15 of the 64-row product in its accumulator.

    `%d = tile.wgmma_AB %a, %b, %c : !tile.st<64x64xbf16>, !tile.st<64x256xbf16>, !tile.rt<16x256xf32>`
    A is a shared 64×K tile, or each warp's own 16 rows of it in registers (rt[bf16, 16, K]), or a shared K×64
    tile (`wgmma_At*`: its columns are the rows of the product); B is K×N (`*_AB`, `*_AtB`) or N×K (`*_ABt`,
    `*_AtBt`); K a multiple of 16, N of 16 up to 256.
    """

    T: ClassVar = VarConstraint("T", base(RegTileType))
    a = operand_def(base(SharedTileType) | base(RegTileType))
    b = operand_def(SharedTileType)
    c = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$a `,` $b `,` $c attr-dict `:` type($a) `,` type($b) `,` type($c)"

    ROWS: ClassVar[int] = 64  # of A: a warpgroup's rows

    def verify_(self) -> None:
        a, b, c = self.a.type, self.b.type, self.c.type
        fn = self.fn
        fp8 = isinstance(a.element_type, FP8_TYPES)
        if fp8:  # e4m3 and e5m2 mix; the hardware reads both K-major (Bᵀ given N×K), A from shared memory
            fn_hint = fn.removeprefix("wg")
            if not isinstance(b.element_type, FP8_TYPES):
                raise VerifyException(f"{fn_hint}: A is {spec(a)}, so B must be fp8 too, got {spec(b)}")
            if self.transpose_a or not self.transpose_b or not isinstance(a, SharedTileType):
                raise VerifyException(f"{fn_hint}: fp8 tensor cores read both operands K-major from shared memory: "
                                      f"use mma_ABt with A st[fp8, 64, K] and B given N×K (st[fp8, N, K]), got "
                                      f"{fn_hint} on {spec(a)} and {spec(b)}")
            if a.shape[1] % 32:
                raise VerifyException(f"{fn_hint}: fp8 operands take K in steps of 32, got {spec(a)}")
        elif a.element_type != b.element_type or not isinstance(a.element_type, BFloat16Type | Float16Type):
            raise VerifyException(f"{fn}: A and B must be bf16 or f16 tiles of one dtype, or both fp8, got {spec(a)} "
                                  f"and {spec(b)}")
        if not isinstance(c.element_type, Float32Type):
            raise VerifyException(f"{fn}: the accumulator must be an f32 tile, got {spec(c)}")
        m, k = a.shape[::-1] if self.transpose_a else a.shape
        kb, n = b.shape[::-1] if self.transpose_b else b.shape
        if isinstance(a, RegTileType) and self.transpose_a:
            raise VerifyException(f"{fn}: a transposed A must be a shared tile (st[{spec(a.element_type)}, K, 64]), "
                                  f"got {spec(a)}")
        if isinstance(a, SharedTileType) and self.transpose_a and (m != self.ROWS or k % 16):
            raise VerifyException(f"{fn}: A must be st[{spec(a.element_type)}, K, 64] (K a multiple of 16; its 64 "
                                  f"columns the warpgroup's rows), got {spec(a)}")
        if isinstance(a, RegTileType) and (m != 16 or k % 16):
            raise VerifyException(f"{fn}: A in registers is each warp's 16 rows, rt[{spec(a.element_type)}, 16, K] "
                                  f"(K a multiple of 16), got {spec(a)}")
        if isinstance(a, SharedTileType) and not self.transpose_a and (m != self.ROWS or k % 16):
            raise VerifyException(f"{fn}: A must be st[{spec(a.element_type)}, 64, K] (a warpgroup's 64 rows, K a "
                                  f"multiple of 16), got {spec(a)}")
        if k != kb:
            raise VerifyException(f"{fn}: K mismatch: A is {spec(a)} but B is {spec(b)}")
        if n % 16 or not 16 <= n <= 256:
            raise VerifyException(f"{fn}: N must be a multiple of 16 up to 256, got {spec(b)}")
        if c.shape != (16, n):
            raise VerifyException(f"{fn}: each warp accumulates its 16 rows of the warpgroup's 64×{n}: the "
                                  f"accumulator must be rt[f32, 16, {n}], got {spec(c)}")


def _wgmma(fn: str, ta: bool, tb: bool) -> type[WgmmaOp]:
    cls = type(f"{fn.capitalize()}Op", (WgmmaOp,), {"name": f"tile.{fn}"})
    cls.__doc__ = f"`{fn}`: a warpgroup's D = {'Aᵀ' if ta else 'A'}·{'Bᵀ' if tb else 'B'} + C from shared tiles."
    return irdl_op_definition(cls)


WGMMA_OPS: dict[str, type[WgmmaOp]] = {
    fn: _wgmma(fn, ta, tb) for fn, ta, tb in (("wgmma_AB", False, False), ("wgmma_ABt", False, True),
                                              ("wgmma_AtB", True, False), ("wgmma_AtBt", True, True))}


# --------------------------------------------------------------------------------------------------------------
# Memory


class _ReadsGlobalMemory(MemoryEffect):
    """A load reads memory only when its source is a global tensor; shared and register tiles are values. A load
    from global memory into a shared tile also allocates that tile's buffer (two such loads are two buffers)."""

    @classmethod
    def get_effects(cls, op: Operation) -> frozenset[EffectInstance]:
        if isinstance(op.operands[0].type, GlobalType):
            if isinstance(op.results[0].type, SharedTileType | SharedVecType):
                return _READS_INTO_NEW_BUFFER
            return _READS
        return frozenset()


_READS = frozenset((EffectInstance(MemoryEffectKind.READ),))
_READS_INTO_NEW_BUFFER = _READS | _ALLOCATES


LOAD_PAIRS = {
    (GlobalType, RegTileType),
    (GlobalType, SharedTileType),
    (GlobalType, RegVecType),
    (GlobalType, SharedVecType),
    (SharedTileType, RegTileType),
    (SharedTileType, SharedTileType),  # a view of whole rows (e.g. a warpgroup's 64 rows), no data moves
    (SharedVecType, RegVecType),
}
STORE_PAIRS = {(RegTileType, GlobalType), (SharedTileType, GlobalType), (RegVecType, GlobalType), (SharedVecType, GlobalType)}
INSERT_PAIRS = {(RegTileType, SharedTileType), (RegVecType, SharedVecType)}


def _index_count(container: Attribute) -> int:
    return container.rank if isinstance(container, GlobalType) else len(container.shape)  # type: ignore[attr-defined]


def _verify_transfer(what: str, src: Attribute, dst: Attribute, indexed: Attribute, n_indices: int, pairs: set) -> None:
    if (type(src), type(dst)) not in pairs:
        raise VerifyException(f"{what} cannot move data from {spec(src)} to {spec(dst)}")
    want = _index_count(indexed)
    if n_indices != want:
        where = "from" if indexed is src else "into"
        indices = "1 index" if want == 1 else f"{want} indices"
        raise VerifyException(f"{what} {where} {spec(indexed)} takes {indices}, got {n_indices}")
    tile = dst if indexed is src else src
    if isinstance(indexed, GlobalType) and indexed.rank < len(tile.shape):  # type: ignore[attr-defined]
        raise VerifyException(f"{what}: {spec(tile)} needs a global tensor of rank {len(tile.shape)} or more")  # type: ignore[attr-defined]
    if isinstance(src, GlobalType | SharedTileType | SharedVecType) and isinstance(dst, GlobalType | SharedTileType | SharedVecType):
        if src.element_type != dst.element_type:  # type: ignore[attr-defined]
            raise VerifyException(
                f"{what}: a copy between global and shared memory cannot convert {spec(src)} to {spec(dst)}: "
                "keep the dtype and convert in registers"
            )
    if isinstance(indexed, SharedTileType | SharedVecType):
        for outer, inner in zip(indexed.shape, tile.shape):  # type: ignore[attr-defined]
            if outer % inner:
                raise VerifyException(f"{what}: {spec(tile)} does not tile {spec(indexed)} evenly")


ROWS_ATTR = "tile.index_in_rows"  # on a global load/store of a 2-D tile: its row index counts rows, not tiles
REPEAT_COLS = "tile.repeat_cols"  # on a global → f32 register tile load: k, each column read gives k adjacent ones
CONFLICTS_ATTR = "tile.conflicts"  # on a shared-memory store / load: the bank conflicts its author expects (no warning)


def index_units(op: Operation, tile_shape: Sequence[int]) -> list[int]:
    """What one step of each tile index of a global load/store (or the TMA copy made of it) moves, in elements:
    a tile's extent, or one row where the row index counts rows (`rows(r)` in the DSL, ROWS_ATTR)."""
    units = list(source_shape(op, tile_shape))
    if ROWS_ATTR in op.attributes:  # a 2-D tile's rows, or a register vector's (its only index)
        units[0] = 1
    return units


def repeat_cols(op: Operation) -> int:
    """How many adjacent columns of a global load's register tile each column it reads fills (REPEAT_COLS; 1)."""
    attr = op.attributes.get(REPEAT_COLS)
    return attr.value.data if isinstance(attr, IntegerAttr) else 1


def source_shape(op: Operation, tile_shape: Sequence[int]) -> tuple[int, ...]:
    """The shape of what a global load reads: its tile's, or 1/k of the columns where each fills k (REPEAT_COLS)."""
    k = repeat_cols(op)
    return (*tile_shape[:-1], tile_shape[-1] // k)


def keep_index_units(source: Operation, made: Operation) -> Operation:
    """`made` (a copy that a pass made of the global load/store `source`) counts its indices as `source` does."""
    if ROWS_ATTR in source.attributes:
        made.attributes[ROWS_ATTR] = source.attributes[ROWS_ATTR]
    return made


def _verify_rows_index(op: Operation, indexed: Attribute, tile: Attribute) -> None:
    if ROWS_ATTR in op.attributes and not (isinstance(indexed, GlobalType) and (len(tile.shape) == 2  # type: ignore[attr-defined]
                                                                                or isinstance(tile, RegVecType))):
        raise VerifyException(f"{op.name.removeprefix('tile.')}: a row index that counts rows (rows(r), {ROWS_ATTR}) "
                              "needs a 2-D tile or a register vector in global memory")


MULTICAST = "tkc.multicast"  # a global→shared load every block of a cluster makes alike: TMA multicast shares it;
# its value [size, stride]: only the `size` blocks of ranks r0 + i·stride make it alike (a group of the cluster)
CLUSTER_ATTR = "tkc.cluster"  # on a kernel: its blocks run in clusters of this many, consecutive in x


def multicast_group(op: Operation, cluster: int) -> tuple[int, int]:
    """(size, stride) of the blocks sharing the multicast load `op` in a cluster of `cluster` blocks: the whole
    cluster (cluster, 1), or the group its MULTICAST value names."""
    attr = op.attributes[MULTICAST]
    if isinstance(attr, ArrayAttr):
        size, stride = (a.value.data for a in attr.data)  # type: ignore[attr-defined]
        return size, stride
    return cluster, 1


def cluster_size(fn: Operation) -> int:
    """The blocks in a cluster of the kernel `fn` (1: no clusters)."""
    attr = fn.attributes.get(CLUSTER_ATTR)
    return attr.value.data if isinstance(attr, IntegerAttr) else 1  # type: ignore[no-any-return]


@irdl_op_definition
class LoadOp(IRDLOperation):
    """`%t = tile.load %src[%i, ...] : SRC -> DST`: gl→rt/st/rv/sv, st→rt (a sub-tile), st→st (a view of whole
    rows: no data moves), sv→rv.

    Indices count in units of the loaded tile along its dimensions (the last one or two of the source).
    Global→register loads convert the dtype; copies between global and shared memory do not. A global→register
    or global→shared tile load may gather its rows: `rows_at %p : !tile.gl<?xi64>` after the indices reads row
    %p[r + i] into row i (r the row index, which then counts rows). `rows_end %e` (a register tile's load whose row
    index counts rows, or a load into a shared tile): rows from %e on (tensor rows, or places in %p) read zeros.
    """

    name = "tile.load"
    source = operand_def(base(GlobalType) | base(SharedTileType) | base(SharedVecType))
    indices = var_operand_def(i32)
    row_index = opt_operand_def(GlobalType)
    rows_end = opt_operand_def(i32)
    result = result_def(ANY_TILE)
    traits = traits_def(_ReadsGlobalMemory())
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    assembly_format = ("$source `[` $indices `]` (`rows_at` $row_index^ `:` type($row_index))? "
                       "(`rows_end` $rows_end^)? attr-dict `:` type($source) `->` type($result)")

    def __init__(self, source: SSAValue | Operation, indices: Sequence[SSAValue | Operation], result_type: Attribute,
                 row_index: SSAValue | Operation | None = None, rows_end: SSAValue | Operation | None = None):
        super().__init__(operands=[source, indices, [row_index] if row_index is not None else [],
                                   [rows_end] if rows_end is not None else []], result_types=[result_type])

    def verify_(self) -> None:
        _verify_transfer("load", self.source.type, self.result.type, self.source.type, len(self.indices), LOAD_PAIRS)
        _verify_rows_index(self, self.source.type, self.result.type)
        src, dst = self.source.type, self.result.type
        verify_row_numbers(self, "load", src, dst)
        verify_rows_end(self, "load", src, dst)
        if REPEAT_COLS in self.attributes:
            k = repeat_cols(self)
            if not (isinstance(src, GlobalType) and isinstance(dst, RegTileType)
                    and isinstance(dst.element_type, Float32Type)):
                raise VerifyException(f"load: only a global → f32 register tile load repeats columns, not "
                                      f"{spec(src)} → {spec(dst)}")
            if k != 2 or dst.shape[1] % (16 * k):
                raise VerifyException(f"load: {REPEAT_COLS} = {k} must be 2, into a tile of a multiple of 32 columns "
                                      f"(16 read), not {spec(dst)}")
        if MULTICAST in self.attributes and not (isinstance(src, GlobalType) and isinstance(dst, SharedTileType)):
            raise VerifyException("load: only a global → shared tile load may be multicast")
        group = self.attributes.get(MULTICAST)
        if isinstance(group, ArrayAttr) and not (
                len(group.data) == 2 and all(isinstance(a, IntegerAttr) and a.value.data > 0 for a in group.data)):
            raise VerifyException(f"load: {MULTICAST} is a unit attribute or [size, stride], two positive integers")
        if isinstance(src, SharedTileType) and isinstance(dst, SharedTileType):
            whole_rows = dst.shape[1] == src.shape[1]
            whole_columns = dst.shape[0] == src.shape[0] and src.shape[1] % dst.shape[1] == 0
            if not (whole_rows or whole_columns) or dst.element_type != src.element_type:
                raise VerifyException(f"load: a view of {spec(src)} takes whole rows or whole columns of the same "
                                      f"dtype: st[{spec(src.element_type)}, R, {src.shape[1]}] or "
                                      f"st[{spec(src.element_type)}, {src.shape[0]}, C], got {spec(dst)}")


def verify_rows_end(op: Operation, what: str, src: Attribute, dst: Attribute) -> None:
    """A load's / store's / copy's rows_end (rows(r, end), rows_at(I, r, end)): only where the row index counts rows,
    between global memory and a register tile, or into a shared tile (not multicast)."""
    if op.rows_end is None:  # type: ignore[attr-defined]
        return
    tile = dst if isinstance(src, GlobalType) else src
    cut_short = RegTileType | RegVecType | SharedTileType if isinstance(src, GlobalType) else RegTileType | RegVecType
    if not (ROWS_ATTR in op.attributes and isinstance(tile, cut_short) and MULTICAST not in op.attributes):
        raise VerifyException(f"{what}: an end to the rows (rows_end) goes with a row index that counts rows "
                              f"({ROWS_ATTR}) of a register tile's load or store or a load into a shared tile (not "
                              f"multicast), not {spec(src)} → {spec(dst)}")


def verify_row_numbers(op: Operation, what: str, src: Attribute, dst: Attribute) -> None:
    """A load's / store's / copy's rows_at operand: only between a global tensor and a tile whose row index counts
    rows (a register tile, or a shared tile that a load or copy fills), by a gl[i32, 1] or gl[i64, 1]."""
    row_index = op.row_index  # type: ignore[attr-defined]
    if row_index is None:
        return
    index, (tensor, tile) = row_index.type, (dst, src) if isinstance(dst, GlobalType) else (src, dst)
    gathers_into = RegTileType | SharedTileType if not isinstance(dst, GlobalType) else RegTileType
    if not (isinstance(tensor, GlobalType) and isinstance(tile, gathers_into) and ROWS_ATTR in op.attributes):
        raise VerifyException(f"{what}: only a {what} between global memory and a register tile (or a load into a "
                              f"shared tile) whose row index counts rows ({ROWS_ATTR}) goes by rows_at's row numbers, "
                              f"not {spec(src)} → {spec(dst)}")
    if MULTICAST in op.attributes:
        raise VerifyException(f"{what}: a multicast load copies one box of the tensor; rows_at's rows are not one")
    if not (isinstance(index, GlobalType) and index.rank == 1 and index.element_type in INDEX_TYPES):
        raise VerifyException(f"{what}: the rows_at index must be a gl[i32, 1] or gl[i64, 1], got {spec(index)}")


class _GlobalWriteOp(IRDLOperation):
    """Base of the ops writing a tile into global memory at tile indices: `tile.OP %t, %dst[%i, ...] : T -> G`
    (`rows_at %p : G'` after the indices: the rows go to the rows %p names, from the row index on; `rows_end %e`:
    rows from %e on, tensor rows or places in %p, are not written)."""

    value = operand_def(ANY_TILE)
    dest = operand_def(GlobalType)
    indices = var_operand_def(i32)
    row_index = opt_operand_def(GlobalType)
    rows_end = opt_operand_def(i32)
    traits = traits_def(MemoryWriteEffect())
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    assembly_format = ("$value `,` $dest `[` $indices `]` (`rows_at` $row_index^ `:` type($row_index))? "
                       "(`rows_end` $rows_end^)? attr-dict `:` type($value) `->` type($dest)")

    def __init__(self, value: SSAValue | Operation, dest: SSAValue | Operation, indices: Sequence[SSAValue | Operation],
                 row_index: SSAValue | Operation | None = None, rows_end: SSAValue | Operation | None = None):
        super().__init__(operands=[value, dest, indices, [row_index] if row_index is not None else [],
                                   [rows_end] if rows_end is not None else []])

    def verify_(self) -> None:
        what = self.name.removeprefix("tile.")
        _verify_transfer(what, self.value.type, self.dest.type, self.dest.type, len(self.indices), STORE_PAIRS)
        _verify_rows_index(self, self.dest.type, self.value.type)
        verify_row_numbers(self, what, self.value.type, self.dest.type)
        verify_rows_end(self, what, self.value.type, self.dest.type)


@irdl_op_definition
class StoreOp(_GlobalWriteOp):
    """`tile.store %t, %dst[%i, ...] : SRC -> !tile.gl<...>`: rt/st/rv/sv → global memory (past the end: dropped).

    Register→global stores convert the dtype; shared→global copies do not.
    """

    name = "tile.store"


@irdl_op_definition
class AtomicAddOp(_GlobalWriteOp):
    """`tile.atomic_add %t, %dst[%i, ...] : !tile.rt<16x64xf32> -> !tile.gl<?x?xf32>`: adds a register tile into
    global memory element by element (`red.global.add`), so that several blocks may sum into the same elements in
    any order (past the end: dropped). f32 register tiles only."""

    name = "tile.atomic_add"

    def verify_(self) -> None:
        super().verify_()
        if not (isinstance(self.value.type, RegTileType) and self.value.type.element_type == f32
                and self.dest.type.element_type == f32):
            raise VerifyException(f"atomic_add adds an f32 register tile into f32, got {spec(self.value.type)} "
                                  f"into {spec(self.dest.type)}")


@irdl_op_definition
class InsertOp(IRDLOperation):
    """`%s1 = tile.insert %t, %s0[%i, %j] : !tile.rt<16x64xbf16> -> !tile.st<64x64xbf16>`: the DSL's store into a
    shared tile. Returns %s0 with the sub-tile at (%i, %j) replaced by %t (converted to the shared dtype)."""

    name = "tile.insert"
    T: ClassVar = VarConstraint("T", base(SharedTileType) | base(SharedVecType))
    value = operand_def(REGISTER)
    dest = operand_def(T)
    indices = var_operand_def(i32)
    result = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$value `,` $dest `[` $indices `]` attr-dict `:` type($value) `->` type($dest)"

    def __init__(self, value: SSAValue | Operation, dest: SSAValue | Operation, indices: Sequence[SSAValue | Operation]):
        super().__init__(operands=[value, dest, indices], result_types=[SSAValue.get(dest).type])

    def verify_(self) -> None:
        _verify_transfer("store", self.value.type, self.dest.type, self.dest.type, len(self.indices), INSERT_PAIRS)


@irdl_op_definition
class BarrierOp(IRDLOperation):
    """`tile.barrier`: every warp of the block waits here (`bar.sync 0`)."""

    name = "tile.barrier"
    traits = traits_def(MemoryWriteEffect())
    assembly_format = "attr-dict"

    def __init__(self):
        super().__init__()


@irdl_op_definition
class ClusterSyncOp(IRDLOperation):
    """`tile.cluster_sync`: every warp of every block of the cluster waits here; what a block wrote into its shared
    tiles before it, the cluster's blocks read (`tile.cluster_load`) after it (`barrier.cluster.arrive.release` +
    `barrier.cluster.wait.acquire`). Every warp must reach it: not inside a run-time `if`."""

    name = "tile.cluster_sync"
    traits = traits_def(MemoryWriteEffect())
    assembly_format = "attr-dict"

    def __init__(self):
        super().__init__()

    def verify_(self) -> None:
        _not_in_runtime_if(self, "cluster_sync", "cluster")


def _not_in_runtime_if(op: Operation, what: str, scope: str = "block") -> None:
    """Collective ops (every warp of the block or cluster meets there) refuse a place inside an scf.if."""
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, func.FuncOp):
        if isinstance(parent, scf.IfOp):
            raise VerifyException(f"{what}: every warp of the {scope} must reach it, so it cannot be inside a "
                                  "run-time `if`")
        parent = parent.parent_op()


class _ReadsItsTensor(MemoryEffect):
    """tile.read reads global memory (CSE must not merge two reads across a store between them)."""

    @classmethod
    def get_effects(cls, op: Operation) -> frozenset[EffectInstance]:
        return _READS


@irdl_op_definition
class ReadOp(IRDLOperation):
    """`%e = tile.read %G[%i, ...] : !tile.gl<?xi32>`: one element of an int32 global tensor as a run-time int (a
    group's offset, an expert's number), read by every thread that needs it; 0 where the index lies outside the
    tensor, as tile loads read zeros past a tensor's end."""

    name = "tile.read"
    source = operand_def(GlobalType)
    indices = var_operand_def(i32)
    result = result_def(i32)
    traits = traits_def(_ReadsItsTensor())
    assembly_format = "$source `[` $indices `]` attr-dict `:` type($source)"

    def __init__(self, source: SSAValue | Operation, indices: Sequence[SSAValue | Operation]):
        super().__init__(operands=[source, indices], result_types=[i32])

    def verify_(self) -> None:
        gtype = self.source.type
        if gtype.element_type != I32:  # type: ignore[attr-defined]
            raise VerifyException(f"read: one element of an int32 tensor (gl[i32, N]) is a run-time int, not one of "
                                  f"{spec(gtype)}")
        if len(self.indices) != gtype.rank:  # type: ignore[attr-defined]
            raise VerifyException(f"read from {spec(gtype)} takes {gtype.rank} indices, got {len(self.indices)}")  # type: ignore[attr-defined]


@irdl_op_definition
class ArriveLastOp(IRDLOperation):
    """`%last = tile.arrive_last %counter[%index], %arrivals : !tile.gl<?xi32>`: this block's arrival counted at
    counter[index] (one thread: `atom.acq_rel.gpu.global.add.u32`, after a fence and a block barrier); true in every
    thread of the block that arrives last of %arrivals (its count then set back to 0 for the next launch, the result
    spread over the block by `bar.red.or.pred`), false in the others. The blocks' global stores before it are
    visible to the last block after it. Every warp must reach it: not inside a run-time `if`."""

    name = "tile.arrive_last"
    counter = operand_def(GlobalType)
    index = operand_def(i32)
    arrivals = operand_def(i32)
    result = result_def(i1)
    traits = traits_def(MemoryWriteEffect())
    assembly_format = "$counter `[` $index `]` `,` $arrivals attr-dict `:` type($counter)"

    def __init__(self, counter: SSAValue | Operation, index: SSAValue | Operation, arrivals: SSAValue | Operation):
        super().__init__(operands=[counter, index, arrivals], result_types=[i1])

    def verify_(self) -> None:
        gtype = self.counter.type
        if gtype.element_type != I32 or gtype.rank != 1:  # type: ignore[attr-defined]
            raise VerifyException(f"arrive_last counts in an int32 tensor of rank 1 (gl[i32, 1]), got "
                                  f"{gtype.spec()}")  # type: ignore[attr-defined]
        _not_in_runtime_if(self, "arrive_last")


def synced_since_written(op: Operation, tile: SSAValue) -> bool:
    """Is there a `tile.cluster_sync` between the op that wrote `tile` (its defining op) and `op`, on the way
    back from `op` through its block and the blocks around it? (True where `op` is in a region not yet attached
    to its function: the frontend checks as it builds, and the function's verification checks again.)"""
    node: Operation | None = op
    while not isinstance(node, func.FuncOp):
        if node is None:
            return True
        prev = node.prev_op
        while prev is not None:
            if isinstance(prev, ClusterSyncOp):
                return True
            if prev is tile.owner:
                return False
            prev = prev.prev_op
        node = node.parent_op()
    return False


@irdl_op_definition
class ClusterLoadOp(IRDLOperation):
    """`%t = tile.cluster_load %s[%i, %j] from %rank : !tile.st<64x32xf32> -> !tile.rt<16x32xf32>`: a register
    sub-tile of block %rank's copy of the shared tile %s (distributed shared memory: `mapa.shared::cluster` +
    `ld.shared::cluster`). Every block of the cluster runs the same program, so each has its own %s; the blocks
    must have passed a `tile.cluster_sync` since they wrote it, and peers keep their shared memory until the whole
    cluster exits (kernels of clusters end with a cluster barrier)."""

    name = "tile.cluster_load"
    source = operand_def(SharedTileType)
    indices = var_operand_def(i32)
    rank = operand_def(i32)
    result = result_def(RegTileType)
    traits = traits_def(MemoryReadEffect())
    assembly_format = "$source `[` $indices `]` `from` $rank attr-dict `:` type($source) `->` type($result)"

    def __init__(self, source: SSAValue | Operation, indices: Sequence[SSAValue | Operation],
                 rank: SSAValue | Operation, result_type: Attribute):
        super().__init__(operands=[source, indices, rank], result_types=[result_type])

    def verify_(self) -> None:
        _verify_transfer("cluster load", self.source.type, self.result.type, self.source.type, len(self.indices),
                         {(SharedTileType, RegTileType)})
        if not synced_since_written(self, self.source):
            raise VerifyException("cluster load: the cluster's blocks read each other's shared tile only after a "
                                  "cluster_sync() that follows their writes into it")


@irdl_op_definition
class TurnWaitOp(IRDLOperation):
    """`tile.turn_wait`: this warpgroup waits for its turn at the tensor cores (two warpgroups in ping-pong, placed
    by `pingpong-warpgroups`): `bar.sync 3 + (warpgroup & 1), 256`. No effect on values."""

    name = "tile.turn_wait"
    traits = traits_def(MemoryWriteEffect())
    assembly_format = "attr-dict"

    def __init__(self):
        super().__init__()


@irdl_op_definition
class TurnPassOp(IRDLOperation):
    """`tile.turn_pass`: this warpgroup hands the tensor cores to the other one (`bar.arrive 4 - (warpgroup & 1),
    256`) and goes on without waiting."""

    name = "tile.turn_pass"
    traits = traits_def(MemoryWriteEffect())
    assembly_format = "attr-dict"

    def __init__(self):
        super().__init__()


@irdl_op_definition
class WgmmaWaitOp(GroupWaitOp):
    """`tile.wgmma_wait 1`: wait until at most N of this warpgroup's most recent wgmmas are still running
    (`wgmma.wait_group N`). Placed by `defer-wgmma` after wgmmas it marked `tkc.deferred` (those do not wait for
    themselves); a deferred wgmma's result is read only after a wait that covers it. No effect on values."""

    name = "tile.wgmma_wait"


@irdl_op_definition
class RotatePairsOp(IRDLOperation):
    """`%r = tile.rotate_pairs %t : !tile.rt<16x64xf32>`: each pair of adjacent columns (2i, 2i+1) of an f32 register
    tile turned a quarter, (a, b) → (−b, a): the pair as a complex number a + ib times i. Rotary embedding's
    interleaved form is x·cos + rotate_pairs(x)·sin. A pair sits in one lane in the row and linear layouts."""

    name = "tile.rotate_pairs"
    T: ClassVar = VarConstraint("T", base(RegTileType))
    input = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input)"

    def __init__(self, input: SSAValue | Operation):
        super().__init__(operands=[input], result_types=[SSAValue.get(input).type])

    def verify_(self) -> None:
        if not isinstance(self.input.type.element_type, Float32Type):
            raise VerifyException(f"rotate_pairs takes an f32 tile, got {spec(self.input.type)}: convert it first")
        if self.input.type.layout == Layout.COL:
            raise VerifyException("rotate_pairs needs each pair of columns in one lane: the row or linear layout, "
                                  "not col")


TILE_OPS: list[type[IRDLOperation]] = [
    BlockIdxOp,
    NumBlocksOp,
    WarpIdOp,
    WarpgroupIdOp,
    ClusterRankOp,
    DimOp,
    FillOp,
    EmptyOp,
    *UNARY_OPS.values(),
    *BINARY_OPS.values(),
    *BROADCAST_BINARY_OPS.values(),
    BroadcastRowOp,
    BroadcastColOp,
    *REDUCE_OPS.values(),
    *VECTOR_REDUCE_OPS.values(),
    FinishRowSumOp,
    ConvertOp,
    RelayoutOp,
    TransposeOp,
    RotatePairsOp,
    TrilOp,
    KeepColsOp,
    KeepRowsOp,
    TriuOp,
    *MMA_OPS.values(),
    *WGMMA_OPS.values(),
    LoadOp,
    StoreOp,
    AtomicAddOp,
    InsertOp,
    BarrierOp,
    ReadOp,
    ArriveLastOp,
    ClusterSyncOp,
    ClusterLoadOp,
    TurnWaitOp,
    TurnPassOp,
    WgmmaWaitOp,
]
