"""lower-to-ptx: tile IR (layouts, swizzles and shared offsets assigned) → the `ptx` dialect, one kernel per func.

Per-thread code: every warp runs the function; a register tile becomes the bundle of 32-bit registers its
fragment layout gives each lane (backend/fragments.py), a shared tile the address of its buffer, a global tensor
its pointer, sizes and byte strides (kernel parameters `X_ptr, X_d0.., X_s0..`). `scf.for` / `scf.if` become
labels and uniform branches, their carried values registers written at the back edge. Register-tile compute is in
backend/lower_compute.py, memory in backend/lower_memory.py.

    %e = tile.exp2 %s : !tile.rt<16x64xf32, row>
becomes
    %e = ptx.op "ex2.approx.ftz.f32" (%s) ... : !ptx.regs<b32, 32>      // 32 instructions
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from xdsl.context import Context
from xdsl.dialects import arith, func, math, scf
from xdsl.dialects.builtin import ArrayAttr, Float32Type, FloatAttr, IntegerAttr, ModuleOp, StringAttr, i1
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass

from tkc.backend import ptx
from tkc.backend.index import Const, Expr, Leaf
from tkc.errors import SourceLoc, TkcError
from tkc.ir import async_ops as a
from tkc.ir import ops as t
from tkc.ir.types import GlobalType, RegTileType, element_bytes
from tkc.passes import register
from tkc.passes.allocate_shared import TOTAL_ATTR
from tkc.passes.util import constant_int
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
        aligns = _aligns(fn)
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


def _aligns(fn: func.FuncOp) -> list[int]:
    n = len(fn.body.block.args)
    attr = fn.attributes.get(ALIGN_ATTR)
    if isinstance(attr, ArrayAttr):
        return [x.value.data for x in attr.data]  # type: ignore[attr-defined]
    return [DEFAULT_ALIGN] * n


# ------------------------------------------------------------------------------------------------------------
# Scalars: arith, math, indices

_INT_OPS = {
    arith.AddiOp: "add.s32",
    arith.SubiOp: "sub.s32",
    arith.MuliOp: "mul.lo.s32",
    arith.DivSIOp: "div.s32",
    arith.RemSIOp: "rem.s32",
    arith.DivUIOp: "div.u32",
    arith.RemUIOp: "rem.u32",
    arith.MaxSIOp: "max.s32",
    arith.MinSIOp: "min.s32",
    arith.ShLIOp: "shl.b32",
    arith.ShRSIOp: "shr.s32",
    arith.AndIOp: "and.b32",
    arith.OrIOp: "or.b32",
    arith.XOrIOp: "xor.b32",
}
_FLOAT_OPS = {
    arith.AddfOp: "add.f32",
    arith.SubfOp: "sub.f32",
    arith.MulfOp: "mul.f32",
    arith.DivfOp: "div.rn.f32",
    arith.MaximumfOp: "max.f32",
    arith.MinimumfOp: "min.f32",
}
_FLOAT_UNARY = {
    arith.NegfOp: "neg.f32",
    math.Exp2Op: "ex2.approx.ftz.f32",
    math.Log2Op: "lg2.approx.ftz.f32",
    math.SqrtOp: "sqrt.rn.f32",
    math.RsqrtOp: "rsqrt.approx.ftz.f32",
    math.TanhOp: "tanh.approx.f32",
    math.AbsFOp: "abs.f32",
    math.AbsIOp: "abs.s32",
}
_CMP = {"eq": "eq", "ne": "ne", "slt": "lt", "sle": "le", "sgt": "gt", "sge": "ge",
        "oeq": "eq", "une": "neu", "olt": "lt", "ole": "le", "ogt": "gt", "oge": "ge"}


def _wrap32(value: int) -> int:
    return (value + 2**31) % 2**32 - 2**31


_INT_FOLD: dict[type, Callable[[int, int], int]] = {
    arith.AddiOp: lambda a, b: a + b,
    arith.SubiOp: lambda a, b: a - b,
    arith.MuliOp: lambda a, b: a * b,
    arith.FloorDivSIOp: lambda a, b: a // b,
    arith.CeilDivSIOp: lambda a, b: -(-a // b),
    arith.DivSIOp: lambda a, b: int(a / b),
    arith.RemSIOp: lambda a, b: a - int(a / b) * b,
    arith.DivUIOp: lambda a, b: (a % 2**32) // (b % 2**32),
    arith.RemUIOp: lambda a, b: (a % 2**32) % (b % 2**32),
    arith.MaxSIOp: max,
    arith.MinSIOp: min,
    arith.ShLIOp: lambda a, b: a << b,
    arith.ShRSIOp: lambda a, b: a >> b,
    arith.AndIOp: lambda a, b: a & b,
    arith.OrIOp: lambda a, b: a | b,
    arith.XOrIOp: lambda a, b: a ^ b,
}
_FLOAT_FOLD: dict[type, Callable[[Any, Any], Any]] = {
    arith.AddfOp: lambda a, b: a + b,
    arith.SubfOp: lambda a, b: a - b,
    arith.MulfOp: lambda a, b: a * b,
    arith.DivfOp: lambda a, b: a / b,
    arith.MaximumfOp: lambda a, b: np.fmax(a, b),
    arith.MinimumfOp: lambda a, b: np.fmin(a, b),
}


def _fold_int(op: Operation, a: int, b: int) -> int | None:
    fn = _INT_FOLD.get(type(op))
    if fn is None or (b == 0 and type(op) in (arith.FloorDivSIOp, arith.CeilDivSIOp, arith.DivSIOp, arith.RemSIOp,
                                              arith.DivUIOp, arith.RemUIOp)):
        return None
    return _wrap32(fn(a, b))


def _lower_constant(lw: KernelLowering, op: arith.ConstantOp) -> list[Any]:
    value = op.value
    if isinstance(value, IntegerAttr):
        if value.type == i1:
            return [Imm(bool(value.value.data), "pred")]
        return [Imm(int(value.value.data))]
    if isinstance(value, FloatAttr):
        return [Imm(float(value.value.data))]
    raise TkcError(f"cannot lower constant {value}")


def _lower_int(lw: KernelLowering, op: Operation) -> list[Any]:
    a, b = (lw.value(o) for o in op.operands)
    if op.results[0].type == i1:
        if isinstance(a, Imm) and isinstance(b, Imm):
            fn = {arith.AndIOp: lambda x, y: x and y, arith.OrIOp: lambda x, y: x or y, arith.XOrIOp: lambda x, y: x != y}
            return [Imm(bool(fn[type(op)](a.value, b.value)), "pred")]
        opcode = {arith.AndIOp: "and.pred", arith.OrIOp: "or.pred", arith.XOrIOp: "xor.pred"}[type(op)]
        return [lw.op(opcode, "pred", lw.reg(a, "pred") if isinstance(a, Imm) else a, b)]
    if isinstance(a, Imm) and isinstance(b, Imm):
        folded = _fold_int(op, int(a.value), int(b.value))
        if folded is not None:
            return [Imm(folded)]
    if isinstance(op, arith.FloorDivSIOp):
        shift = _log2(b.value) if isinstance(b, Imm) else None
        if shift is not None:
            return [lw.op("shr.s32", "b32", lw.reg(a), Imm(shift))]
        if not isinstance(b, Imm) and non_negative(op.operands[0]) and non_negative(op.operands[1]):
            return [lw.op("div.u32", "b32", lw.reg(a), b)]  # a tile index by a count: no sign fix-ups
        return [_floordiv(lw, lw.reg(a), b)]
    if isinstance(op, arith.CeilDivSIOp):
        if isinstance(b, Imm) and b.value > 0:
            shifted = lw.op("add.s32", "b32", lw.reg(a), Imm(b.value - 1))
            shift = _log2(b.value)
            if shift is not None:
                return [lw.op("shr.s32", "b32", shifted, Imm(shift))]
            return [_floordiv(lw, shifted, b)]
        neg = lw.op("neg.s32", "b32", lw.reg(a))
        return [lw.op("neg.s32", "b32", _floordiv(lw, neg, b))]
    if isinstance(op, arith.DivUIOp | arith.RemUIOp) and isinstance(b, Imm):
        divided = _udiv_by_constant(lw, lw.reg(a), b.value, remainder=isinstance(op, arith.RemUIOp))
        if divided is not None:
            return [divided]
    return [lw.op(_INT_OPS[type(op)], "b32", lw.reg(a), b)]


_NON_NEGATIVE_OPS = (t.BlockIdxOp, t.NumBlocksOp, t.DimOp, t.WarpIdOp, t.WarpgroupIdOp, t.ClusterRankOp)
_CLOSED_OPS = (arith.AddiOp, arith.MuliOp, arith.FloorDivSIOp, arith.CeilDivSIOp, arith.DivUIOp, arith.RemUIOp,
               arith.MinSIOp)  # non-negative when all their operands are


def non_negative(value: SSAValue, depth: int = 0) -> bool:
    """Is this i32 value never negative: built from grid indices and counts, tensor sizes and non-negative
    constants by +, ·, division, % and min, or the index of a loop from a non-negative start by a positive step? Then
    Python's floor division by it is an unsigned one (a persistent kernel's tile index by its query blocks)."""
    if depth > 32:
        return False
    owner = value.owner
    if isinstance(owner, Block):
        loop = owner.parent_op()
        return (isinstance(loop, scf.ForOp) and value is owner.args[0] and non_negative(loop.lb, depth + 1)
                and non_negative(loop.step, depth + 1))
    if isinstance(owner, arith.ConstantOp):
        return (constant_int(value) or 0) >= 0
    if isinstance(owner, _NON_NEGATIVE_OPS):
        return True
    if isinstance(owner, arith.MaxSIOp):
        return any(non_negative(v, depth + 1) for v in owner.operands)
    if isinstance(owner, arith.SubiOp):  # Python's a % b as the frontend spells it, a - (a // b)·b: of a, b ≥ 0
        product = owner.rhs.owner
        quotient = product.lhs.owner if isinstance(product, arith.MuliOp) else None
        return (isinstance(quotient, arith.FloorDivSIOp) and quotient.lhs is owner.lhs
                and quotient.rhs is product.rhs and non_negative(owner.lhs, depth + 1)
                and non_negative(quotient.rhs, depth + 1))
    return isinstance(owner, _CLOSED_OPS) and all(non_negative(v, depth + 1) for v in owner.operands)


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


def _floordiv(lw: KernelLowering, a: SSAValue, b: Any) -> SSAValue:
    """Python's floor division on s32: truncate, then step down when the remainder's sign differs."""
    q = lw.op("div.s32", "b32", a, b)
    r = lw.op("rem.s32", "b32", a, b)
    nonzero = lw.op("setp.ne.s32", "pred", r, Imm(0))
    sign = lw.op("xor.b32", "b32", r, b)
    negative = lw.op("setp.lt.s32", "pred", sign, Imm(0))
    adjust = lw.op("and.pred", "pred", nonzero, negative)
    return lw.op("selp.b32", "b32", lw.op("sub.s32", "b32", q, Imm(1)), q, adjust)


def _lower_float(lw: KernelLowering, op: Operation) -> list[Any]:
    a, b = (lw.value(o) for o in op.operands)
    if isinstance(a, Imm) and isinstance(b, Imm):
        with np.errstate(all="ignore"):
            return [Imm(float(np.float32(_FLOAT_FOLD[type(op)](np.float32(a.value), np.float32(b.value)))))]
    if isinstance(op, arith.DivfOp) and isinstance(b, Imm) and b.value and np.frexp(b.value)[0] in (0.5, -0.5):
        return [lw.op("mul.f32", "b32", lw.reg(a), Imm(1.0 / b.value))]  # by a power of two: exact, and no slow path
    return [lw.op(_FLOAT_OPS[type(op)], "b32", lw.reg(a), b)]


def _lower_float_unary(lw: KernelLowering, op: Operation) -> list[Any]:
    x = lw.reg(lw.value(op.operands[0]))
    if isinstance(op, math.ExpOp):
        return [lw.op("ex2.approx.ftz.f32", "b32", lw.op("mul.f32", "b32", x, Imm(LOG2E)))]
    if isinstance(op, math.LogOp):
        return [lw.op("mul.f32", "b32", lw.op("lg2.approx.ftz.f32", "b32", x), Imm(LN2))]
    return [lw.op(_FLOAT_UNARY[type(op)], "b32", x)]


def _lower_cmp(lw: KernelLowering, op: arith.CmpiOp | arith.CmpfOp) -> list[Any]:
    a, b = (lw.value(o) for o in op.operands)
    names = arith.CMPI_COMPARISON_OPERATIONS if isinstance(op, arith.CmpiOp) else arith.CMPF_COMPARISON_OPERATIONS
    pred = names[op.predicate.value.data]
    if pred not in _CMP:
        raise TkcError(f"comparison {pred} is not supported")
    if isinstance(op, arith.CmpiOp) and op.lhs.type == i1:
        if pred not in ("eq", "ne"):
            raise TkcError("booleans compare only with == and !=")
        x = lw.op("xor.pred", "pred", lw.reg(a, "pred"), lw.reg(b, "pred"))
        return [x if pred == "ne" else lw.op("not.pred", "pred", x)]
    kind = "s32" if isinstance(op, arith.CmpiOp) else "f32"
    return [lw.op(f"setp.{_CMP[pred]}.{kind}", "pred", lw.reg(a), b)]


def _lower_select(lw: KernelLowering, op: arith.SelectOp) -> list[Any]:
    c, x, y = (lw.value(o) for o in op.operands)
    if isinstance(c, Imm):
        return [x if c.value else y]
    if op.result.type == i1:
        return [lw.op("or.pred", "pred", lw.op("and.pred", "pred", c, lw.reg(x, "pred")),
                      lw.op("and.pred", "pred", lw.op("not.pred", "pred", c), lw.reg(y, "pred")))]
    return [lw.op("selp.b32", "b32", lw.reg(x), lw.reg(y), c)]


def _lower_sitofp(lw: KernelLowering, op: arith.SIToFPOp) -> list[Any]:
    x = lw.value(op.input)
    if isinstance(x, Imm):
        return [Imm(float(x.value))]
    return [lw.op("cvt.rn.f32.s32", "b32", x)]


def _lower_fptosi(lw: KernelLowering, op: arith.FPToSIOp) -> list[Any]:
    return [lw.op("cvt.rzi.s32.f32", "b32", lw.reg(lw.value(op.input)))]


def _lower_special(name: str) -> Callable[[KernelLowering, Operation], list[Any]]:
    def lower(lw: KernelLowering, op: Operation) -> list[Any]:
        dim = "xyz"[op.dim.value.data]  # type: ignore[attr-defined]
        return [lw.emit(ptx.SpecialOp(f"%{name}.{dim}")).results[0]]

    return lower


def _lower_warp_id(lw: KernelLowering, op: Operation) -> list[Any]:
    return [lw.thread_env["warp"]]


def cluster_rank(lw: KernelLowering) -> Any:
    """This block's rank in its cluster (`%cluster_ctarank`, read once at entry); 0 without clusters."""
    if lw.cluster == 1:
        return Imm(0)
    return lw.at_entry("cluster_rank", lambda: lw.emit(ptx.SpecialOp("%cluster_ctarank")).results[0])


