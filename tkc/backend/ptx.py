"""The `ptx` dialect: PTX at the level of instructions, or of one instruction family applied over a fragment.

Values are bundles of virtual registers of one class, `!ptx.regs<b32, 16>` (16 registers `%r..`). An op names,
for every instruction it stands for, which register of which bundle goes in each operand slot, so that a 16×64
tile's exp2 is one op that prints 32 `ex2.approx.ftz.f32` lines. Instruction text is generated from the op's
opcode and operand tables; nothing is hand-written PTX. Control flow is flat: `ptx.label` / `ptx.bra` in one
block; a loop-carried value is a bundle declared with `ptx.regs` and written with `into`.

    %t  = ptx.op "fma.rn.f32" (%s, %c, %m) ...  : !ptx.regs<b32, 32>     32 instructions
    %d  = ptx.mma "m16n8k16.row.col.f32.bf16.bf16.f32" (%a, %b, %acc) ... 8 mma.sync
    ptx.bar_sync 0
"""

from __future__ import annotations

from typing import ClassVar

from collections.abc import Sequence

import numpy as np
from xdsl.dialects.builtin import (
    ArrayAttr,
    BoolAttr,
    BytesAttr,
    DenseArrayBase,
    IntAttr,
    StringAttr,
    i64,
)
from xdsl.ir import Attribute, Block, Dialect, Operation, Region, SSAValue, TypeAttribute
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    ParametrizedAttribute,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    opt_result_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.traits import IsolatedFromAbove, MemoryWriteEffect, NoTerminator
from xdsl.utils.exceptions import VerifyException

REGISTER_CLASSES = ("pred", "b16", "b32", "b64")


@irdl_attr_definition
class RegsType(ParametrizedAttribute, TypeAttribute):
    """`!ptx.regs<b32, 16>`: a bundle of 16 virtual registers of class .b32."""

    name = "ptx.regs"
    cls: StringAttr
    count: IntAttr

    def __init__(self, cls: str, count: int):
        super().__init__(StringAttr(cls), IntAttr(count))

    def verify(self) -> None:
        if self.cls.data not in REGISTER_CLASSES:
            raise VerifyException(f"register class must be one of {REGISTER_CLASSES}, got {self.cls.data}")
        if self.count.data < 1:
            raise VerifyException("a register bundle holds at least one register")

    @property
    def reg_class(self) -> str:
        return self.cls.data

    @property
    def n(self) -> int:
        return self.count.data

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.cls.data}, {self.count.data}>")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[StringAttr, IntAttr]:
        with parser.in_angle_brackets():
            name = parser.parse_identifier()
            parser.parse_punctuation(",")
            count = parser.parse_integer(allow_boolean=False, allow_negative=False)
        return StringAttr(name), IntAttr(count)


def regs(cls: str, count: int) -> RegsType:
    return RegsType(cls, count)


def _ints(values: Sequence[int] | np.ndarray) -> DenseArrayBase:
    """An i64 dense array, built from bytes (DenseArrayBase.from_list is slow for long tables)."""
    return DenseArrayBase(i64, BytesAttr(np.asarray(values, dtype=np.int64).reshape(-1).tobytes()))


def _array(attr: DenseArrayBase, cols: int) -> np.ndarray:
    values = np.frombuffer(attr.data.data, dtype=np.int64)
    return values.reshape(-1, cols) if cols else values


def count_of(value: SSAValue) -> int:
    return value.type.n  # type: ignore[attr-defined]


class _TableOp(IRDLOperation):
    """Ops whose instructions are rows of an int table, cached as numpy."""

    def table(self, name: str, cols: int) -> np.ndarray:
        cache = self.__dict__.setdefault("_tables", {})
        if name not in cache:
            cache[name] = _array(self.properties[name], cols)  # type: ignore[arg-type]
        return cache[name]


# --------------------------------------------------------------------------------------------------------------
# Kernel structure


@irdl_op_definition
class KernelOp(IRDLOperation):
    """`ptx.kernel @name(params) {maxntid = N} { flat list of ops }`: one `.visible .entry`; with `cluster` N,
    launched in clusters of N blocks along x (`.reqnctapercluster N, 1, 1`)."""

    name = "ptx.kernel"
    sym_name = prop_def(StringAttr)
    params = prop_def(ArrayAttr[StringAttr])  # "name:.u64" entries, in order
    threads = prop_def(IntAttr)
    min_blocks = opt_prop_def(IntAttr)
    cluster = opt_prop_def(IntAttr)
    body = region_def("single_block")
    traits = traits_def(IsolatedFromAbove(), NoTerminator())

    def __init__(self, name: str, params: Sequence[tuple[str, str]], threads: int, body: Block,
                 min_blocks: int | None = None, cluster: int = 1):
        props: dict[str, Attribute] = {
            "sym_name": StringAttr(name),
            "params": ArrayAttr([StringAttr(f"{n}:{t}") for n, t in params]),
            "threads": IntAttr(threads),
        }
        if min_blocks is not None:
            props["min_blocks"] = IntAttr(min_blocks)
        if cluster > 1:
            props["cluster"] = IntAttr(cluster)
        super().__init__(properties=props, regions=[Region(body)])

    @property
    def cluster_blocks(self) -> int:
        return self.cluster.data if self.cluster is not None else 1

    @property
    def param_list(self) -> list[tuple[str, str]]:
        return [tuple(p.data.split(":", 1)) for p in self.params.data]  # type: ignore[misc]


