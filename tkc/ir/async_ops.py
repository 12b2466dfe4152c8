"""Asynchronous copies into rings of shared buffers: what the pipelining passes turn `load(gl → st)` into.

A ring holds `stages` shared tiles (or vectors). `tile.copy_async` starts copying a tile of a global tensor
into one stage; the copy belongs to the group that the next `tile.commit_group` closes, and its data lands only
when a `tile.wait_group N` leaves at most N newer groups pending. `tile.ring_read` reads a stage's current
contents. All of them are collective over the block, like every shared-memory op.

    %ring = tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16>>
    tile.copy_async %K[%b, %h, %j, %c0], %ring[%s] : !tile.gl<?x?x?x?xbf16> -> !tile.ring<3, !tile.st<64x64xbf16>>
    tile.commit_group
    tile.wait_group 1
    %k_s = tile.ring_read %ring[%s] : !tile.ring<3, !tile.st<64x64xbf16>> -> !tile.st<64x64xbf16>
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import IntAttr, IntegerAttr, IntegerType, i32
from xdsl.ir import Attribute, Operation, SSAValue, TypeAttribute
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    ParametrizedAttribute,
    VarConstraint,
    base,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import MemoryReadEffect, MemoryWriteEffect
from xdsl.utils.exceptions import VerifyException

from tkc.ir.types import GlobalType, SharedTileType, SharedVecType


@irdl_attr_definition
class RingType(ParametrizedAttribute, TypeAttribute):
    """`!tile.ring<S, !tile.st<...>>`: S shared buffers of one type, used round-robin by a pipelined loop."""

    name = "tile.ring"
    stages: IntAttr
    buffer: Attribute

    def __init__(self, stages: int, buffer: Attribute):
        super().__init__(IntAttr(stages), buffer)

    def verify(self) -> None:
        if self.stages.data < 1:
            raise VerifyException("a ring needs at least one stage")
        if not isinstance(self.buffer, SharedTileType | SharedVecType):
            raise VerifyException(f"a ring holds shared tiles or vectors, not {self.buffer}")

    @property
    def nbytes(self) -> int:
        return self.stages.data * self.buffer.nbytes  # type: ignore[attr-defined]

    def with_buffer(self, buffer: Attribute) -> RingType:
        return RingType(self.stages.data, buffer)

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_int(self.stages.data)
            printer.print_string(", ")
            printer.print_attribute(self.buffer)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[IntAttr, Attribute]:
        with parser.in_angle_brackets():
            stages = parser.parse_integer(allow_boolean=False, allow_negative=False)
            parser.parse_punctuation(",")
            buffer = parser.parse_type()
        return IntAttr(stages), buffer


@irdl_op_definition
class RingAllocOp(IRDLOperation):
    """`%r = tile.ring_alloc : !tile.ring<...>`: the ring's buffers (contents undefined)."""

    name = "tile.ring_alloc"
    result = result_def(RingType)
    traits = traits_def(MemoryWriteEffect())
    assembly_format = "attr-dict `:` type($result)"

    def __init__(self, ring: RingType):
        super().__init__(result_types=[ring])


