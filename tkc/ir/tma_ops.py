"""TMA loads into rings guarded by mbarriers (sm_90a): what `insert-tma-pipeline` turns `load(gl → st)` into.

A `!tile.stage_barriers<S, A>` holds, per stage of a ring, a *full* barrier (its phase completes when the
stage's bytes have landed) and an *empty* barrier (its phase completes when A threads have released the stage).
Every op names a *step* `%k` of the pipelined loop, never a stage: step k uses stage k mod S in its
(k div S)-th round, which fixes the parity each barrier wait uses. A step's life:

    tile.stage_acquire %bars[%k]            // the producer waits until step k - S has released the stage
    tile.stage_expect %bars[%k], 24576      // ... announces the bytes step k will bring
    tile.tma_load %A[%i, %j], %ring_a, %bars[%k]   // ... and starts the boxes (counted on the full barrier)
    tile.stage_copy %X[%r, %j] rows_at %I, %ring_x, %bars[%k]   // everyone: cp.async chunks counted on the barrier
    tile.stage_wait %bars[%k]               // everyone: step k's bytes have landed
    %a = tile.ring_read %ring_a[%s]         //   (%s = k mod S)
    tile.stage_release %bars[%k]            // every thread is done reading step k's stage

The producer's ops are issued by one thread; the others by every thread of the block. A ring may mix TMA loads
with `tile.stage_copy` (rows TMA cannot fetch: gathered by row numbers, cut at an end): every thread starts its
cp.async chunks and has the barrier count its arrival when they land, so every thread acquires the stage first.
"""

from __future__ import annotations

import re

from collections.abc import Sequence

from xdsl.dialects.builtin import IntAttr, IntegerAttr, IntegerType, i32
from xdsl.ir import Attribute, Operation, SSAValue, TypeAttribute
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    ParametrizedAttribute,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.traits import MemoryReadEffect, MemoryWriteEffect
from xdsl.utils.exceptions import VerifyException

from tkc.ir.async_ops import RingType

# A kernel's tensor-map parameters are named for what the launcher builds them from (lower_tma.py names them, the
# launch and the simulator read the names; here so that a launch needs none of the lowering's modules)
_TMAP_PARAM = re.compile(r"^(?P<tensor>\w+?)_tmap(?P<stack>n?)_(?P<rows>\d+)x(?P<cols>\d+)_sw(?P<swizzle>\d+)$")


def tensor_map_param(name: str) -> tuple[str, int, int, int, bool] | None:
    """(tensor argument, box rows, box columns, swizzle bytes, stacked) of a tensor-map parameter's name, else
    None. `{T}_tmap_..`: T as a matrix of rows; `{T}_tmapn_..`: a map of all of T's dimensions whose boxes are
    one matrix (the last two dimensions) deep, so that they stop at each matrix's end."""
    found = _TMAP_PARAM.match(name)
    if found is None:
        return None
    return (found["tensor"], int(found["rows"]), int(found["cols"]), int(found["swizzle"]), found["stack"] == "n")
from tkc.ir.ops import MULTICAST
from tkc.ir.types import GlobalType, SharedTileType


@irdl_attr_definition
class StageBarriersType(ParametrizedAttribute, TypeAttribute):
    """`!tile.stage_barriers<S, A>`: full and empty mbarriers for the S stages of a ring; A threads release a stage.
    `<S, A, C>`: the ring of a cluster of C blocks whose multicast loads fill every block's stage: a stage is
    free only when the A threads of each of the C blocks have released it."""

    name = "tile.stage_barriers"
    stages: IntAttr
    arrivals: IntAttr
    cluster: IntAttr

    def __init__(self, stages: int, arrivals: int, cluster: int = 1):
        super().__init__(IntAttr(stages), IntAttr(arrivals), IntAttr(cluster))

    def verify(self) -> None:
        if self.stages.data < 1 or self.arrivals.data < 1 or self.cluster.data < 1:
            raise VerifyException("stage barriers need at least one stage, one arriving thread and one block")

    @property
    def nbytes(self) -> int:
        return 2 * 8 * self.stages.data  # an mbarrier is 8 bytes

    def print_parameters(self, printer: Printer) -> None:
        cluster = f", {self.cluster.data}" if self.cluster.data != 1 else ""
        printer.print_string(f"<{self.stages.data}, {self.arrivals.data}{cluster}>")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[IntAttr, IntAttr, IntAttr]:
        with parser.in_angle_brackets():
            stages = parser.parse_integer(allow_boolean=False, allow_negative=False)
            parser.parse_punctuation(",")
            arrivals = parser.parse_integer(allow_boolean=False, allow_negative=False)
            cluster = 1
            if parser.parse_optional_punctuation(","):
                cluster = parser.parse_integer(allow_boolean=False, allow_negative=False)
        return IntAttr(stages), IntAttr(arrivals), IntAttr(cluster)