@irdl_op_definition
class ParamOp(IRDLOperation):
    """`ld.param.TYPE %d, [name];`"""

    name = "ptx.param"
    param = prop_def(StringAttr)
    ptx_type = prop_def(StringAttr)
    result = result_def(RegsType)

    def __init__(self, param: str, ptx_type: str):
        cls = "b64" if ptx_type.endswith("64") else "b32"
        super().__init__(properties={"param": StringAttr(param), "ptx_type": StringAttr(ptx_type)},
                         result_types=[regs(cls, 1)])


@irdl_op_definition
class SpecialOp(IRDLOperation):
    """`mov.u32 %d, %tid.x;` and friends."""

    name = "ptx.special"
    register = prop_def(StringAttr)
    result = result_def(RegsType)

    def __init__(self, register: str):
        super().__init__(properties={"register": StringAttr(register)}, result_types=[regs("b32", 1)])


@irdl_op_definition
class RegsOp(IRDLOperation):
    """Declares a bundle of registers that later ops write `into` (loop-carried values). No instruction."""

    name = "ptx.regs"
    result = result_def(RegsType)

    def __init__(self, cls: str, count: int):
        super().__init__(result_types=[regs(cls, count)])


# --------------------------------------------------------------------------------------------------------------
# The per-register instruction family


@irdl_op_definition
class InstrOp(_TableOp):
    """One opcode applied n times. Instruction i writes register `dest[i]` of the result (or of `into`) and takes,
    in each operand slot s, register `slots[i, s]` of operand `slot_operand[s]`, or the immediate
    `immediates[slots[i, s]]` where `slot_operand[s]` is -1. An optional guard predicate bundle predicates
    instruction i on register `guard_index[i]` (negated with `guard_negate`)."""

    name = "ptx.op"
    opcode = prop_def(StringAttr)
    slot_operand = prop_def(DenseArrayBase)
    slots = prop_def(DenseArrayBase)
    dest = prop_def(DenseArrayBase)
    immediates = prop_def(ArrayAttr[StringAttr])
    guard_index = opt_prop_def(DenseArrayBase)
    guard_negate = opt_prop_def(BoolAttr)
    args = var_operand_def(RegsType)
    guard = opt_operand_def(RegsType)
    into = opt_operand_def(RegsType)
    result = opt_result_def(RegsType)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def __init__(
        self,
        opcode: str,
        args: Sequence[SSAValue | Operation],
        slot_operand: Sequence[int],
        slots: np.ndarray,
        immediates: Sequence[str] = (),
        result_type: RegsType | None = None,
        dest: Sequence[int] | np.ndarray | None = None,
        into: SSAValue | Operation | None = None,
        guard: SSAValue | Operation | None = None,
        guard_index: Sequence[int] | np.ndarray | None = None,
        guard_negate: bool = False,
    ):
        slots = np.asarray(slots, dtype=np.int64).reshape(-1, max(len(slot_operand), 1))
        n = slots.shape[0]
        if dest is None:
            dest = np.arange(n)
        props: dict[str, Attribute] = {
            "opcode": StringAttr(opcode),
            "slot_operand": _ints(slot_operand),
            "slots": _ints(slots),
            "dest": _ints(dest),
            "immediates": ArrayAttr([StringAttr(s) for s in immediates]),
        }
        if guard is not None:
            props["guard_index"] = _ints(guard_index if guard_index is not None else np.zeros(n, dtype=np.int64))
            if guard_negate:
                props["guard_negate"] = BoolAttr.from_bool(True)
        super().__init__(
            operands=[list(args), [guard] if guard is not None else [], [into] if into is not None else []],
            properties=props,
            result_types=[[] if into is not None else [result_type]],
        )

    @property
    def n(self) -> int:
        return len(self.dest_indices)

    @property
    def operand_of_slot(self) -> np.ndarray:
        return self.table("slot_operand", 0)

    @property
    def slot_table(self) -> np.ndarray:
        return self.table("slots", max(len(self.operand_of_slot), 1))

    @property
    def dest_indices(self) -> np.ndarray:
        return self.table("dest", 0)

    @property
    def guard_indices(self) -> np.ndarray | None:
        return self.table("guard_index", 0) if self.guard_index is not None else None

    @property
    def target(self) -> SSAValue:
        return self.into if self.into is not None else self.result  # type: ignore[return-value]

    def verify_(self) -> None:
        nslots = len(self.operand_of_slot)
        if self.slot_table.shape != (self.n, max(nslots, 1)) and not (nslots == 0 and self.slot_table.size == 0):
            raise VerifyException(f"{self.opcode.data}: slot table shape {self.slot_table.shape} for {self.n} instructions")
        for s, k in enumerate(self.operand_of_slot):
            column = self.slot_table[:, s]
            if k == -1:
                if len(column) and (column.min() < 0 or column.max() >= len(self.immediates.data)):
                    raise VerifyException(f"{self.opcode.data}: immediate index out of range")
            else:
                if not 0 <= int(k) < len(self.args):
                    raise VerifyException(f"{self.opcode.data}: slot {s} names operand {k} of {len(self.args)}")
                if len(column) and (column.min() < 0 or column.max() >= count_of(self.args[int(k)])):
                    raise VerifyException(f"{self.opcode.data}: register index out of range for operand {k}")
        if len(self.dest_indices) and (self.dest_indices.min() < 0 or self.dest_indices.max() >= count_of(self.target)):
            raise VerifyException(f"{self.opcode.data}: destination index out of range")