@irdl_op_definition
class CopyAsyncOp(IRDLOperation):
    """`tile.copy_async %G[idx], %ring[%stage]`: start copying the tile at G[idx] into one stage of the ring
    (`rows_at %p : !tile.gl<?xi32>` after the indices: the tile's row i from row %p[r + i] of G, r the row index;
    `rows_end %e`: rows from %e on, of G or of %p, zeros)."""

    name = "tile.copy_async"
    source = operand_def(GlobalType)
    indices = var_operand_def(i32)
    ring = operand_def(RingType)
    stage = operand_def(i32)
    row_index = opt_operand_def(GlobalType)
    rows_end = opt_operand_def(i32)
    traits = traits_def(MemoryWriteEffect())
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    assembly_format = ("$source `[` $indices `]` (`rows_at` $row_index^ `:` type($row_index))? "
                       "(`rows_end` $rows_end^)? `,` $ring `[` $stage `]` attr-dict `:` type($source) `->` type($ring)")

    def __init__(self, source: SSAValue | Operation, indices: Sequence[SSAValue | Operation], ring: SSAValue | Operation,
                 stage: SSAValue | Operation, row_index: SSAValue | Operation | None = None,
                 rows_end: SSAValue | Operation | None = None):
        super().__init__(operands=[source, indices, ring, stage, [row_index] if row_index is not None else [],
                                   [rows_end] if rows_end is not None else []])

    def verify_(self) -> None:
        gtype, rtype = self.source.type, self.ring.type
        if len(self.indices) != gtype.rank:  # type: ignore[attr-defined]
            raise VerifyException(f"copy_async from {gtype.spec()} takes {gtype.rank} indices, got {len(self.indices)}")  # type: ignore[attr-defined]
        if gtype.element_type != rtype.buffer.element_type:  # type: ignore[attr-defined]
            raise VerifyException("copy_async cannot convert between dtypes")
        from tkc.ir.ops import verify_row_numbers, verify_rows_end
        verify_row_numbers(self, "copy_async", self.source.type, rtype.buffer)  # type: ignore[attr-defined]
        verify_rows_end(self, "copy_async", self.source.type, rtype.buffer)  # type: ignore[attr-defined]


@irdl_op_definition
class CommitGroupOp(IRDLOperation):
    """`tile.commit_group`: close the group of copies started since the last commit."""

    name = "tile.commit_group"
    traits = traits_def(MemoryWriteEffect())
    assembly_format = "attr-dict"


class GroupWaitOp(IRDLOperation):
    """Base of the waits for groups of asynchronous work (`tile.wait_group N`, `tile.wgmma_wait N`): at most N of
    the most recent groups may still be running."""

    pending = prop_def(IntegerAttr[IntegerType])
    traits = traits_def(MemoryWriteEffect())

    def __init__(self, pending: int):
        super().__init__(properties={"pending": IntegerAttr(pending, 64)})

    def verify_(self) -> None:
        if self.pending.value.data < 0:
            raise VerifyException(f"{self.name.removeprefix('tile.')} needs a non-negative count")

    def print(self, printer: Printer) -> None:
        printer.print_string(f" {self.pending.value.data}")
        printer.print_op_attributes(self.attributes)

    @classmethod
    def parse(cls, parser: Parser) -> GroupWaitOp:
        op = cls(parser.parse_integer(allow_boolean=False, allow_negative=False))
        op.attributes |= parser.parse_optional_attr_dict()
        return op


@irdl_op_definition
class WaitGroupOp(GroupWaitOp):
    """`tile.wait_group N`: wait until at most N committed groups are still in flight; older groups have landed."""

    name = "tile.wait_group"


@irdl_op_definition
class RingReadOp(IRDLOperation):
    """`%s = tile.ring_read %ring[%stage]`: the current contents of one stage, as a shared tile."""

    name = "tile.ring_read"
    T: ClassVar = VarConstraint("T", base(SharedTileType) | base(SharedVecType))
    ring = operand_def(RingType)
    stage = operand_def(i32)
    result = result_def(T)
    traits = traits_def(MemoryReadEffect())
    assembly_format = "$ring `[` $stage `]` attr-dict `:` type($ring) `->` type($result)"

    def __init__(self, ring: SSAValue | Operation, stage: SSAValue | Operation):
        super().__init__(operands=[ring, stage], result_types=[SSAValue.get(ring).type.buffer])  # type: ignore[attr-defined]

    def verify_(self) -> None:
        if self.result.type != self.ring.type.buffer:  # type: ignore[attr-defined]
            raise VerifyException("ring_read returns the ring's buffer type")


ASYNC_OPS: list[type[IRDLOperation]] = [RingAllocOp, CopyAsyncOp, CommitGroupOp, WaitGroupOp, RingReadOp]
ASYNC_TYPES: list[type[Attribute]] = [RingType]