@irdl_op_definition
class StageBarriersOp(IRDLOperation):
    """`%bars = tile.stage_barriers : !tile.stage_barriers<S, A>`: initialized barriers (a block-wide sync)."""

    name = "tile.stage_barriers"
    result = result_def(StageBarriersType)
    traits = traits_def(MemoryWriteEffect())
    assembly_format = "attr-dict `:` type($result)"

    def __init__(self, type_: StageBarriersType):
        super().__init__(result_types=[type_])


class _StepOp(IRDLOperation):
    """An op on the barriers of one step: `%bars[%k]`."""

    bars = operand_def(StageBarriersType)
    step = operand_def(i32)

    @property
    def stages(self) -> int:
        return self.bars.type.stages.data  # type: ignore[attr-defined]


@irdl_op_definition
class StageAcquireOp(_StepOp):
    """`tile.stage_acquire %bars[%k]`: (the producer) wait until the stage of step k is free: released by step
    k - S (at once for the first S steps)."""

    name = "tile.stage_acquire"
    traits = traits_def(MemoryWriteEffect())
    assembly_format = "$bars `[` $step `]` attr-dict `:` type($bars)"

    def __init__(self, bars: SSAValue | Operation, step: SSAValue | Operation):
        super().__init__(operands=[bars, step])


@irdl_op_definition
class StageExpectOp(_StepOp):
    """`tile.stage_expect %bars[%k], N`: (the producer) step k's stage will receive N bytes; the full barrier's
    phase completes when they have all landed."""

    name = "tile.stage_expect"
    nbytes = prop_def(IntegerAttr[IntegerType])
    traits = traits_def(MemoryWriteEffect())
    assembly_format = "$bars `[` $step `]` `,` $nbytes attr-dict `:` type($bars)"

    def __init__(self, bars: SSAValue | Operation, step: SSAValue | Operation, nbytes: int):
        super().__init__(operands=[bars, step], properties={"nbytes": IntegerAttr(nbytes, 64)})

    def verify_(self) -> None:
        if self.nbytes.value.data <= 0:
            raise VerifyException("stage_expect needs a positive byte count")


@irdl_op_definition
class TmaLoadOp(IRDLOperation):
    """`tile.tma_load %G[idx], %ring, %bars[%k]`: (the producer) start copying the tile at G[idx] into the ring's
    stage for step k by TMA (boxes past G's end read zeros); its bytes count on step k's full barrier. Marked
    `tkc.multicast` (barriers of a cluster of C blocks): each block copies 1/C of the tile's rows into the stage
    of every block of the cluster, whose full barriers count them."""

    name = "tile.tma_load"
    source = operand_def(GlobalType)
    indices = var_operand_def(i32)
    ring = operand_def(RingType)
    bars = operand_def(StageBarriersType)
    step = operand_def(i32)
    traits = traits_def(MemoryWriteEffect())
    assembly_format = ("$source `[` $indices `]` `,` $ring `,` $bars `[` $step `]` attr-dict `:` type($source) `->` "
                       "type($ring) `,` type($bars)")

    def __init__(self, source: SSAValue | Operation, indices: Sequence[SSAValue | Operation],
                 ring: SSAValue | Operation, bars: SSAValue | Operation, step: SSAValue | Operation):
        super().__init__(operands=[source, indices, ring, bars, step])

    @property
    def tile(self) -> SharedTileType:
        return self.ring.type.buffer  # type: ignore[attr-defined, no-any-return]

    @property
    def nbytes(self) -> int:
        """Bytes the copy counts on the barrier: whole boxes, also where they reach past the tensor's end."""
        return self.tile.nbytes

    def verify_(self) -> None:
        gtype, rtype, btype = self.source.type, self.ring.type, self.bars.type
        if len(self.indices) != gtype.rank:  # type: ignore[attr-defined]
            raise VerifyException(f"tma_load from {gtype.spec()} takes {gtype.rank} indices, got {len(self.indices)}")  # type: ignore[attr-defined]
        if not isinstance(rtype.buffer, SharedTileType):  # type: ignore[attr-defined]
            raise VerifyException("tma_load fills shared tiles")
        if gtype.element_type != rtype.buffer.element_type:  # type: ignore[attr-defined]
            raise VerifyException("tma_load cannot convert between dtypes")
        if MULTICAST in self.attributes and btype.cluster.data == 1:  # type: ignore[attr-defined]
            raise VerifyException("a multicast tma_load needs the stage barriers of a cluster")
        if rtype.stages.data != btype.stages.data:  # type: ignore[attr-defined]
            raise VerifyException(f"tma_load: the ring has {rtype.stages.data} stages but its barriers "  # type: ignore[attr-defined]
                                  f"{btype.stages.data}")  # type: ignore[attr-defined]