class PerInstr:
    """An immediate operand that differs between the instructions of one `ptx.op`."""

    def __init__(self, values: Sequence[int | float | str]):
        self.values = [v if isinstance(v, str) else format_immediate(v) for v in values]


def instr(opcode: str, result_type: RegsType | None, *operands: SSAValue | str | int | float | tuple[SSAValue, np.ndarray] | PerInstr,
          n: int | None = None, into: SSAValue | None = None, dest: np.ndarray | None = None,
          guard: SSAValue | None = None, guard_index: np.ndarray | None = None, guard_negate: bool = False) -> InstrOp:
    """Build a `ptx.op`. Each operand is a bundle used register-for-register (register i for instruction i, or
    register 0 of a one-register bundle), a (bundle, indices) pair, or an immediate (str/int)."""
    count = n if n is not None else (result_type.n if result_type is not None else count_of(into))  # type: ignore[union-attr]
    args: list[SSAValue] = []
    slot_operand: list[int] = []
    columns: list[np.ndarray] = []
    immediates: list[str] = []
    for op in operands:
        if isinstance(op, tuple):
            value, idx = op
            idx = np.broadcast_to(np.asarray(idx, dtype=np.int64), (count,))
        elif isinstance(op, SSAValue):
            value = op
            idx = np.arange(count) if count_of(op) == count else np.zeros(count, dtype=np.int64)
            if count_of(op) not in (1, count):
                raise ValueError(f"{opcode}: operand with {count_of(op)} registers for {count} instructions")
        elif isinstance(op, PerInstr):
            if len(op.values) != count:
                raise ValueError(f"{opcode}: {len(op.values)} immediates for {count} instructions")
            column = []
            for text in op.values:
                if text not in immediates:
                    immediates.append(text)
                column.append(immediates.index(text))
            slot_operand.append(-1)
            columns.append(np.array(column, dtype=np.int64))
            continue
        else:
            text = op if isinstance(op, str) else format_immediate(op)
            if text not in immediates:
                immediates.append(text)
            slot_operand.append(-1)
            columns.append(np.full(count, immediates.index(text), dtype=np.int64))
            continue
        if value not in args:
            args.append(value)
        slot_operand.append(args.index(value))
        columns.append(idx)
    slots = np.stack(columns, axis=1) if columns else np.zeros((count, 0), dtype=np.int64)
    return InstrOp(opcode, args, slot_operand, slots, immediates, result_type, dest, into, guard, guard_index, guard_negate)


def format_immediate(value: int | float) -> str:
    if isinstance(value, float):
        return "0f" + np.float32(value).view(np.uint32).item().to_bytes(4, "big").hex().upper()
    return str(int(value))


# --------------------------------------------------------------------------------------------------------------
# Memory


@irdl_op_definition
class LoadOp(_TableOp):
    """`ld.SPACE{.vN}.TYPE {d..}, [addr + imm];` per access. Access i reads `vec` registers starting at
    `dest[i]`, from register `addr_index[i]` of `addr` plus `offset[i]` bytes; guarded accesses that are off
    leave zeros (a `mov` of 0 precedes them)."""

    name = "ptx.ld"
    space = prop_def(StringAttr)
    ptx_type = prop_def(StringAttr)
    vec = prop_def(IntAttr)
    addr_index = prop_def(DenseArrayBase)
    offset = prop_def(DenseArrayBase)
    dest = prop_def(DenseArrayBase)
    guard_index = opt_prop_def(DenseArrayBase)
    addr = operand_def(RegsType)
    guard = opt_operand_def(RegsType)
    result = result_def(RegsType)

    def __init__(self, space: str, ptx_type: str, vec: int, addr: SSAValue, addr_index: Sequence[int], offset: Sequence[int],
                 dest: Sequence[int], result_type: RegsType, guard: SSAValue | None = None,
                 guard_index: Sequence[int] | None = None):
        props: dict[str, Attribute] = {
            "space": StringAttr(space), "ptx_type": StringAttr(ptx_type), "vec": IntAttr(vec),
            "addr_index": _ints(addr_index), "offset": _ints(offset), "dest": _ints(dest),
        }
        if guard is not None:
            props["guard_index"] = _ints(guard_index)  # type: ignore[arg-type]
        super().__init__(operands=[addr, [guard] if guard is not None else []], properties=props, result_types=[result_type])


@irdl_op_definition
class StoreOp(_TableOp):
    """`st.SPACE{.vN}.TYPE [addr + imm], {s..};` per access (see `ptx.ld`); guarded-off accesses are skipped.
    With `reduce` (add): `red.SPACE.add{.vN}.TYPE`, which adds the registers into memory atomically."""

    name = "ptx.st"
    space = prop_def(StringAttr)
    ptx_type = prop_def(StringAttr)
    vec = prop_def(IntAttr)
    addr_index = prop_def(DenseArrayBase)
    offset = prop_def(DenseArrayBase)
    source = prop_def(DenseArrayBase)
    guard_index = opt_prop_def(DenseArrayBase)
    reduce = opt_prop_def(StringAttr)
    addr = operand_def(RegsType)
    value = operand_def(RegsType)
    guard = opt_operand_def(RegsType)
    traits = traits_def(MemoryWriteEffect())

    def __init__(self, space: str, ptx_type: str, vec: int, addr: SSAValue, addr_index: Sequence[int], offset: Sequence[int],
                 value: SSAValue, source: Sequence[int], guard: SSAValue | None = None, guard_index: Sequence[int] | None = None,
                 reduce: str | None = None):
        props: dict[str, Attribute] = {
            "space": StringAttr(space), "ptx_type": StringAttr(ptx_type), "vec": IntAttr(vec),
            "addr_index": _ints(addr_index), "offset": _ints(offset), "source": _ints(source),
        }
        if guard is not None:
            props["guard_index"] = _ints(guard_index)  # type: ignore[arg-type]
        if reduce is not None:
            props["reduce"] = StringAttr(reduce)
        super().__init__(operands=[addr, value, [guard] if guard is not None else []], properties=props)


