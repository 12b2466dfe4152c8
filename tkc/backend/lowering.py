"""The lowering's context (lower-to-ptx, passes/lower_to_ptx.py): `KernelLowering` emits a kernel's `ptx` ops —
registers, immediates (`Imm`), index expressions, the kernel's parameters — and dispatches each tile-IR op to the
handler registered for its type with `handles` (backend/lower_scalars.py, lower_control.py, lower_compute.py,
lower_memory.py, lower_copies.py, lower_tma.py). What a value lowers to: registers (an SSA bundle of `ptx.regs`), an `Imm`, or a
reference to memory (`GlobalRef`: a tensor's pointer, sizes and byte strides; `SharedRef`, `RingRef`: shared
buffers by address)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from xdsl.dialects import func, scf
from xdsl.dialects.builtin import ArrayAttr, Float32Type, IntegerAttr
from xdsl.ir import Block, Operation, SSAValue

from tkc.backend import ptx
from tkc.backend.index import Const, Expr, Leaf
from tkc.errors import SourceLoc, TkcError
from tkc.ir import async_ops as a
from tkc.ir import ops as t
from tkc.ir.types import GlobalType, element_bytes
from tkc.passes.allocate_shared import TOTAL_ATTR
from tkc.targets import get_target

ALIGN_ATTR = "tkc.arg_align"  # per argument: bytes that divide a tensor's address, strides and row length
DEFAULT_ALIGN = 16
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@dataclass(frozen=True)
class Imm:
    """A compile-time scalar: an immediate operand until something needs it in a register."""

    value: int | float | bool
    cls: str = "b32"


@dataclass
class GlobalRef:
    ptr: SSAValue  # b64, generic → global address of element 0
    dims: list[SSAValue]  # b32 each
    strides: list[SSAValue]  # b64 each, in bytes
    type: GlobalType
    align: int


@dataclass
class SharedRef:
    addr: SSAValue  # b32 shared-window address of the buffer
    type: Any
    panel_rows: int | None = None  # a view of rows of a taller tile: its column panels lie this many rows apart


@dataclass
class RingRef:
    addr: SSAValue
    type: a.RingType


@dataclass
class KernelLowering:
    fn: func.FuncOp
    target: str
    prologue: list[Operation] = field(default_factory=list)
    body: list[Operation] = field(default_factory=list)
    values: dict[SSAValue, Any] = field(default_factory=dict)
    hoisted: dict[str, SSAValue] = field(default_factory=dict)
    labels: int = 0
    current_loc: Any = None
    guard: Any = None  # pred: inside an if-converted branch, memory operations run only where it holds
    wgmma_loops: set[Operation] = field(default_factory=set)  # loops that leave a wgmma in flight at each step
    passed_at_commit: set[Operation] = field(default_factory=set)  # turn passes lowered with the wgmma before them
    tensor_maps: list[str] = field(default_factory=list)  # tensor-map parameters (backend/lower_tma.py), in order
    producer_warp: int = 0  # the warp whose first thread issues TMA loads (a producer warpgroup's first warp)
    role_threads: int | None = None  # inside one role of a warp-specialized kernel: the threads of that role
    tma_stores: bool = False  # TMA stores were issued: wait for them before exiting
    cluster: int = 1  # the kernel's blocks run in clusters of this many

    @property
    def copy_threads(self) -> int:
        """The threads that share a cooperative copy here: the block's, or inside the consumer role of a
        warp-specialized kernel (warps 0 .. consumer_warps - 1) that role's."""
        return self.role_threads or self.threads

    # --------------------------------------------------------------------------------------------------------
    # Emission

    def emit(self, op: Operation) -> Operation:
        if self.current_loc is not None:
            op.location = self.current_loc
        self.body.append(op)
        return op

    def emit_entry(self, op: Operation) -> Operation:
        self.prologue.append(op)
        return op

    def op(self, opcode: str, cls: str | None, *operands: Any, n: int | None = None, **kw: Any) -> SSAValue | None:
        """Emit a `ptx.op`; `cls` is the result's register class (None when writing `into=`)."""
        count = n if n is not None else _count(operands, kw.get("into"))
        result_type = ptx.regs(cls, count) if cls is not None else None
        operands = tuple(self.operand(o) for o in operands)
        emitted = self.emit(ptx.instr(opcode, result_type, *operands, n=count, **kw))
        return emitted.results[0] if emitted.results else None

    def operand(self, value: Any) -> Any:
        if isinstance(value, Imm):
            return _imm_text(value)
        return value

    def reg(self, value: Any, cls: str = "b32") -> SSAValue:
        """A value in a register (materializes immediates)."""
        if isinstance(value, Imm):
            return self.op("mov.b32" if value.cls != "b64" else "mov.b64", value.cls, _imm_text(value), n=1)  # type: ignore[return-value]
        return value

    def label(self, stem: str) -> str:
        self.labels += 1
        return f"${stem}_{self.labels}"

    # Index expressions ----------------------------------------------------------------------------------------

    def expr(self, e: Expr | int, env: dict[str, Any] | None = None) -> Any:
        """Emit an index expression; expressions of thread indices only are computed once, at kernel entry."""
        if isinstance(e, int):
            return Imm(e)
        env = env or {}
        if isinstance(e, Const):
            return Imm(e.value)
        thread_only = e.leaves() <= {"lane", "tid", "warp"}
        key = repr(e)
        if thread_only and key in self.hoisted:
            return self.hoisted[key]
        saved = self.body
        if thread_only:
            self.body = self.prologue
        try:
            value = self._emit_expr(e, {**self.thread_env, **env}, {})
        finally:
            self.body = saved
        if thread_only:
            self.hoisted[key] = value
        return value

    def at_entry(self, key: str, build: Any) -> Any:
        """What `build()` emits, emitted once at kernel entry (for values of the thread and the parameters only)."""
        if key not in self.hoisted:
            saved, self.body = self.body, self.prologue
            try:
                self.hoisted[key] = build()
            finally:
                self.body = saved
        return self.hoisted[key]

    def _emit_expr(self, e: Expr, env: dict[str, Any], memo: dict[str, Any]) -> Any:
        from tkc.backend.index import BinOp

        if isinstance(e, Const):
            return Imm(e.value)
        if isinstance(e, Leaf):
            return env[e.name]
        key = repr(e)
        if key in memo:
            return memo[key]
        assert isinstance(e, BinOp)
        lhs = self._emit_expr(e.lhs, env, memo)
        rhs = self._emit_expr(e.rhs, env, memo)
        if isinstance(lhs, Imm) and isinstance(rhs, Imm):
            from tkc.backend.index import _NUMPY

            return Imm(int(_NUMPY[e.op](np.int64(lhs.value), np.int64(rhs.value))))
        op = e.op
        divided = (_udiv_by_constant(self, self.reg(lhs), rhs.value, remainder=op == "%")
                   if op in ("//", "%") and isinstance(rhs, Imm) else None)
        if divided is not None:
            result = divided
        else:
            opcode = {"+": "add.s32", "-": "sub.s32", "*": "mul.lo.s32", "//": "div.u32", "%": "rem.u32",
                      "^": "xor.b32", "&": "and.b32", "<<": "shl.b32", ">>": "shr.u32"}[op]
            result = self.op(opcode, "b32", self.reg(lhs) if isinstance(lhs, Imm) and isinstance(rhs, Imm) else lhs, rhs)
        memo[key] = result
        return result

    # --------------------------------------------------------------------------------------------------------
    # Kernel structure

    def run(self) -> ptx.KernelOp:
        fn = self.fn
        warps = fn.attributes["tkc.warps"].value.data  # type: ignore[attr-defined]
        self.threads = 32 * warps
        consumers = fn.attributes.get("tkc.consumer_warps")
        self.consumer_warps = consumers.value.data if isinstance(consumers, IntegerAttr) else warps
        self.producer_warp = self.consumer_warps if self.consumer_warps != warps else 0
        if "tkc.pingpong" in fn.attributes and self.consumer_warps == warps:
            # warpgroups in ping-pong: the one that goes second refills the ring. Its wait for a stage's release
            # then never waits on the first warpgroup's turn that is waiting on it (pingpong_warpgroups.py)
            self.producer_warp = 4
        self.async_proxy_reads = any(isinstance(op, t.WgmmaOp) for op in fn.walk())
        self.cluster = t.cluster_size(fn)
        aligns = argument_aligns(fn)
        params: list[tuple[str, str]] = []
        if get_target(self.target).sm >= 90:
            # programmatic dependent launch (runtime/driver.py launches sm_90 kernels with it): the next kernel's
            # blocks may start as this grid's last blocks run, and each of them first waits here for the kernels
            # before it to finish; this hides the launch gap between back-to-back kernels
            self.emit_entry(ptx.GridDependencyOp("launch_dependents"))
            self.emit_entry(ptx.GridDependencyOp("wait"))
        tid = self.emit_entry(ptx.SpecialOp("%tid.x")).results[0]
        self.thread_env: dict[str, Any] = {"tid": tid}
        self.thread_env["lane"] = self._entry_op("and.b32", tid, Imm(31))
        self.thread_env["warp"] = self._warp_index(tid)
        smem_bytes = fn.attributes.get(TOTAL_ATTR)
        self.smem_bytes = smem_bytes.value.data if isinstance(smem_bytes, IntegerAttr) else 0
        if self.smem_bytes:
            base = self.emit_entry(ptx.SpecialOp("smem")).results[0]
            self.smem = self._entry_op("and.b32", self._entry_op("add.s32", base, Imm(1023)), Imm(-1024))
        for i, arg in enumerate(fn.body.block.args):
            name = arg.name_hint or f"arg{i}"
            if isinstance(arg.type, GlobalType):
                self.values[arg] = self._global_param(name, arg.type, aligns[i], params)
            elif isinstance(arg.type, Float32Type):
                params.append((name, "f32"))
                self.values[arg] = self.emit_entry(ptx.ParamOp(name, "f32")).results[0]
            else:
                params.append((name, "s32"))
                self.values[arg] = self.emit_entry(ptx.ParamOp(name, "s32")).results[0]
        self.lower_block(fn.body.block)
        params += [(name, "tensormap") for name in self.tensor_maps]
        block = Block(self.prologue + self.body)
        min_blocks = fn.attributes.get("tkc.blocks_per_sm")
        blocks = min_blocks.value.data if isinstance(min_blocks, IntegerAttr) else None
        if blocks is None and any(isinstance(op, ptx.SetmaxnregOp) for op in block.ops):
            blocks = 1  # ptxas honours setmaxnreg only when it knows the registers at entry (.minnctapersm)
        return ptx.KernelOp(fn.sym_name.data, params, self.threads, block, min_blocks=blocks, cluster=self.cluster)

    def _warp_index(self, tid: SSAValue) -> SSAValue:
        """tid / 32. With wgmmas, broadcast from lane 0: the same value, but ptxas then knows it is warp-uniform and
        keeps what derives from it (a warpgroup's wgmma descriptors) in uniform registers, instead of a 64-bit add
        and two R2UR per wgmma ahead of it."""
        warp = self._entry_op("shr.u32", tid, Imm(5))
        if not self.async_proxy_reads:
            return warp
        return self._entry_op("shfl.sync.idx.b32", warp, Imm(0), Imm(31), Imm(-1))

    def _entry_op(self, opcode: str, *operands: Any) -> SSAValue:
        saved, self.body = self.body, self.prologue
        try:
            return self.op(opcode, "b32" if not opcode.endswith("64") else "b64", *operands, n=1)  # type: ignore[return-value]
        finally:
            self.body = saved

    def _global_param(self, name: str, gtype: GlobalType, align: int, params: list[tuple[str, str]]) -> GlobalRef:
        params.append((f"{name}_ptr", "u64"))
        raw = self.emit_entry(ptx.ParamOp(f"{name}_ptr", "u64")).results[0]
        saved, self.body = self.body, self.prologue
        try:
            ptr = self.op("cvta.to.global.u64", "b64", raw, n=1)
            dims, strides = [], []
            for d in range(gtype.rank):
                params.append((f"{name}_d{d}", "s32"))
                dims.append(self.emit(ptx.ParamOp(f"{name}_d{d}", "s32")).results[0])
            shift = element_bytes(gtype.element_type).bit_length() - 1
            for d in range(gtype.rank):
                params.append((f"{name}_s{d}", "s64"))
                stride = self.emit(ptx.ParamOp(f"{name}_s{d}", "s64")).results[0]
                strides.append(self.op("shl.b64", "b64", stride, Imm(shift), n=1))
        finally:
            self.body = saved
        return GlobalRef(ptr, dims, strides, gtype, align)  # type: ignore[arg-type]

    # --------------------------------------------------------------------------------------------------------
    # Ops

    def lower_block(self, block: Block) -> None:
        """Lower a block's ops; a terminating `scf.yield` is left to the loop or `if` that owns the block."""
        for op in block.ops:
            if isinstance(op, scf.YieldOp):
                continue
            self.current_loc = op.location
            try:
                self.lower_op(op)
            except TkcError as e:
                if e.loc is None:
                    e.loc = SourceLoc.from_attr(op.location)
                raise

    def lower_op(self, op: Operation) -> None:
        handler = _HANDLERS.get(type(op))
        if handler is None:
            for cls, h in _BASE_HANDLERS:
                if isinstance(op, cls):
                    handler = h
                    break
        if handler is None:
            raise TkcError(f"lower-to-ptx: no lowering for {op.name}")
        results = handler(self, op)
        if results is not None:
            for r, v in zip(op.results, results):
                self.values[r] = v

    def value(self, v: SSAValue) -> Any:
        return self.values[v]