def _lower_cluster_rank(lw: KernelLowering, op: Operation) -> list[Any]:
    return [cluster_rank(lw)]


def _lower_warpgroup_id(lw: KernelLowering, op: Operation) -> list[Any]:
    return [lw.expr(Leaf("warp") >> 2)]  # from the broadcast warp index: warp-uniform to ptxas


def _lower_dim(lw: KernelLowering, op: t.DimOp) -> list[Any]:
    return [lw.value(op.source).dims[op.index.value.data]]


def _lower_barrier(lw: KernelLowering, op: Operation) -> None:
    if lw.async_proxy_reads:
        # wgmma reads shared memory through the async proxy: what threads wrote (st.shared, cp.async) must be
        # fenced toward it before the barrier that publishes it
        lw.emit(ptx.FenceOp("proxy.async.shared::cta"))
    if lw.role_threads is not None and lw.role_threads != lw.threads:
        # one role of a warp-specialized block: a named barrier of its own threads (1: consumers, 2: producer)
        lw.emit(ptx.BarSyncOp(1 if lw.role_threads == 32 * lw.consumer_warps else 2, lw.role_threads))
    else:
        lw.emit(ptx.BarSyncOp(0))


TURN_BARRIER = 3  # warpgroup 0 waits for its turn at named barrier 3, warpgroup 1 at 4 (1 and 2: warp roles)