@irdl_op_definition
class CpAsyncOp(_TableOp):
    """`cp.async.{cg,ca}.shared.global [dst + imm], [src + imm], N, size;` per chunk of N = 4, 8 or 16 bytes.
    `size` (bytes actually read; the rest is zero-filled) is register `size_index[i]` of `src_size`, or N without
    it; a guard predicate skips chunks altogether."""

    name = "ptx.cp_async"
    dst_index = prop_def(DenseArrayBase)
    dst_offset = prop_def(DenseArrayBase)
    src_index = prop_def(DenseArrayBase)
    src_offset = prop_def(DenseArrayBase)
    size_index = opt_prop_def(DenseArrayBase)
    guard_index = opt_prop_def(DenseArrayBase)
    nbytes = prop_def(IntAttr)
    dst = operand_def(RegsType)
    src = operand_def(RegsType)
    src_size = opt_operand_def(RegsType)
    guard = opt_operand_def(RegsType)
    traits = traits_def(MemoryWriteEffect())
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def __init__(self, nbytes: int, dst: SSAValue, dst_index: Sequence[int], dst_offset: Sequence[int], src: SSAValue,
                 src_index: Sequence[int], src_offset: Sequence[int], src_size: SSAValue | None = None,
                 size_index: Sequence[int] | None = None, guard: SSAValue | None = None,
                 guard_index: Sequence[int] | None = None):
        props: dict[str, Attribute] = {
            "nbytes": IntAttr(nbytes),
            "dst_index": _ints(dst_index), "dst_offset": _ints(dst_offset),
            "src_index": _ints(src_index), "src_offset": _ints(src_offset),
        }
        if src_size is not None:
            props["size_index"] = _ints(size_index)  # type: ignore[arg-type]
        if guard is not None:
            props["guard_index"] = _ints(guard_index)  # type: ignore[arg-type]
        super().__init__(operands=[dst, src, [src_size] if src_size is not None else [], [guard] if guard is not None else []],
                         properties=props)


@irdl_op_definition
class CpAsyncCommitOp(IRDLOperation):
    """`cp.async.commit_group;`"""

    name = "ptx.cp_async_commit"
    traits = traits_def(MemoryWriteEffect())


@irdl_op_definition
class CpAsyncWaitOp(IRDLOperation):
    """`cp.async.wait_group N;`: this thread's copies of all but the N newest groups have landed."""

    name = "ptx.cp_async_wait"
    pending = prop_def(IntAttr)
    traits = traits_def(MemoryWriteEffect())

    def __init__(self, pending: int):
        super().__init__(properties={"pending": IntAttr(pending)})


@irdl_op_definition
class LdmatrixOp(_TableOp):
    """`ldmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16 {d..}, [addr + imm];` per instruction; instruction i
    writes registers `dest[i, 0..N-1]`."""

    name = "ptx.ldmatrix"
    num = prop_def(IntAttr)
    trans = prop_def(BoolAttr)
    addr_index = prop_def(DenseArrayBase)
    offset = prop_def(DenseArrayBase)
    dest = prop_def(DenseArrayBase)
    addr = operand_def(RegsType)
    result = result_def(RegsType)

    def __init__(self, num: int, trans: bool, addr: SSAValue, addr_index: Sequence[int], offset: Sequence[int],
                 dest: np.ndarray, result_type: RegsType):
        super().__init__(
            operands=[addr],
            properties={"num": IntAttr(num), "trans": BoolAttr.from_bool(trans), "addr_index": _ints(addr_index),
                        "offset": _ints(offset), "dest": _ints(dest)},
            result_types=[result_type],
        )


@irdl_op_definition
class MmaOp(_TableOp):
    """`mma.sync.aligned.SHAPE {d0..d3}, {a0..a3}, {b0, b1}, {c0..c3};` per instruction, registers picked by the
    table `regs[i] = (d×4, a×4, b×2, c×4)`. D is a new bundle of c's size (registers not written keep c's)."""

    name = "ptx.mma"
    shape = prop_def(StringAttr)
    regs_table = prop_def(DenseArrayBase)
    a = operand_def(RegsType)
    b = operand_def(RegsType)
    c = operand_def(RegsType)
    result = result_def(RegsType)

    def __init__(self, shape: str, a: SSAValue, b: SSAValue, c: SSAValue, table: np.ndarray):
        super().__init__(operands=[a, b, c], properties={"shape": StringAttr(shape), "regs_table": _ints(table)},
                         result_types=[c.type])

    @property
    def instructions(self) -> np.ndarray:
        return self.table("regs_table", 14)