@irdl_op_definition
class StageCopyOp(IRDLOperation):
    """`tile.stage_copy %G[idx] (rows_at %p : type)? (rows_end %e)?, %ring, %bars[%k]`: (every thread) start its
    cp.async chunks of the tile at G[idx] into the ring's stage for step k (rows as tile.copy_async's) and have step
    k's full barrier count its arrival once they have landed (`cp.async.mbarrier.arrive.noinc`): the loads of a TMA
    ring that TMA cannot make. Its bytes are not announced (stage_expect counts TMA's)."""

    name = "tile.stage_copy"
    source = operand_def(GlobalType)
    indices = var_operand_def(i32)
    row_index = opt_operand_def(GlobalType)
    rows_end = opt_operand_def(i32)
    ring = operand_def(RingType)
    bars = operand_def(StageBarriersType)
    step = operand_def(i32)
    traits = traits_def(MemoryWriteEffect())
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    assembly_format = ("$source `[` $indices `]` (`rows_at` $row_index^ `:` type($row_index))? "
                       "(`rows_end` $rows_end^)? `,` $ring `,` $bars `[` $step `]` attr-dict `:` type($source) `->` "
                       "type($ring) `,` type($bars)")

    def __init__(self, source: SSAValue | Operation, indices: Sequence[SSAValue | Operation],
                 ring: SSAValue | Operation, bars: SSAValue | Operation, step: SSAValue | Operation,
                 row_index: SSAValue | Operation | None = None, rows_end: SSAValue | Operation | None = None):
        super().__init__(operands=[source, indices, [row_index] if row_index is not None else [],
                                   [rows_end] if rows_end is not None else [], ring, bars, step])

    @property
    def tile(self) -> SharedTileType:
        return self.ring.type.buffer  # type: ignore[attr-defined, no-any-return]

    def verify_(self) -> None:
        from tkc.ir.ops import verify_row_numbers, verify_rows_end

        gtype, rtype, btype = self.source.type, self.ring.type, self.bars.type
        if len(self.indices) != gtype.rank:  # type: ignore[attr-defined]
            raise VerifyException(f"stage_copy from {gtype.spec()} takes {gtype.rank} indices, got "  # type: ignore[attr-defined]
                                  f"{len(self.indices)}")
        if gtype.element_type != rtype.buffer.element_type:  # type: ignore[attr-defined]
            raise VerifyException("stage_copy cannot convert between dtypes")
        if btype.cluster.data != 1:  # type: ignore[attr-defined]
            raise VerifyException("stage_copy fills its own block's stage: not a cluster's ring")
        if rtype.stages.data != btype.stages.data:  # type: ignore[attr-defined]
            raise VerifyException(f"stage_copy: the ring has {rtype.stages.data} stages but its barriers "  # type: ignore[attr-defined]
                                  f"{btype.stages.data}")  # type: ignore[attr-defined]
        verify_row_numbers(self, "stage_copy", gtype, rtype.buffer)  # type: ignore[attr-defined]
        verify_rows_end(self, "stage_copy", gtype, rtype.buffer)  # type: ignore[attr-defined]


def copies_into(bars: SSAValue) -> bool:
    """Whether some stage_copy fills these barriers' ring (every thread then acquires a stage, and arrives)."""
    return any(isinstance(use.operation, StageCopyOp) for use in bars.uses)


@irdl_op_definition
class StageWaitOp(_StepOp):
    """`tile.stage_wait %bars[%k]`: wait until step k's bytes have landed in its stage."""

    name = "tile.stage_wait"
    traits = traits_def(MemoryReadEffect(), MemoryWriteEffect())
    assembly_format = "$bars `[` $step `]` attr-dict `:` type($bars)"

    def __init__(self, bars: SSAValue | Operation, step: SSAValue | Operation):
        super().__init__(operands=[bars, step])


@irdl_op_definition
class StageReleaseOp(_StepOp):
    """`tile.stage_release %bars[%k]`: this thread is done reading step k's stage (it may be refilled once all
    arrivals are in)."""

    name = "tile.stage_release"
    traits = traits_def(MemoryWriteEffect())
    assembly_format = "$bars `[` $step `]` attr-dict `:` type($bars)"

    def __init__(self, bars: SSAValue | Operation, step: SSAValue | Operation):
        super().__init__(operands=[bars, step])


TMA_OPS: list[type[IRDLOperation]] = [StageBarriersOp, StageAcquireOp, StageExpectOp, TmaLoadOp, StageCopyOp,
                                      StageWaitOp, StageReleaseOp]
TMA_TYPES: list[type[Attribute]] = [StageBarriersType]