def _turn_barriers(lw: KernelLowering) -> tuple[Any, Any]:
    """(the barrier this warpgroup waits at for its turn, the one the other warpgroup waits at)."""
    mine = lw.op("add.u32", "b32", lw.op("and.b32", "b32", lw.expr(Leaf("warp") >> 2), Imm(1)), Imm(TURN_BARRIER))
    return mine, lw.op("xor.b32", "b32", mine, Imm(TURN_BARRIER ^ (TURN_BARRIER + 1)))


def _lower_turn_wait(lw: KernelLowering, op: Operation) -> None:
    barrier = _turn_barriers(lw)[0]
    following = op.next_op
    if isinstance(following, t.WgmmaOp) and isinstance(following.a.type, RegTileType):
        # ptxas sinks the work that computes the wgmma's register operand (attention's softmax) past a bar.sync,
        # into the turn, where nothing hides it (bench/sass_order.py). A barrier number computed from those
        # registers keeps it before the wait; the added term is always 0.
        barrier = lw.op("add.u32", "b32", barrier, _zero_from(lw, lw.reg(lw.value(following.a))))
    lw.emit(ptx.BarSyncOp(barrier, 256))


def _lower_wgmma_wait(lw: KernelLowering, op: t.WgmmaWaitOp) -> None:
    """`wgmma.wait_group N`. One with work between it and the last wgmma (defer-wgmma's wait for P·V, after the
    softmax) starts a basic block of its own: ptxas moves a wgmma wait up to the top of its block, ahead of the
    work it should overlap (bench/sass_order.py shows it). A branch on a warp-uniform value ptxas cannot fold
    (whether this is block 0), with the same wait on both sides, keeps it where it is."""
    pending = op.pending.value.data
    if op.prev_op is None or isinstance(op.prev_op, t.WgmmaOp | t.TurnPassOp):
        lw.emit(ptx.WgmmaSyncOp("wait", pending))
        return
    first_block = lw.at_entry("first_block", lambda: lw.op("setp.eq.u32", "pred", lw.emit(
        ptx.SpecialOp("%ctaid.x")).results[0], Imm(0)))
    other, waited = lw.label("WAIT"), lw.label("WAITED")
    lw.emit(ptx.BraOp(other, first_block))
    lw.emit(ptx.WgmmaSyncOp("wait", pending))
    lw.emit(ptx.BraOp(waited))
    lw.emit(ptx.LabelOp(other))
    lw.emit(ptx.WgmmaSyncOp("wait", pending))
    lw.emit(ptx.LabelOp(waited))