# --------------------------------------------------------------------------------------------------------------
# Synchronization and control flow


@irdl_op_definition
class BarSyncOp(IRDLOperation):
    """`bar.sync ID;`: every thread of the block waits here; `bar.sync ID, N;`: the N threads (whole warps) that
    use named barrier ID wait for each other. With kind `arrive`, `bar.arrive ID, N;`: the threads count toward
    the barrier's N without waiting. With `barrier_reg`, the ID is that register's value (register 0), e.g. one
    that differs between warpgroups."""

    name = "ptx.bar_sync"
    barrier = prop_def(IntAttr)
    threads = opt_prop_def(IntAttr)
    kind = opt_prop_def(StringAttr)  # "arrive"; absent: sync
    barrier_reg = opt_operand_def(RegsType)
    traits = traits_def(MemoryWriteEffect())

    def __init__(self, barrier: int | SSAValue = 0, threads: int | None = None, arrive: bool = False):
        props: dict[str, Attribute] = {"barrier": IntAttr(barrier if isinstance(barrier, int) else -1)}
        if threads is not None:
            props["threads"] = IntAttr(threads)
        if arrive:
            props["kind"] = StringAttr("arrive")
        super().__init__(operands=[[] if isinstance(barrier, int) else [barrier]], properties=props)

    @property
    def arrives(self) -> bool:
        return self.kind is not None and self.kind.data == "arrive"

    def verify_(self) -> None:
        if self.threads is not None and (self.threads.data % 32 or self.threads.data <= 0):
            raise VerifyException(f"bar.sync: the thread count must be a positive multiple of 32, got {self.threads.data}")
        if self.arrives and self.threads is None:
            raise VerifyException("bar.arrive needs a thread count")
        if (self.barrier_reg is None) == (self.barrier.data < 0):
            raise VerifyException("bar.sync: a barrier number or a register holding it, one of the two")


@irdl_op_definition
class LabelOp(IRDLOperation):
    """`NAME:`"""

    name = "ptx.label"
    label = prop_def(StringAttr)
    traits = traits_def(MemoryWriteEffect())

    def __init__(self, label: str):
        super().__init__(properties={"label": StringAttr(label)})


@irdl_op_definition
class BraOp(IRDLOperation):
    """`{@p} bra.uni NAME;`: a branch every lane of a warp takes the same way."""

    name = "ptx.bra"
    target = prop_def(StringAttr)
    negate = prop_def(BoolAttr)
    guard = opt_operand_def(RegsType)
    traits = traits_def(MemoryWriteEffect())

    def __init__(self, target: str, guard: SSAValue | None = None, negate: bool = False):
        super().__init__(operands=[[guard] if guard is not None else []],
                         properties={"target": StringAttr(target), "negate": BoolAttr.from_bool(negate)})


@irdl_op_definition
class RetOp(IRDLOperation):
    """`ret;`"""

    name = "ptx.ret"
    traits = traits_def(MemoryWriteEffect())


# --------------------------------------------------------------------------------------------------------------
# Hopper (sm_90a): warpgroup mma, mbarriers, TMA, fences, register reallocation


@irdl_op_definition
class ParamAddrOp(IRDLOperation):
    """`mov.b64 %d, name; cvta.param.u64 %d, %d;`: the generic address of a kernel parameter used in place (a
    tensor map, `.param .align 64 .b8 name[128]`)."""

    name = "ptx.param_addr"
    param = prop_def(StringAttr)
    result = result_def(RegsType)

    def __init__(self, param: str):
        super().__init__(properties={"param": StringAttr(param)}, result_types=[regs("b64", 1)])


WGMMA_FP8 = ("e4m3", "e5m2")


