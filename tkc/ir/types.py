"""Types of the `tile` dialect: the five ThunderKittens tile and vector kinds.

    !tile.gl<?x?x?x?xbf16>          a global tensor (sizes known at run time)
    !tile.st<64x128xbf16>           a shared tile, block-scoped; `, swizzle 128` once assigned
    !tile.sv<64xf32>                a shared vector, block-scoped
    !tile.rt<16x64xf32>             a register tile, warp-scoped; `, row` / `, col` / `, linear` once assigned
    !tile.rv<16xf32>                a register vector, warp-scoped; `, align` / `, ortho` / `, naive` once assigned

Register tiles use the fragments of `mma.m16n8k16`: in the `row` layout each lane holds element pairs that are
adjacent along a row (the A operand and the accumulator), in the `col` layout pairs adjacent along a column (the B
operand of `mma_AB`); in the `linear` layout each lane holds 8 consecutive columns of a row (16 bytes of a 16-bit
tile: one global access), for tiles that meet only elementwise ops and global memory. Register vectors are the
rows or columns of such a tile: `align` holds them replicated the way the tile's rows are spread over a warp,
`ortho` the way its columns are, `naive` one element per lane.
Layouts and swizzles are left unassigned by the frontend and filled in by passes.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    ArrayAttr,
    DYNAMIC_INDEX,
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float8E4M3FNType,
    Float8E5M2Type,
    IntAttr,
    IntegerType,
    NoneAttr,
    StringAttr,
    bf16,
    f16,
    f32,
)
from xdsl.ir import Attribute, TypeAttribute
from xdsl.irdl import ParametrizedAttribute, irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

DYNAMIC = DYNAMIC_INDEX  # `?` in a shape
FP8_TYPES = (Float8E4M3FNType, Float8E5M2Type)  # in global and shared memory: wgmma operands
ELEMENT_TYPES = (BFloat16Type, Float16Type, Float32Type, *FP8_TYPES)
TILE_BASE = 16  # rows and columns of every tile (and lengths of vectors) are multiples of this

ELEMENT_BYTES = {BFloat16Type: 2, Float16Type: 2, Float32Type: 4, Float8E4M3FNType: 1, Float8E5M2Type: 1}
ELEMENT_NAMES = {BFloat16Type: "bf16", Float16Type: "f16", Float32Type: "f32", Float8E4M3FNType: "fp8e4m3",
                 Float8E5M2Type: "fp8e5m2"}  # as the DSL spells them
# Integers live in global tensors only, no tiles: i32 the counters of tile.arrive_last, i32 / i64 the row indices
# a load gathers rows by (rows_at in the DSL)
I32 = IntegerType(32)
I64 = IntegerType(64)
INDEX_TYPES = (I32, I64)
SWIZZLE_BYTES = (0, 32, 64, 128)


class Layout(StrEnum):
    """Register fragment layouts (see the module docstring)."""

    ROW = "row"
    COL = "col"
    LINEAR = "linear"
    ALIGN = "align"
    ORTHO = "ortho"
    NAIVE = "naive"


TILE_LAYOUTS = (Layout.ROW, Layout.COL, Layout.LINEAR)
VECTOR_LAYOUTS = (Layout.ALIGN, Layout.ORTHO, Layout.NAIVE)


def element_name(t: Attribute) -> str:
    if isinstance(t, IntegerType):
        return f"i{t.width.data}"
    return ELEMENT_NAMES.get(type(t), str(t))


def element_bytes(t: Attribute) -> int:
    if isinstance(t, IntegerType):
        return t.width.data // 8
    return ELEMENT_BYTES[type(t)]


def _verify_element(kind: str, t: Attribute) -> None:
    # fp8 register tiles exist only inside a store into (a load from) an fp8 tensor, which converts through them;
    # ops on register values refuse them (tile.convert, the DSL's types)
    if not isinstance(t, ELEMENT_TYPES):
        raise VerifyException(f"{kind} element type must be bf16, f16, f32, fp8e4m3 or fp8e5m2, got {t}")


def _verify_dims(kind: str, dims: Sequence[int]) -> None:
    for d in dims:
        if d <= 0 or d % TILE_BASE:
            shape = "x".join(map(str, dims))
            raise VerifyException(f"{kind} dimensions must be positive multiples of {TILE_BASE}, got {shape}")


def _parse_element(parser: AttrParser) -> Attribute:
    return parser.expect(parser.parse_optional_type, "expected an element type (bf16, f16, f32, f8E4M3FN, f8E5M2)")


def _parse_static_shape(parser: AttrParser, rank: int, kind: str) -> tuple[list[int], Attribute]:
    pos = parser.pos
    dims, elem = parser.parse_ranked_shape()
    if len(dims) != rank:
        parser.raise_error(f"{kind} expects {rank} dimension(s), got {len(dims)}", pos, parser.pos)
    if any(d == DYNAMIC for d in dims):
        parser.raise_error(f"{kind} dimensions must be static", pos, parser.pos)
    return dims, elem


def _checked(
    cls: type[ParametrizedAttribute], parser: AttrParser, span: tuple[int, int], params: tuple[Attribute, ...]
) -> tuple[Attribute, ...]:
    """Verify parsed parameters at once, so that a bad type in IR text is a parse error that points at the type
    (attributes verify on construction, and the parser would let that VerifyException escape without a position)."""
    try:
        cls.new(params)
    except VerifyException as e:
        parser.raise_error(str(e), *span)
    return params


class _Shaped:
    """Shared helpers of the tile and vector types."""

    @property
    def shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * element_bytes(self.element_type)  # type: ignore[attr-defined]

    def spec(self) -> str:
        """The DSL spelling of this type, e.g. `rt[bf16, 16, 64]` (used in error messages)."""
        dims = ", ".join(map(str, self.shape))
        return f"{self.name.split('.')[-1]}[{element_name(self.element_type)}, {dims}]"  # type: ignore[attr-defined]


def _layout_attr(layout: Layout | str | None) -> Attribute:
    return NoneAttr() if layout is None else StringAttr(Layout(layout).value)


class _RegisterType(_Shaped):
    # `layout_attr` is declared by each subclass: IRDL orders parameters by declaration

    @property
    def layout(self) -> Layout | None:
        return Layout(self.layout_attr.data) if isinstance(self.layout_attr, StringAttr) else None

    def _print_layout(self, printer: Printer) -> None:
        if self.layout is not None:
            printer.print_string(f", {self.layout.value}")

    @staticmethod
    def _parse_layout(parser: AttrParser) -> Attribute:
        if parser.parse_optional_punctuation(",") is None:
            return NoneAttr()
        return StringAttr(parser.parse_str_enum(Layout).value)


@irdl_attr_definition
class RegTileType(_RegisterType, ParametrizedAttribute, TypeAttribute):
    """`!tile.rt<RxCxT[, layout]>`: a register tile held by one warp."""

    name = "tile.rt"
    rows: IntAttr
    cols: IntAttr
    element_type: Attribute
    layout_attr: Attribute

    def __init__(self, element_type: Attribute, rows: int, cols: int, layout: Layout | str | None = None):
        super().__init__(IntAttr(rows), IntAttr(cols), element_type, _layout_attr(layout))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows.data, self.cols.data)

    def with_layout(self, layout: Layout | str | None) -> RegTileType:
        return RegTileType(self.element_type, *self.shape, layout)

    def with_element(self, element_type: Attribute) -> RegTileType:
        return RegTileType(element_type, *self.shape, self.layout)

    def verify(self) -> None:
        _verify_element("rt", self.element_type)
        _verify_dims("rt", self.shape)
        if self.layout is not None and self.layout not in TILE_LAYOUTS:
            raise VerifyException(f"rt layout must be row, col or linear, got {self.layout.value}")
        if self.layout == Layout.LINEAR and self.cols.data % 32:
            raise VerifyException(f"a linear-layout rt has a multiple of 32 columns, got {self.cols.data}")

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_dimension_list(self.shape)
            printer.print_string("x")
            printer.print_attribute(self.element_type)
            self._print_layout(printer)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[Attribute, ...]:
        pos = parser.pos
        with parser.in_angle_brackets():
            (rows, cols), elem = _parse_static_shape(parser, 2, "rt")
            layout = cls._parse_layout(parser)
            end = parser.pos + 1  # just past the closing `>`
        return _checked(cls, parser, (pos, end), (IntAttr(rows), IntAttr(cols), elem, layout))


@irdl_attr_definition
class RegVecType(_RegisterType, ParametrizedAttribute, TypeAttribute):
    """`!tile.rv<NxT[, layout]>`: a register vector held by one warp."""

    name = "tile.rv"
    length: IntAttr
    element_type: Attribute
    layout_attr: Attribute

    def __init__(self, element_type: Attribute, length: int, layout: Layout | str | None = None):
        super().__init__(IntAttr(length), element_type, _layout_attr(layout))

    @property
    def shape(self) -> tuple[int]:
        return (self.length.data,)

    def with_layout(self, layout: Layout | str | None) -> RegVecType:
        return RegVecType(self.element_type, self.length.data, layout)

    def with_element(self, element_type: Attribute) -> RegVecType:
        return RegVecType(element_type, self.length.data, self.layout)

    def verify(self) -> None:
        _verify_element("rv", self.element_type)
        _verify_dims("rv", self.shape)
        if self.layout is not None and self.layout not in VECTOR_LAYOUTS:
            raise VerifyException(f"rv layout must be align, ortho or naive, got {self.layout.value}")

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_int(self.length.data)
            printer.print_string("x")
            printer.print_attribute(self.element_type)
            self._print_layout(printer)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[Attribute, ...]:
        pos = parser.pos
        with parser.in_angle_brackets():
            (length,), elem = _parse_static_shape(parser, 1, "rv")
            layout = cls._parse_layout(parser)
            end = parser.pos + 1  # just past the closing `>`
        return _checked(cls, parser, (pos, end), (IntAttr(length), elem, layout))


@irdl_attr_definition
class SharedTileType(_Shaped, ParametrizedAttribute, TypeAttribute):
    """`!tile.st<RxCxT[, swizzle B]>`: a shared-memory tile owned by the block; B ∈ {0, 32, 64, 128} bytes."""

    name = "tile.st"
    rows: IntAttr
    cols: IntAttr
    element_type: Attribute
    swizzle_attr: Attribute

    def __init__(self, element_type: Attribute, rows: int, cols: int, swizzle: int | None = None):
        super().__init__(
            IntAttr(rows), IntAttr(cols), element_type, NoneAttr() if swizzle is None else IntAttr(swizzle)
        )

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows.data, self.cols.data)

    @property
    def swizzle(self) -> int | None:
        return self.swizzle_attr.data if isinstance(self.swizzle_attr, IntAttr) else None

    def with_swizzle(self, swizzle: int | None) -> SharedTileType:
        return SharedTileType(self.element_type, *self.shape, swizzle)

    def verify(self) -> None:
        _verify_element("st", self.element_type)
        _verify_dims("st", self.shape)
        if self.swizzle is not None and self.swizzle not in SWIZZLE_BYTES:
            raise VerifyException(f"st swizzle must be one of {SWIZZLE_BYTES} bytes, got {self.swizzle}")

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_dimension_list(self.shape)
            printer.print_string("x")
            printer.print_attribute(self.element_type)
            if self.swizzle is not None:
                printer.print_string(f", swizzle {self.swizzle}")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[Attribute, ...]:
        pos = parser.pos
        with parser.in_angle_brackets():
            (rows, cols), elem = _parse_static_shape(parser, 2, "st")
            swizzle: Attribute = NoneAttr()
            if parser.parse_optional_punctuation(",") is not None:
                parser.parse_keyword("swizzle")
                swizzle = IntAttr(parser.parse_integer(allow_negative=False, allow_boolean=False))
            end = parser.pos + 1  # just past the closing `>`
        return _checked(cls, parser, (pos, end), (IntAttr(rows), IntAttr(cols), elem, swizzle))


@irdl_attr_definition
class SharedVecType(_Shaped, ParametrizedAttribute, TypeAttribute):
    """`!tile.sv<NxT>`: a shared-memory vector owned by the block."""

    name = "tile.sv"
    length: IntAttr
    element_type: Attribute

    def __init__(self, element_type: Attribute, length: int):
        super().__init__(IntAttr(length), element_type)

    @property
    def shape(self) -> tuple[int]:
        return (self.length.data,)

    def verify(self) -> None:
        _verify_element("sv", self.element_type)
        _verify_dims("sv", self.shape)

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_int(self.length.data)
            printer.print_string("x")
            printer.print_attribute(self.element_type)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[Attribute, ...]:
        pos = parser.pos
        with parser.in_angle_brackets():
            (length,), elem = _parse_static_shape(parser, 1, "sv")
            end = parser.pos + 1  # just past the closing `>`
        return _checked(cls, parser, (pos, end), (IntAttr(length), elem))


@irdl_attr_definition
class GlobalType(ParametrizedAttribute, TypeAttribute):
    """`!tile.gl<?x?xT>`: a global tensor of fixed rank; `?` sizes are known only at run time."""

    name = "tile.gl"
    dims: ArrayAttr[IntAttr]
    element_type: Attribute

    def __init__(self, element_type: Attribute, dims: Sequence[int] | int):
        if isinstance(dims, int):
            dims = [DYNAMIC] * dims
        super().__init__(ArrayAttr([IntAttr(d) for d in dims]), element_type)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d.data for d in self.dims.data)

    @property
    def rank(self) -> int:
        return len(self.dims.data)

    def spec(self) -> str:
        return f"gl[{element_name(self.element_type)}, {self.rank}]"

    def verify(self) -> None:
        if self.element_type not in INDEX_TYPES and not isinstance(self.element_type, ELEMENT_TYPES):
            raise VerifyException(f"gl element type must be bf16, f16, f32, fp8e4m3, fp8e5m2, i32 or i64, got "
                                  f"{self.element_type}")
        if self.rank < 1:
            raise VerifyException("gl must have rank 1 or more")
        if any(d < 0 and d != DYNAMIC for d in self.shape):
            raise VerifyException("gl dimensions must be non-negative or dynamic")

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_dimension_list(self.shape)
            printer.print_string("x")
            printer.print_attribute(self.element_type)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[Attribute, ...]:
        pos = parser.pos
        with parser.in_angle_brackets():
            dims, elem = parser.parse_ranked_shape()
            end = parser.pos + 1  # just past the closing `>`
        return _checked(cls, parser, (pos, end), (ArrayAttr([IntAttr(d) for d in dims]), elem))


RegisterType = RegTileType | RegVecType
SharedType = SharedTileType | SharedVecType
TileType = RegTileType | SharedTileType
VectorType = RegVecType | SharedVecType

__all__ = [
    "DYNAMIC",
    "GlobalType",
    "Layout",
    "RegTileType",
    "RegVecType",
    "SharedTileType",
    "SharedVecType",
    "bf16",
    "element_bytes",
    "element_name",
    "f16",
    "f32",
]