def _zero_from(lw: KernelLowering, bundle: SSAValue) -> SSAValue:
    """0, computed from every register of `bundle` so that ptxas cannot see it is: the popc of their OR is at most
    32, and 32 >> 6 is 0."""
    folded, count = bundle, bundle.type.n  # type: ignore[attr-defined]
    while count > 1 and count % 2 == 0:  # a tree of ORs while the count halves evenly
        count //= 2
        folded = lw.op("or.b32", "b32", (folded, np.arange(count)), (folded, np.arange(count, 2 * count)), n=count)
    acc = lw.op("mov.b32", "b32", (folded, np.array([0])), n=1)
    for i in range(1, count):  # then a chain over what is left
        acc = lw.op("or.b32", "b32", acc, (folded, np.array([i])), n=1)
    return lw.op("shr.u32", "b32", lw.op("popc.b32", "b32", acc), Imm(6))


def _lower_turn_pass(lw: KernelLowering, op: Operation) -> None:
    if op not in lw.passed_at_commit:
        lower_turn_pass_now(lw)


def lower_turn_pass_now(lw: KernelLowering) -> None:
    lw.emit(ptx.BarSyncOp(_turn_barriers(lw)[1], 256, arrive=True))


PRODUCER_REGISTERS = 40  # per thread, after setmaxnreg.dec: address arithmetic and the TMA issue only
LEAN_PRODUCER_REGISTERS = 24  # setmaxnreg's least