@irdl_op_definition
class WgmmaOp(_TableOp):
    """`wgmma.mma_async.sync.aligned.m64nNkK.f32.atype.btype {d..}, A, descB, scaleD, 1, 1{, transA}, transB;`,
    executed by a whole warpgroup. The N/2 accumulator registers `acc[acc_index]` are read (scale_d = 1) and
    written in place; they may be read only after a `wgmma.wait_group` that covers this op. A is a descriptor
    (one b64 register of `a`) or, with four `a_index` entries, 16-bit pairs in registers of `a` (then no transA).
    The operand types are bf16 or f16 (both the same; K = 16) or e4m3 / e5m2 (K = 32, K-major, no transposes)."""

    name = "ptx.wgmma"
    n = prop_def(IntAttr)
    a_type = prop_def(StringAttr)
    b_type = prop_def(StringAttr)
    scale_d = prop_def(IntAttr)
    trans_a = prop_def(IntAttr)
    trans_b = prop_def(IntAttr)
    acc_index = prop_def(DenseArrayBase)
    a_index = prop_def(DenseArrayBase)
    b_index = prop_def(IntAttr)
    acc = operand_def(RegsType)
    a = operand_def(RegsType)
    b = operand_def(RegsType)
    traits = traits_def(MemoryWriteEffect())

    def __init__(self, n: int, acc: SSAValue, acc_index: Sequence[int], a: SSAValue, a_index: Sequence[int],
                 b: SSAValue, b_index: int = 0, scale_d: int = 1, trans_a: int = 0, trans_b: int = 0,
                 a_type: str = "bf16", b_type: str | None = None):
        super().__init__(
            operands=[acc, a, b],
            properties={"n": IntAttr(n), "a_type": StringAttr(a_type), "b_type": StringAttr(b_type or a_type),
                        "scale_d": IntAttr(scale_d), "trans_a": IntAttr(trans_a),
                        "trans_b": IntAttr(trans_b), "acc_index": _ints(acc_index), "a_index": _ints(a_index),
                        "b_index": IntAttr(b_index)},
        )

    @property
    def a_in_registers(self) -> bool:
        return len(self.table("a_index", 0)) == 4

    @property
    def k(self) -> int:
        """Elements of K this wgmma takes: 32 bytes' worth."""
        return 32 if self.a_type.data in WGMMA_FP8 else 16

    def verify_(self) -> None:
        a_type, b_type = self.a_type.data, self.b_type.data
        if not (a_type == b_type in ("bf16", "f16") or a_type in WGMMA_FP8 and b_type in WGMMA_FP8):
            raise VerifyException(f"wgmma: operand types must be both bf16, both f16, or e4m3 / e5m2, got {a_type} "
                                  f"and {b_type}")
        if a_type in WGMMA_FP8 and (self.trans_a.data or self.trans_b.data or self.a_in_registers):
            raise VerifyException("wgmma: fp8 operands are K-major shared tiles (no transposes, no A in registers)")
        n = self.n.data
        if not (8 <= n <= 256 and n % 8 == 0):
            raise VerifyException(f"wgmma: N must be a multiple of 8 in 8..256, got {n}")
        if len(self.table("acc_index", 0)) != n // 2:
            raise VerifyException(f"wgmma m64n{n}k{self.k}: {n // 2} accumulator registers, got "
                                  f"{len(self.table('acc_index', 0))}")
        if len(self.table("a_index", 0)) not in (1, 4):
            raise VerifyException("wgmma: A is one descriptor register or four bf16x2 registers")
        if self.a_in_registers and self.trans_a.data:
            raise VerifyException("wgmma: an A operand in registers cannot be transposed")


class _GroupSyncOp(IRDLOperation):
    """What the group instructions of wgmma and of bulk copies share: a kind, and for a wait how many of this
    thread's groups may stay pending. Subclasses name their kinds (the first is the one without a count)."""

    KINDS: ClassVar[tuple[str, ...]] = ()
    kind = prop_def(StringAttr)
    pending = opt_prop_def(IntAttr)
    traits = traits_def(MemoryWriteEffect())

    def __init__(self, kind: str, pending: int | None = None):
        props: dict[str, Attribute] = {"kind": StringAttr(kind)}
        if pending is not None:
            props["pending"] = IntAttr(pending)
        super().__init__(properties=props)

    def verify_(self) -> None:
        what = self.name.removeprefix("ptx.")
        if self.kind.data not in self.KINDS:
            raise VerifyException(f"{what} kind must be one of {', '.join(self.KINDS)}, got {self.kind.data}")
        if self.kind.data.startswith("wait") != (self.pending is not None):
            raise VerifyException(f"{what}: a wait (and only a wait) says how many groups may stay pending")


@irdl_op_definition
class WgmmaSyncOp(_GroupSyncOp):
    """`wgmma.fence.sync.aligned;`, `wgmma.commit_group.sync.aligned;` or `wgmma.wait_group.sync.aligned N;`
    (kind = fence | commit | wait)."""

    name = "ptx.wgmma_sync"
    KINDS: ClassVar[tuple[str, ...]] = ("fence", "commit", "wait")


@irdl_op_definition
class FenceOp(IRDLOperation):
    """`fence.KIND;`: `proxy.async.shared::cta` (generic writes become visible to TMA/wgmma reads) or
    `mbarrier_init.release.cluster` (an mbarrier's init becomes visible)."""

    name = "ptx.fence"
    kind = prop_def(StringAttr)
    traits = traits_def(MemoryWriteEffect())

    def __init__(self, kind: str):
        super().__init__(properties={"kind": StringAttr(kind)})


@irdl_op_definition
class MbarrierOp(IRDLOperation):
    """One mbarrier instruction on the 8-byte barrier at shared address `addr[addr_index] + offset`:
    `init` (`mbarrier.init.shared::cta.b64 [bar], count;`), `arrive` (`mbarrier.arrive.shared::cta.b64 _, [bar];`),
    `arrive_cluster` (`mbarrier.arrive.shared::cluster.b64 _, [bar];`: `addr` a shared::cluster
    address from `mapa`, the barrier of any block of the cluster),
    `arrive_expect_tx` (`mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], count;` with count = bytes),
    `cp_async_arrive` (`cp.async.mbarrier.arrive.noinc.shared::cta.b64 [bar];`: an arrival once the thread's earlier
    cp.async copies have landed) or
    `try_wait` (`mbarrier.try_wait.parity.shared::cta.b64 %p, [bar], parity;`, parity = `parity[parity_index]`,
    result: whether the phase with that parity has completed). A guard predicate (register 0 of `guard`) picks the
    threads that execute it (`@%p`), e.g. the one thread that initializes the barrier."""

    name = "ptx.mbarrier"
    kind = prop_def(StringAttr)
    count = opt_prop_def(IntAttr)
    addr_index = prop_def(IntAttr)
    offset = prop_def(IntAttr)
    parity_index = opt_prop_def(IntAttr)
    addr = operand_def(RegsType)
    parity = opt_operand_def(RegsType)
    guard = opt_operand_def(RegsType)
    result = opt_result_def(RegsType)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    traits = traits_def(MemoryWriteEffect())

    def __init__(self, kind: str, addr: SSAValue, addr_index: int = 0, offset: int = 0, count: int | None = None,
                 parity: SSAValue | None = None, parity_index: int = 0, guard: SSAValue | None = None):
        props: dict[str, Attribute] = {"kind": StringAttr(kind), "addr_index": IntAttr(addr_index), "offset": IntAttr(offset)}
        if count is not None:
            props["count"] = IntAttr(count)
        if parity is not None:
            props["parity_index"] = IntAttr(parity_index)
        super().__init__(operands=[addr, [parity] if parity is not None else [], [guard] if guard is not None else []],
                         properties=props, result_types=[[regs("pred", 1)] if kind == "try_wait" else []])

    def verify_(self) -> None:
        kind = self.kind.data
        if kind not in ("init", "arrive", "arrive_cluster", "arrive_expect_tx", "cp_async_arrive", "try_wait"):
            raise VerifyException(f"mbarrier kind {kind!r} is not one of init, arrive, arrive_cluster, "
                                  "arrive_expect_tx, cp_async_arrive, try_wait")
        if (kind in ("init", "arrive_expect_tx")) != (self.count is not None):
            raise VerifyException(f"mbarrier {kind}: a count goes with init and arrive_expect_tx only")
        if (kind == "try_wait") != (self.parity is not None):
            raise VerifyException("mbarrier: try_wait (and only try_wait) takes a parity")