def _count(operands: tuple[Any, ...], into: Any) -> int:
    if into is not None:
        return ptx.count_of(into)
    counts = [ptx.count_of(o) for o in operands if isinstance(o, SSAValue)]
    return max(counts) if counts else 1


def _imm_text(value: Imm) -> str:
    if isinstance(value.value, bool):
        return "1" if value.value else "0"
    if isinstance(value.value, float):
        return ptx.format_immediate(value.value)
    if value.cls == "b64" and int(value.value) >= 1 << 63:
        return str(int(value.value) - (1 << 64))  # the same 64 bits as a signed literal
    return str(int(value.value))


def _log2(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v & (v - 1):
        return None
    return v.bit_length() - 1


def argument_aligns(fn: func.FuncOp) -> list[int]:
    """Per argument, the bytes that divide a tensor's address, strides and row length (ALIGN_ATTR, set by a
    specialization; DEFAULT_ALIGN without one)."""
    n = len(fn.body.block.args)
    attr = fn.attributes.get(ALIGN_ATTR)
    if isinstance(attr, ArrayAttr):
        return [x.value.data for x in attr.data]  # type: ignore[attr-defined]
    return [DEFAULT_ALIGN] * n


def _division_magic(divisor: int) -> tuple[int, int] | None:
    """(m, l) with x // divisor == (x · m) >> (32 + l) for every u32 x and m < 2^32, or None (then div.u32)."""
    if not isinstance(divisor, int) or isinstance(divisor, bool) or divisor <= 1:
        return None
    for extra in range(divisor.bit_length()):
        m = -(-(1 << (32 + extra)) // divisor)
        if m < 1 << 32 and m * divisor - (1 << (32 + extra)) <= 1 << extra:
            return m, extra
    return None


def _udiv_by_constant(lw: KernelLowering, a: SSAValue, divisor: int, remainder: bool = False) -> SSAValue | None:
    """a // divisor (or a % divisor) for u32 a without a division: a shift or mask, or a multiply-high by a magic
    number (ptxas divides a ring index by 3 through a float reciprocal, ~15 instructions before each mbarrier wait).
    None when neither applies."""
    shift = _log2(divisor)
    if shift is not None:
        return lw.op("and.b32", "b32", a, Imm(divisor - 1)) if remainder else lw.op("shr.u32", "b32", a, Imm(shift))
    magic = _division_magic(divisor)
    if magic is None:
        return None
    m, extra = magic
    quotient = lw.op("mul.hi.u32", "b32", a, Imm(m))
    if extra:
        quotient = lw.op("shr.u32", "b32", quotient, Imm(extra))
    return lw.op("mad.lo.s32", "b32", quotient, Imm(-divisor), a) if remainder else quotient


# ------------------------------------------------------------------------------------------------------------
# Dispatch: each handler module registers its ops' handlers here

_HANDLERS: dict[type, Callable[..., Any]] = {}
_BASE_HANDLERS: list[tuple[type, Callable[..., Any]]] = []


def handles(*op_types: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op_type in op_types:
            if "name" not in op_type.__dict__:  # a base class such as tile.UnaryOp
                _BASE_HANDLERS.append((op_type, fn))
            else:
                _HANDLERS[op_type] = fn
        return fn

    return add


# scalars, control flow and barriers register at once (compute, memory and TMA when lower-to-ptx first runs)
from tkc.backend import lower_control, lower_scalars  # noqa: E402,F401