def _role_registers(lw: KernelLowering) -> tuple[int, int] | None:
    """(producer, consumer) registers per thread for setmaxnreg, from what ptxas gives each thread at entry
    (65536 / threads / blocks per SM, rounded down to 8): the producer's surplus goes to the consumers. None with
    a single consumer warpgroup in a block alone on its SM (it has all the registers it may use already)."""
    per_sm = lw.fn.attributes.get("tkc.blocks_per_sm")
    blocks = per_sm.value.data if isinstance(per_sm, IntegerAttr) else 1
    if lw.threads < 384 and blocks == 1:
        return None
    entry = 65536 // blocks // lw.threads // 8 * 8
    consumers = lw.threads - 128
    # three consumer warpgroups need every register; two may ask for them (producer=2)
    lean = lw.threads > 384 or "tkc.lean_producer" in lw.fn.attributes
    producer = LEAN_PRODUCER_REGISTERS if lean else PRODUCER_REGISTERS
    grown = min(256, entry + (entry - producer) * 128 // consumers) // 8 * 8
    return producer, grown


# ------------------------------------------------------------------------------------------------------------
# Control flow


def _copy_into(lw: KernelLowering, dst: Any, src: Any) -> None:
    """dst (a declared bundle) := src, register for register."""
    if src is dst:
        return
    if isinstance(dst, SSAValue) and isinstance(dst.type, ptx.RegsType):
        cls = dst.type.reg_class
        if cls == "pred":
            lw.op("mov.pred", None, lw.reg(src, "pred") if isinstance(src, Imm) else src, into=dst)
        else:
            lw.op("mov.b32" if cls == "b32" else "mov.b64", None, src, into=dst)
        return
    raise TkcError("internal: cannot copy a value of this kind across a loop or branch")


def _declare_like(lw: KernelLowering, value: Any, type_: Any) -> Any:
    """Registers that a loop or branch writes its results into."""
    if isinstance(value, SharedRef | RingRef | GlobalRef):
        return value  # buffers stay where they are; their addresses do not change
    if isinstance(value, Imm):
        cls = "pred" if value.cls == "pred" else "b32"
        return lw.emit(ptx.RegsOp(cls, 1)).results[0]
    return lw.emit(ptx.RegsOp(value.type.reg_class, value.type.n)).results[0]


def _same_buffer(a_: Any, b_: Any) -> bool:
    return isinstance(a_, SharedRef | RingRef) and isinstance(b_, SharedRef | RingRef) and a_.addr is b_.addr


def _lower_for(lw: KernelLowering, op: scf.ForOp) -> list[Any]:
    lb, ub, step = (lw.value(v) for v in (op.lb, op.ub, op.step))
    body = op.body.block
    iv = lw.emit(ptx.RegsOp("b32", 1)).results[0]
    _copy_into(lw, iv, lb)
    carried = []
    for init, arg in zip(op.iter_args, body.args[1:]):
        value = lw.value(init)
        regs = _declare_like(lw, value, init.type)
        if regs is not value:
            _copy_into(lw, regs, value)
        carried.append(regs)
    lw.values[body.args[0]] = iv
    for arg, regs in zip(body.args[1:], carried):
        lw.values[arg] = regs
    head, end = lw.label("LOOP"), lw.label("END")
    lw.emit(ptx.LabelOp(head))
    done = lw.op("setp.ge.s32", "pred", iv, ub)
    lw.emit(ptx.BraOp(end, done))
    lw.lower_block(body)
    yield_op = body.last_op
    assert isinstance(yield_op, scf.YieldOp)
    new = [lw.value(v) for v in yield_op.operands]
    # Parallel copy: a yielded value that is itself a carried bundle must be read before it is overwritten.
    staged = []
    for regs, value in zip(carried, new):
        if any(value is other for other in carried) and value is not regs:
            tmp = _declare_like(lw, value, None)
            _copy_into(lw, tmp, value)
            staged.append(tmp)
        else:
            staged.append(value)
    for regs, value in zip(carried, staged):
        if isinstance(regs, SharedRef | RingRef):
            if not _same_buffer(regs, value):
                raise TkcError("a loop-carried shared tile must stay in one buffer")
            continue
        _copy_into(lw, regs, value)
    lw.op("add.s32", None, iv, step, into=iv)
    lw.emit(ptx.BraOp(head))
    lw.emit(ptx.LabelOp(end))
    if op in lw.wgmma_loops:
        lw.emit(ptx.WgmmaSyncOp("wait", 0))  # the last step's wgmma, before anything reads the accumulator
    return carried


def _predicable(op: scf.IfOp) -> bool:
    """An if without results whose branch only computes integers and starts async copies (the pipeline's
    prefetch) or releases a stage: it becomes straight-line code with predicated copies, which ptxas can interleave with the
    tensor-core work around it (a branch would keep the copies' address arithmetic in a block of its own)."""
    from tkc.ir import tma_ops as m

    if op.results or (op.false_region.blocks and len(op.false_region.block.ops) > 1):
        return False
    return all(isinstance(o, a.CopyAsyncOp | m.StageReleaseOp | scf.YieldOp) or o.name.startswith("arith.")
               for o in op.true_region.block.ops)


def _lower_if(lw: KernelLowering, op: scf.IfOp) -> list[Any]:
    cond = lw.value(op.cond)
    if isinstance(cond, Imm):
        region = op.true_region if cond.value else op.false_region
        if not region.blocks:
            return []
        lw.lower_block(region.block)
        return [lw.value(v) for v in region.block.last_op.operands]  # type: ignore[union-attr]
    if _predicable(op):
        saved = lw.guard
        lw.guard = cond if saved is None else lw.op("and.pred", "pred", saved, cond, n=1)
        try:
            lw.lower_block(op.true_region.block)
        finally:
            lw.guard = saved
        return []
    results: list[Any] = [None] * len(op.results)
    else_label, end = lw.label("ELSE"), lw.label("ENDIF")
    lw.emit(ptx.BraOp(else_label, cond, negate=True))

    role = "tkc.warp_role" in op.attributes  # then: the producer warpgroup, else: the consumer warps
    registers = _role_registers(lw) if role else None

    def branch(region: Any) -> None:
        if not region.blocks:
            return
        producer = region is op.true_region
        saved = lw.role_threads
        if role:
            lw.role_threads = 128 if producer else 32 * lw.consumer_warps
            if registers is not None:
                lw.emit(ptx.SetmaxnregOp(not producer, registers[0] if producer else registers[1]))
        try:
            lw.lower_block(region.block)
        finally:
            lw.role_threads = saved
        for i, v in enumerate(region.block.last_op.operands):
            value = lw.value(v)
            if results[i] is None:
                results[i] = _declare_like(lw, value, v.type)
                # declarations must dominate both branches: move it before the branch
                if isinstance(results[i], SSAValue):
                    decl = results[i].owner
                    lw.body.remove(decl)
                    lw.body.insert(branch_point, decl)
            if isinstance(results[i], SharedRef | RingRef):
                if not _same_buffer(results[i], value):
                    raise TkcError("both branches of an if must yield a shared tile in the same buffer")
                continue
            _copy_into(lw, results[i], value)

    branch_point = len(lw.body) - 1
    branch(op.true_region)
    lw.emit(ptx.BraOp(end))
    lw.emit(ptx.LabelOp(else_label))
    branch(op.false_region)
    lw.emit(ptx.LabelOp(end))
    return results


def _lower_return(lw: KernelLowering, op: func.ReturnOp) -> None:
    if lw.tma_stores:
        lw.emit(ptx.BulkGroupOp("wait", 0))  # TMA stores read the block's shared memory until they complete
    if lw.cluster > 1:  # the blocks of a cluster exit together: a peer may still signal this block's barriers
        lw.emit(ptx.ClusterBarrierOp("arrive"))
        lw.emit(ptx.ClusterBarrierOp("wait"))
    lw.emit(ptx.RetOp())


# ------------------------------------------------------------------------------------------------------------
# Dispatch tables (compute and memory handlers register themselves here)

_HANDLERS: dict[type, Callable[..., Any]] = {
    arith.ConstantOp: _lower_constant,
    arith.CmpiOp: _lower_cmp,
    arith.CmpfOp: _lower_cmp,
    arith.SelectOp: _lower_select,
    arith.SIToFPOp: _lower_sitofp,
    arith.FPToSIOp: _lower_fptosi,
    arith.FloorDivSIOp: _lower_int,
    arith.CeilDivSIOp: _lower_int,
    math.ExpOp: _lower_float_unary,
    math.LogOp: _lower_float_unary,
    t.BlockIdxOp: _lower_special("ctaid"),
    t.NumBlocksOp: _lower_special("nctaid"),
    t.WarpIdOp: _lower_warp_id,
    t.WarpgroupIdOp: _lower_warpgroup_id,
    t.ClusterRankOp: _lower_cluster_rank,
    t.DimOp: _lower_dim,
    t.BarrierOp: _lower_barrier,
    t.TurnWaitOp: _lower_turn_wait,
    t.TurnPassOp: _lower_turn_pass,
    t.WgmmaWaitOp: _lower_wgmma_wait,
    scf.ForOp: _lower_for,
    scf.IfOp: _lower_if,
    func.ReturnOp: _lower_return,
}
for _op in _INT_OPS:
    _HANDLERS[_op] = _lower_int
for _op in _FLOAT_OPS:
    _HANDLERS[_op] = _lower_float
for _op in _FLOAT_UNARY:
    _HANDLERS[_op] = _lower_float_unary
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


def lower_module(module: ModuleOp) -> None:
    """Replace every kernel's tile IR with its `ptx.kernel`."""
    import tkc.backend.lower_compute  # noqa: F401  (registers handlers)
    import tkc.backend.lower_memory  # noqa: F401
    import tkc.backend.lower_tma  # noqa: F401

    target_attr = module.attributes.get("tkc.target")
    target = get_target(target_attr.data if isinstance(target_attr, StringAttr) else "sm_90a").name
    kernels = []
    for fn in list(module.ops):
        if isinstance(fn, func.FuncOp):
            kernel = KernelLowering(fn, target).run()
            kernel.attributes["tkc.smem_bytes"] = IntegerAttr(fn.attributes[TOTAL_ATTR].value.data  # type: ignore[attr-defined]
                                                              if TOTAL_ATTR in fn.attributes else 0, 64)
            kernels.append((fn, kernel))
    for fn, kernel in kernels:
        module.body.block.insert_op_before(kernel, fn)
        fn.detach()
        fn.erase()


@register("lower-to-ptx", "lower tile IR (layouts, swizzles and shared offsets assigned) to the ptx dialect")
class LowerToPtx(ModulePass):
    name = "lower-to-ptx"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        lower_module(op)