@irdl_op_definition
class TmaLoadOp(_TableOp):
    """`cp.async.bulk.tensor.Rd.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [tmap, {c0, ..}], [bar];`
    issued by one thread: the box of the tensor map at coordinates `coords[coord_index]` (innermost first, in
    elements) lands at shared `dst[dst_index] + dst_offset` and counts its bytes on the mbarrier. The guard
    predicate (register 0 of `guard`) picks the issuing thread. With `mask` (a b16 register, `.multicast::cluster`)
    the box lands at that address in every block of the cluster whose bit is set, and counts on the mbarrier at the
    same offset in each."""

    name = "ptx.tma_load"
    dst_index = prop_def(IntAttr)
    dst_offset = prop_def(IntAttr)
    coord_index = prop_def(DenseArrayBase)
    bar_index = prop_def(IntAttr)
    bar_offset = prop_def(IntAttr)
    dst = operand_def(RegsType)
    tmap = operand_def(RegsType)
    coords = operand_def(RegsType)
    bar = operand_def(RegsType)
    guard = opt_operand_def(RegsType)
    mask = opt_operand_def(RegsType)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    traits = traits_def(MemoryWriteEffect())

    def __init__(self, dst: SSAValue, dst_index: int, dst_offset: int, tmap: SSAValue, coords: SSAValue,
                 coord_index: Sequence[int], bar: SSAValue, bar_index: int = 0, bar_offset: int = 0,
                 guard: SSAValue | None = None, mask: SSAValue | None = None):
        super().__init__(
            operands=[dst, tmap, coords, bar, [guard] if guard is not None else [], [mask] if mask is not None else []],
            properties={"dst_index": IntAttr(dst_index), "dst_offset": IntAttr(dst_offset),
                        "coord_index": _ints(coord_index), "bar_index": IntAttr(bar_index), "bar_offset": IntAttr(bar_offset)},
        )


@irdl_op_definition
class TmaStoreOp(_TableOp):
    """`cp.async.bulk.tensor.Rd.global.shared::cta.bulk_group [tmap, {c0, ..}], [src];` issued by one thread: the
    swizzled box at shared `src[src_index] + src_offset` goes to the tensor map's box at `coords[coord_index]`
    (innermost first; elements past the tensor's end are not written). It belongs to the issuing thread's next
    bulk group and reads shared memory until a `cp.async.bulk.wait_group.read` covers it. With `reduce` (add):
    `cp.reduce.async.bulk.tensor.Rd.global.shared::cta.add.tile.bulk_group`, the box added to the tensor's."""

    name = "ptx.tma_store"
    src_index = prop_def(IntAttr)
    src_offset = prop_def(IntAttr)
    coord_index = prop_def(DenseArrayBase)
    reduce = opt_prop_def(StringAttr)
    src = operand_def(RegsType)
    tmap = operand_def(RegsType)
    coords = operand_def(RegsType)
    guard = opt_operand_def(RegsType)
    traits = traits_def(MemoryWriteEffect())

    def __init__(self, src: SSAValue, src_index: int, src_offset: int, tmap: SSAValue, coords: SSAValue,
                 coord_index: Sequence[int], guard: SSAValue | None = None, reduce: str | None = None):
        props: dict[str, Attribute] = {"src_index": IntAttr(src_index), "src_offset": IntAttr(src_offset),
                                       "coord_index": _ints(coord_index)}
        if reduce is not None:
            props["reduce"] = StringAttr(reduce)
        super().__init__(operands=[src, tmap, coords, [guard] if guard is not None else []], properties=props)


@irdl_op_definition
class BulkGroupOp(_GroupSyncOp):
    """`cp.async.bulk.commit_group;` (kind commit) or `cp.async.bulk.wait_group{.read} N;` (kind wait / wait_read:
    until at most N of this thread's bulk groups are pending; `.read`: only their reads of shared memory)."""

    name = "ptx.bulk_group"
    KINDS: ClassVar[tuple[str, ...]] = ("commit", "wait", "wait_read")


@irdl_op_definition
class WarpSyncOp(IRDLOperation):
    """`bar.warp.sync -1;`: the lanes of the warp meet (and see each other's shared-memory writes)."""

    name = "ptx.warp_sync"
    traits = traits_def(MemoryWriteEffect())


@irdl_op_definition
class SetmaxnregOp(IRDLOperation):
    """`setmaxnreg.{inc,dec}.sync.aligned.u32 N;`: the warpgroup's registers per thread become N."""

    name = "ptx.setmaxnreg"
    increase = prop_def(BoolAttr)
    count = prop_def(IntAttr)
    traits = traits_def(MemoryWriteEffect())

    def __init__(self, increase: bool, count: int):
        super().__init__(properties={"increase": BoolAttr.from_bool(increase), "count": IntAttr(count)})

    def verify_(self) -> None:
        n = self.count.data
        if not (24 <= n <= 256 and n % 8 == 0):
            raise VerifyException(f"setmaxnreg: the count must be a multiple of 8 in 24..256, got {n}")


class _KindOp(IRDLOperation):
    """An instruction with no operands whose variant is its `kind`, one of KINDS."""

    kind = prop_def(StringAttr)
    traits = traits_def(MemoryWriteEffect())
    KINDS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, kind: str):
        super().__init__(properties={"kind": StringAttr(kind)})

    def verify_(self) -> None:
        if self.kind.data not in self.KINDS:
            raise VerifyException(f"{self.name.removeprefix('ptx.')}: kind must be one of {self.KINDS}, "
                                  f"got {self.kind.data!r}")


@irdl_op_definition
class GridDependencyOp(_KindOp):
    """`griddepcontrol.KIND;` (sm_90): `launch_dependents` lets the next kernel in the stream start its blocks on
    multiprocessors this grid leaves free; `wait` holds this thread until the grids it depends on have finished and
    their memory writes are visible. A no-op where the kernel was launched without programmatic dependence."""

    name = "ptx.griddepcontrol"
    KINDS: ClassVar[tuple[str, ...]] = ("launch_dependents", "wait")


@irdl_op_definition
class ElectOp(IRDLOperation):
    """`elect.sync _|%p, 0xffffffff;`: true in exactly one lane of the warp."""

    name = "ptx.elect"
    result = result_def(RegsType)

    def __init__(self) -> None:
        super().__init__(result_types=[regs("pred", 1)])


@irdl_op_definition
class ClusterBarrierOp(_KindOp):
    """`barrier.cluster.arrive.release.aligned;` (kind arrive) or `barrier.cluster.wait.acquire.aligned;` (wait):
    every thread of every block of the cluster arrives, then waits until all have; what each wrote before its
    arrival is visible to all after the wait. `arrive_relaxed` (`barrier.cluster.arrive.relaxed.aligned;`) orders
    nothing: where a fence already did (the mbarrier inits' `fence.mbarrier_init.release.cluster`), it saves the
    release's fences (a MEMBAR.ALL.GPU in SASS)."""

    name = "ptx.cluster_barrier"
    KINDS: ClassVar[tuple[str, ...]] = ("arrive", "arrive_relaxed", "wait")


@irdl_op_definition
class AtomOp(IRDLOperation):
    """`atom.acq_rel.gpu.global.add.u32 d, [addr], b;` in each thread whose guard (register 0 of `guard`, where
    given) is set: d is the word at the global address (register 0 of `addr`) before b (register 0 of `value`) was
    added to it, atomically; a guarded-off thread's d is 0 (a `mov` of 0 precedes it)."""

    name = "ptx.atom"
    addr = operand_def(RegsType)
    value = operand_def(RegsType)
    guard = opt_operand_def(RegsType)
    result = result_def(RegsType)
    traits = traits_def(MemoryWriteEffect())

    def __init__(self, addr: SSAValue, value: SSAValue, guard: SSAValue | None = None):
        super().__init__(operands=[addr, value, [guard] if guard is not None else []], result_types=[regs("b32", 1)])


@irdl_op_definition
class BarRedOp(IRDLOperation):
    """`bar.red.or.pred d, 0, p;`: every thread of the block waits here (barrier 0, as `bar.sync 0`) and gets in d
    whether p was set in any of them."""

    name = "ptx.bar_red"
    value = operand_def(RegsType)
    result = result_def(RegsType)
    traits = traits_def(MemoryWriteEffect())
    threads = opt_prop_def(IntAttr)  # never set: the whole block, as `bar.sync 0` (the simulator reads it)

    def __init__(self, value: SSAValue):
        super().__init__(operands=[value], result_types=[regs("pred", 1)])


PTX_OPS = [KernelOp, ParamOp, SpecialOp, RegsOp, InstrOp, LoadOp, StoreOp, CpAsyncOp, CpAsyncCommitOp, CpAsyncWaitOp,
           LdmatrixOp, MmaOp, BarSyncOp, LabelOp, BraOp, RetOp, ParamAddrOp, WgmmaOp, WgmmaSyncOp, FenceOp,
           MbarrierOp, TmaLoadOp, TmaStoreOp, BulkGroupOp, WarpSyncOp, SetmaxnregOp, GridDependencyOp, ElectOp,
           ClusterBarrierOp, AtomOp, BarRedOp]
Ptx = Dialect("ptx", PTX_OPS, [RegsType])
