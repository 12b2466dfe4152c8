"""A CPU simulation of the `ptx` dialect: the oracle for lowering.

It runs a kernel block by block, warp by warp, with every lane's registers (numpy arrays of raw bits, one row per
lane), global tensors as bytes at made-up addresses (an access outside them is an error: an illegal address on
the GPU), and shared memory as bytes. Instruction semantics come from the PTX ISA, written here independently of
the lowering: the mma.m16n8k16 and ldmatrix fragment layouts below are the ISA's, not fragments.py's.

* `cp.async` reads its source when issued, but its bytes land in shared memory only at the issuing thread's
  `cp.async.wait_group` that covers its group; until then the destination keeps its old (poisoned) bytes.
* Warps run one at a time up to the next `bar.sync`, in an order that tests vary (ascending, descending,
  shuffled), so a missing barrier shows up as a read of data another warp has not written yet.
* Branches must be uniform across a warp; all warps must meet at every `bar.sync`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from tkc.backend import ptx
from tkc.errors import SourceLoc, TkcError

LANES = 32
GLOBAL_SPACING = 1 << 32  # each tensor lives at its own 4 GiB-aligned made-up address
POISON = 0xFF  # shared memory and fresh registers start as 0xFF bytes (NaN in every float format)


class SimulationError(TkcError):
    pass


# --------------------------------------------------------------------------------------------------------------
# Bits ↔ values


def f32(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def bits32(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def s32(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.int32).astype(np.int64)


def u32(values: np.ndarray) -> np.ndarray:
    return (np.asarray(values, dtype=np.int64) & 0xFFFFFFFF).astype(np.uint32)


def s64(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint64).view(np.int64)


def u64(values: np.ndarray) -> np.ndarray:
    return np.asarray(values).astype(np.int64).view(np.uint64)


def bf16_bits(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)


def f16_bits(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return ((np.asarray(bits, dtype=np.uint32) & 0xFFFF) << 16).view(np.float32)


def from_f16(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint32) & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)


def parse_immediate(text: str) -> int | float:
    if text.startswith("0f"):
        return float(np.uint32(int(text[2:], 16)).view(np.float32))
    return int(text, 0)


# --------------------------------------------------------------------------------------------------------------
# Memory


@dataclass
class GlobalMemory:
    buffers: list[np.ndarray] = field(default_factory=list)  # uint8 views of the tensors

    def add(self, data: np.ndarray) -> int:
        self.buffers.append(data)
        return GLOBAL_SPACING * len(self.buffers)

    def locate(self, addr: np.ndarray, nbytes: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        addr = np.asarray(addr, dtype=np.uint64).astype(np.int64)
        if (addr % nbytes).any():
            raise SimulationError(f"{what}: misaligned global access of {nbytes} bytes at {int(addr[addr % nbytes != 0][0]):#x}")
        which = addr // GLOBAL_SPACING - 1
        offset = addr % GLOBAL_SPACING
        for w, o in zip(np.atleast_1d(which), np.atleast_1d(offset)):
            if not 0 <= w < len(self.buffers) or o + nbytes > self.buffers[w].size:
                raise SimulationError(f"{what}: illegal global address {int(w + 1) * GLOBAL_SPACING + int(o):#x} "
                                      f"(outside every tensor)")
        return which, offset

    def read(self, addr: np.ndarray, nbytes: int, what: str) -> np.ndarray:
        """bytes [lane, nbytes] at each lane's address."""
        which, offset = self.locate(addr, nbytes, what)
        out = np.empty((len(which), nbytes), dtype=np.uint8)
        for i, (w, o) in enumerate(zip(which, offset)):
            out[i] = self.buffers[w][o:o + nbytes]
        return out

    def write(self, addr: np.ndarray, data: np.ndarray, what: str) -> None:
        which, offset = self.locate(addr, data.shape[1], what)
        for i, (w, o) in enumerate(zip(which, offset)):
            self.buffers[w][o:o + data.shape[1]] = data[i]


class SharedMemory:
    def __init__(self, nbytes: int):
        self.data = np.full(nbytes, POISON, dtype=np.uint8)

    def _check(self, addr: np.ndarray, nbytes: int, what: str) -> np.ndarray:
        addr = np.asarray(addr, dtype=np.int64)
        if (addr < 0).any() or (addr + nbytes > self.data.size).any():
            raise SimulationError(f"{what}: shared address out of range (allocated {self.data.size} bytes)")
        if (addr % min(nbytes, 16)).any():
            raise SimulationError(f"{what}: misaligned shared access of {nbytes} bytes")
        return addr

    def read(self, addr: np.ndarray, nbytes: int, what: str) -> np.ndarray:
        addr = self._check(addr, nbytes, what)
        return self.data[addr[:, None] + np.arange(nbytes)]

    def write(self, addr: np.ndarray, data: np.ndarray, what: str) -> None:
        addr = self._check(addr, data.shape[1], what)
        self.data[addr[:, None] + np.arange(data.shape[1])] = data


def _bytes_to_words(data: np.ndarray, word: int) -> np.ndarray:
    """[lane, nbytes] → [lane, nbytes / word] little-endian words (zero-extended to 32 bits for 16-bit words)."""
    if word == 2:
        return data.view(np.uint16).astype(np.uint32)
    if word == 4:
        return data.view(np.uint32)
    return data.view(np.uint64)


def _words_to_bytes(words: np.ndarray, word: int) -> np.ndarray:
    if word == 2:
        return (words & 0xFFFF).astype(np.uint16).view(np.uint8).reshape(words.shape[0], -1)
    if word == 4:
        return words.astype(np.uint32).view(np.uint8).reshape(words.shape[0], -1)
    return words.astype(np.uint64).view(np.uint8).reshape(words.shape[0], -1)


# --------------------------------------------------------------------------------------------------------------
# Instruction semantics


_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "neu": lambda a, b: ~np.equal(a, b) | np.isnan(a) | np.isnan(b)}


def _int(bits: np.ndarray, kind: str) -> np.ndarray:
    return s32(bits) if kind in ("s32", "b32") else np.asarray(bits, dtype=np.uint32).astype(np.int64)


def execute(opcode: str, operands: list[np.ndarray]) -> np.ndarray:
    """One instruction over arrays of operand bits (any shape); returns the destination bits."""
    parts = opcode.split(".")
    name, mods, kind = parts[0], parts[1:-1], parts[-1]
    o = operands
    if name == "mov":
        return o[0]
    if name in ("add", "sub", "mul", "div", "rem", "min", "max", "mad", "neg", "abs") and kind in ("s32", "u32"):
        x = [_int(v, kind) for v in o]
        with np.errstate(all="ignore"):
            if name == "add":
                r = x[0] + x[1]
            elif name == "sub":
                r = x[0] - x[1]
            elif name == "mul":
                r = x[0] * x[1]
            elif name == "mad":
                r = x[0] * x[1] + x[2]
            elif name in ("div", "rem"):
                if (x[1] == 0).any():
                    raise SimulationError(f"{opcode}: division by zero")
                q = np.trunc(x[0] / x[1]).astype(np.int64) if kind == "s32" else x[0] // x[1]
                r = q if name == "div" else x[0] - q * x[1]
            elif name == "min":
                r = np.minimum(x[0], x[1])
            elif name == "max":
                r = np.maximum(x[0], x[1])
            elif name == "neg":
                r = -x[0]
            else:
                r = np.abs(x[0])
        return u32(r)
    if kind in ("s64", "u64") and name in ("add", "sub", "mul", "mad"):
        x = [s64(np.asarray(v, dtype=np.uint64)) for v in o]
        r = {"add": lambda: x[0] + x[1], "sub": lambda: x[0] - x[1], "mul": lambda: x[0] * x[1],
             "mad": lambda: x[0] * x[1] + x[2]}[name]()
        return u64(r)
    if name in ("and", "or", "xor", "not"):
        if kind == "pred":
            a_ = np.asarray(o[0], dtype=bool)
            return {"and": lambda: a_ & np.asarray(o[1], dtype=bool), "or": lambda: a_ | np.asarray(o[1], dtype=bool),
                    "xor": lambda: a_ ^ np.asarray(o[1], dtype=bool), "not": lambda: ~a_}[name]()
        dtype = np.uint64 if kind == "b64" else np.uint32
        x = [np.asarray(v).astype(np.int64).astype(dtype) for v in o]
        return {"and": lambda: x[0] & x[1], "or": lambda: x[0] | x[1], "xor": lambda: x[0] ^ x[1], "not": lambda: ~x[0]}[name]()
    if name in ("shl", "shr"):
        amount = np.asarray(o[1]).astype(np.int64)
        if kind == "b64":
            v = np.asarray(o[0], dtype=np.uint64)
            return (v << amount.astype(np.uint64)) if name == "shl" else (v >> amount.astype(np.uint64))
        if name == "shl":
            return u32(np.asarray(o[0]).astype(np.int64) << amount)
        if kind == "s32":
            return u32(s32(o[0]) >> amount)
        return u32(np.asarray(o[0], dtype=np.uint32).astype(np.int64) >> amount)
    if name == "setp":
        cmp, t_ = mods[0], kind
        if t_ == "f32":
            return _CMP[cmp](f32(o[0]), f32(o[1]))
        return _CMP[cmp](_int(o[0], t_), _int(o[1], t_))
    if name == "selp":
        return np.where(np.asarray(o[2], dtype=bool), o[0], o[1])
    if name == "cvta":
        return o[0]
    if name == "cvt":
        return _convert(opcode, mods, kind, o)
    if kind == "f32" or name in ("ex2", "lg2", "rsqrt", "tanh"):
        x = [f32(v) for v in o]
        with np.errstate(all="ignore"):
            r = {
                "add": lambda: x[0] + x[1], "sub": lambda: x[0] - x[1], "mul": lambda: x[0] * x[1],
                "div": lambda: x[0] / x[1], "max": lambda: _fmax(x[0], x[1]), "min": lambda: _fmin(x[0], x[1]),
                "neg": lambda: -x[0], "abs": lambda: np.abs(x[0]), "fma": lambda: x[0] * x[1] + x[2],
                "ex2": lambda: np.exp2(x[0]), "lg2": lambda: np.log2(x[0]), "sqrt": lambda: np.sqrt(x[0]),
                "rsqrt": lambda: 1 / np.sqrt(x[0]), "tanh": lambda: np.tanh(x[0]),
            }[name]()
        return bits32(r)
    if name == "prmt":
        return _prmt(o[0], o[1], o[2])
    raise SimulationError(f"the simulator does not know `{opcode}`")


def _fmax(a_: np.ndarray, b_: np.ndarray) -> np.ndarray:
    """PTX max.f32 returns the non-NaN operand."""
    return np.fmax(a_, b_)


def _fmin(a_: np.ndarray, b_: np.ndarray) -> np.ndarray:
    return np.fmin(a_, b_)


def _prmt(a_: np.ndarray, b_: np.ndarray, selector: np.ndarray) -> np.ndarray:
    a_, b_ = np.asarray(a_, dtype=np.uint32), np.asarray(b_, dtype=np.uint32)
    pool = np.stack([(a_ >> (8 * i)) & 0xFF for i in range(4)] + [(b_ >> (8 * i)) & 0xFF for i in range(4)])
    sel = np.asarray(selector, dtype=np.int64)
    out = np.zeros(np.broadcast_shapes(a_.shape, b_.shape), dtype=np.uint32)
    for i in range(4):
        idx = np.broadcast_to((sel >> (4 * i)) & 0x7, out.shape)
        byte = np.take_along_axis(pool, idx[None], axis=0)[0]
        out |= byte.astype(np.uint32) << (8 * i)
    return out


def _convert(opcode: str, mods: list[str], kind: str, o: list[np.ndarray]) -> np.ndarray:
    # opcode: cvt[.rnd].DST.SRC ; kind = SRC, mods[-1] = DST
    dst, src = mods[-1], kind
    if dst == "s64" and src == "s32":
        return u64(s32(o[0]))
    if dst == "f32" and src == "s32":
        return bits32(s32(o[0]).astype(np.float32))
    if dst == "s32" and src == "f32":
        return u32(np.trunc(f32(o[0])).astype(np.int64))
    if dst == "f32" and src == "f16":
        return bits32(from_f16(o[0]))
    if dst == "f32" and src == "bf16":
        return bits32(from_bf16(o[0]))
    if dst in ("bf16x2", "f16x2") and src == "f32":
        conv = bf16_bits if dst == "bf16x2" else f16_bits
        return (conv(f32(o[0])) << 16) | conv(f32(o[1]))
    if dst in ("bf16", "f16") and src == "f32":
        return (bf16_bits if dst == "bf16" else f16_bits)(f32(o[0]))
    raise SimulationError(f"the simulator does not know `{opcode}`")


# --------------------------------------------------------------------------------------------------------------
# mma.m16n8k16 and ldmatrix, per the PTX ISA (#warp-level-matrix-fragment-mma-16816-float, #ldmatrix)

_G = np.arange(LANES) // 4
_Q = np.arange(LANES) % 4


def _unpack16(words: np.ndarray, dtype: str) -> np.ndarray:
    """[..., n] 32-bit words → [..., 2n] values (low half first)."""
    lo, hi = words & 0xFFFF, words >> 16
    conv = from_bf16 if dtype == "bf16" else from_f16
    return np.stack([conv(lo), conv(hi)], axis=-1).reshape(*words.shape[:-1], -1)


def mma_m16n8k16(a_words: np.ndarray, b_words: np.ndarray, c_bits: np.ndarray, dtype: str) -> np.ndarray:
    """a [32, 4], b [32, 2], c [32, 4] (f32 bits) → d [32, 4] (f32 bits)."""
    a_vals = _unpack16(a_words, dtype)  # a0..a7
    b_vals = _unpack16(b_words, dtype)  # b0..b3
    A = np.zeros((16, 16), dtype=np.float32)
    B = np.zeros((16, 8), dtype=np.float32)
    C = np.zeros((16, 8), dtype=np.float32)
    for i in range(8):
        row = _G + 8 * ((i // 2) % 2)
        col = 2 * _Q + (i % 2) + 8 * (i // 4)
        A[row, col] = a_vals[:, i]
    for i in range(4):
        B[2 * _Q + (i % 2) + 8 * (i // 2), _G] = b_vals[:, i]
    for i in range(4):
        C[_G + 8 * (i // 2), 2 * _Q + (i % 2)] = f32(c_bits[:, i])
    D = A.astype(np.float32) @ B.astype(np.float32) + C
    out = np.zeros((LANES, 4), dtype=np.uint32)
    for i in range(4):
        out[:, i] = bits32(D[_G + 8 * (i // 2), 2 * _Q + (i % 2)])
    return out


def ldmatrix_x4(rows: np.ndarray, trans: bool) -> np.ndarray:
    """rows [32, 16] bytes: the 8×8 16-bit matrix rows supplied by lanes (matrix m ← lanes 8m..8m+7) →
    registers [32, 4]."""
    halves = rows.view(np.uint16).astype(np.uint32)  # [32 (= 4 matrices × 8 rows), 8 cols]
    out = np.zeros((LANES, 4), dtype=np.uint32)
    for m in range(4):
        M = halves[8 * m:8 * m + 8]  # [row, col]
        if trans:
            lo, hi = M[2 * _Q, _G], M[2 * _Q + 1, _G]
        else:
            lo, hi = M[_G, 2 * _Q], M[_G, 2 * _Q + 1]
        out[:, m] = lo | (hi << 16)
    return out


def movmatrix_trans(words: np.ndarray) -> np.ndarray:
    """One 8×8 16-bit matrix in fragment form (lane l: row l/4, cols 2(l%4)..+1) → its transpose, same form."""
    M = np.zeros((8, 8), dtype=np.uint32)
    M[_G, 2 * _Q] = words & 0xFFFF
    M[_G, 2 * _Q + 1] = words >> 16
    T = M.T
    return T[_G, 2 * _Q] | (T[_G, 2 * _Q + 1] << 16)


# --------------------------------------------------------------------------------------------------------------
# Warps and blocks


@dataclass
class Warp:
    index: int
    regs: dict[SSAValue, np.ndarray] = field(default_factory=dict)
    pc: int = 0
    done: bool = False
    groups: list[list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=list)  # committed cp.async groups
    open_group: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)


@dataclass
class Launch:
    params: dict[str, Any]
    global_memory: GlobalMemory
    grid: tuple[int, int, int]
    shared_bytes: int
    order: str = "ascending"
    seed: int = 0


class BlockSimulator:
    def __init__(self, kernel: ptx.KernelOp, launch: Launch, block: tuple[int, int, int]):
        self.kernel = kernel
        self.ops: list[Operation] = list(kernel.body.block.ops)
        self.labels = {op.label.data: i for i, op in enumerate(self.ops) if isinstance(op, ptx.LabelOp)}
        self.launch = launch
        self.block = block
        self.shared = SharedMemory(launch.shared_bytes)
        self.warps = [Warp(w) for w in range(kernel.threads.data // LANES)]
        self.rng = np.random.default_rng(launch.seed + 7919 * (block[0] + 31 * block[1] + 997 * block[2]))

    def run(self) -> None:
        while True:
            live = [w for w in self.warps if not w.done]
            if not live:
                return
            order = list(live)
            if self.launch.order == "descending":
                order.reverse()
            elif self.launch.order == "shuffled":
                self.rng.shuffle(order)
            for warp in order:
                self.run_warp(warp)
            waiting = [w for w in self.warps if not w.done]
            if waiting and len(waiting) != len(self.warps):
                raise SimulationError("some warps exited while others wait at a barrier (a hang on the GPU)")
            for w in waiting:
                w.pc += 1  # everyone is at the barrier: pass it

    def run_warp(self, warp: Warp) -> None:
        """Run until the warp reaches a barrier or returns."""
        while True:
            if warp.pc >= len(self.ops):
                warp.done = True
                return
            op = self.ops[warp.pc]
            if isinstance(op, ptx.BarSyncOp):
                return
            if isinstance(op, ptx.RetOp):
                warp.done = True
                return
            try:
                jump = self.step(warp, op)
            except SimulationError as e:
                if e.loc is None:
                    e.loc = SourceLoc.from_attr(op.location)
                raise
            warp.pc = self.labels[jump] if jump is not None else warp.pc + 1

    # ---------------------------------------------------------------------------------------------------------

    def get(self, warp: Warp, value: SSAValue) -> np.ndarray:
        if value not in warp.regs:
            raise SimulationError(f"a register bundle is read before it is written ({value.owner.name})")  # type: ignore[union-attr]
        return warp.regs[value]

    def fresh(self, value: SSAValue) -> np.ndarray:
        cls, n = value.type.reg_class, value.type.n  # type: ignore[attr-defined]
        if cls == "pred":
            return np.zeros((LANES, n), dtype=bool)
        if cls == "b64":
            return np.full((LANES, n), 0xFFFFFFFFFFFFFFFF, dtype=np.uint64)
        return np.full((LANES, n), 0xFFFFFFFF, dtype=np.uint32)

    def step(self, warp: Warp, op: Operation) -> str | None:  # noqa: C901
        lane = np.arange(LANES)
        if isinstance(op, ptx.ParamOp):
            value = self.launch.params[op.param.data]
            kind = op.ptx_type.data
            if kind == "f32":
                bits = bits32(np.full(LANES, value))
            elif kind in ("u64", "s64"):
                bits = u64(np.full(LANES, int(value)))
            else:
                bits = u32(np.full(LANES, int(value)))
            warp.regs[op.result] = bits.reshape(LANES, 1)
        elif isinstance(op, ptx.SpecialOp):
            name = op.register.data
            grid = self.launch.grid
            values = {"%tid.x": warp.index * LANES + lane, "smem": 0,
                      "%ctaid.x": self.block[0], "%ctaid.y": self.block[1], "%ctaid.z": self.block[2],
                      "%nctaid.x": grid[0], "%nctaid.y": grid[1], "%nctaid.z": grid[2]}
            if name not in values:
                raise SimulationError(f"special register {name} is not simulated")
            warp.regs[op.result] = u32(np.broadcast_to(values[name], LANES)).reshape(LANES, 1)
        elif isinstance(op, ptx.RegsOp):
            warp.regs[op.result] = self.fresh(op.result)
        elif isinstance(op, ptx.InstrOp):
            self.instr(warp, op)
        elif isinstance(op, ptx.LoadOp):
            self.load(warp, op)
        elif isinstance(op, ptx.StoreOp):
            self.store(warp, op)
        elif isinstance(op, ptx.CpAsyncOp):
            self.cp_async(warp, op)
        elif isinstance(op, ptx.CpAsyncCommitOp):
            warp.groups.append(warp.open_group)
            warp.open_group = []
        elif isinstance(op, ptx.CpAsyncWaitOp):
            keep = op.pending.data
            landing = warp.groups[:len(warp.groups) - keep] if keep else warp.groups
            for group in landing:
                for addr, data in group:
                    self.shared.write(addr, data, "cp.async landing")
            warp.groups = warp.groups[len(landing):]
        elif isinstance(op, ptx.LdmatrixOp):
            self.ldmatrix(warp, op)
        elif isinstance(op, ptx.MmaOp):
            self.mma(warp, op)
        elif isinstance(op, ptx.LabelOp):
            pass
        elif isinstance(op, ptx.BraOp):
            if op.guard is None:
                return op.target.data
            p = self.get(warp, op.guard)[:, 0].astype(bool)
            if op.negate.value.data:
                p = ~p
            if not (p == p[0]).all():
                raise SimulationError("a branch diverges inside a warp")
            return op.target.data if p[0] else None
        else:
            raise SimulationError(f"the simulator does not know {op.name}")
        return None

    def instr(self, warp: Warp, op: ptx.InstrOp) -> None:
        table, operand_of_slot = op.slot_table, op.operand_of_slot
        imms = [parse_immediate(s.data) for s in op.immediates.data]
        opcode = op.opcode.data
        float_imm = ".f32" in opcode or opcode.startswith("selp") or opcode.startswith("mov")
        operands = []
        for s, k in enumerate(operand_of_slot):
            if k == -1:
                vals = [imms[i] for i in table[:, s]]
                if any(isinstance(v, float) for v in vals):
                    arr = bits32(np.array(vals, dtype=np.float32)) if float_imm else np.array(vals)
                else:
                    arr = np.array(vals, dtype=np.int64)
                    if not opcode.startswith(("shl", "shr", "prmt")):
                        arr = u32(arr) if not ("64" in opcode) else u64(arr)
                operands.append(np.broadcast_to(arr, (LANES, len(vals))))
            else:
                src = self.get(warp, op.args[int(k)])
                operands.append(src[:, table[:, s]])
        if opcode.startswith("shfl.sync.bfly"):
            x, dist = operands[0], np.asarray(operands[1])[0]
            partner = np.arange(LANES)[:, None] ^ dist[None, :]
            result = np.take_along_axis(x, partner, axis=0)
        elif opcode.startswith("movmatrix"):
            x = operands[0]
            result = np.stack([movmatrix_trans(x[:, i]) for i in range(x.shape[1])], axis=1)
        else:
            result = execute(opcode, operands)
        target_value = op.target
        if op.into is not None:
            target = self.get(warp, target_value).copy()
        else:
            target = self.fresh(target_value)
        result = np.broadcast_to(result, (LANES, op.n)).astype(target.dtype)
        dest = op.dest_indices
        if op.guard is not None:
            g = self.get(warp, op.guard)[:, op.guard_indices].astype(bool)
            if op.guard_negate is not None and op.guard_negate.value.data:
                g = ~g
            result = np.where(g, result, target[:, dest])
        target[:, dest] = result
        warp.regs[target_value] = target

    def _addresses(self, warp: Warp, addr: SSAValue, index: np.ndarray, offset: np.ndarray) -> np.ndarray:
        base = self.get(warp, addr)[:, index]
        if base.dtype == np.uint64:
            return (s64(base) + offset[None, :]).astype(np.int64)
        return s32(base) + offset[None, :]

    def _guards(self, warp: Warp, op: Any, n: int) -> np.ndarray:
        if op.guard is None:
            return np.ones((LANES, n), dtype=bool)
        return self.get(warp, op.guard)[:, op.table("guard_index", 0)].astype(bool)

    def load(self, warp: Warp, op: ptx.LoadOp) -> None:
        space, kind, vec = op.space.data, op.ptx_type.data, op.vec.data
        word = int(kind[1:]) // 8
        addrs = self._addresses(warp, op.addr, op.table("addr_index", 0), op.table("offset", 0))
        guards = self._guards(warp, op, addrs.shape[1])
        out = self.fresh(op.result)
        dest = op.table("dest", 0)
        for i in range(addrs.shape[1]):
            lanes = np.nonzero(guards[:, i])[0]
            words = np.zeros((LANES, vec), dtype=np.uint32)
            if lanes.size:
                what = f"ld.{space}"
                data = (self.launch.global_memory.read(addrs[lanes, i], word * vec, what) if space == "global"
                        else self.shared.read(addrs[lanes, i], word * vec, what))
                words[lanes] = _bytes_to_words(data, word).astype(np.uint32)
            out[:, dest[i]:dest[i] + vec] = words
        warp.regs[op.result] = out

    def store(self, warp: Warp, op: ptx.StoreOp) -> None:
        space, kind, vec = op.space.data, op.ptx_type.data, op.vec.data
        word = int(kind[1:]) // 8
        addrs = self._addresses(warp, op.addr, op.table("addr_index", 0), op.table("offset", 0))
        guards = self._guards(warp, op, addrs.shape[1])
        values = self.get(warp, op.value)
        source = op.table("source", 0)
        for i in range(addrs.shape[1]):
            lanes = np.nonzero(guards[:, i])[0]
            if not lanes.size:
                continue
            words = values[lanes, source[i]:source[i] + vec]
            data = _words_to_bytes(words.astype(np.uint64 if word == 8 else np.uint32), word)
            if space == "global":
                self.launch.global_memory.write(addrs[lanes, i], data, "st.global")
            else:
                self.shared.write(addrs[lanes, i], data, "st.shared")

    def cp_async(self, warp: Warp, op: ptx.CpAsyncOp) -> None:
        nbytes = op.nbytes.data
        dst = self._addresses(warp, op.dst, op.table("dst_index", 0), op.table("dst_offset", 0))
        src = self._addresses(warp, op.src, op.table("src_index", 0), op.table("src_offset", 0))
        sizes = (s32(self.get(warp, op.src_size)[:, op.table("size_index", 0)]) if op.src_size is not None
                 else np.full(dst.shape, nbytes))
        guards = self._guards(warp, op, dst.shape[1])
        for i in range(dst.shape[1]):
            lanes = np.nonzero(guards[:, i])[0]
            if not lanes.size:
                continue
            data = np.zeros((lanes.size, nbytes), dtype=np.uint8)
            reading = lanes[sizes[lanes, i] > 0]
            if reading.size:
                got = self.launch.global_memory.read(src[reading, i], nbytes, "cp.async source")
                keep = np.arange(nbytes)[None, :] < sizes[reading, i][:, None]
                data[np.isin(lanes, reading)] = np.where(keep, got, 0)
            self.shared._check(dst[lanes, i], nbytes, "cp.async destination")
            warp.open_group.append((dst[lanes, i], data))

    def ldmatrix(self, warp: Warp, op: ptx.LdmatrixOp) -> None:
        if op.num.data != 4:
            raise SimulationError("only ldmatrix .x4 is simulated")
        addrs = self._addresses(warp, op.addr, op.table("addr_index", 0), op.table("offset", 0))
        dest = op.table("dest", 4)
        out = self.fresh(op.result)
        for i in range(addrs.shape[1]):
            rows = self.shared.read(addrs[:, i], 16, "ldmatrix")
            out[:, dest[i]] = ldmatrix_x4(rows, op.trans.value.data)
        warp.regs[op.result] = out

    def mma(self, warp: Warp, op: ptx.MmaOp) -> None:
        dtype = "bf16" if ".bf16." in op.shape.data else "f16"
        a_, b_, c_ = (self.get(warp, v) for v in (op.a, op.b, op.c))
        d = c_.copy()
        written: set[int] = set()
        for row in op.instructions:
            di, ai, bi, ci = row[0:4], row[4:8], row[8:10], row[10:14]
            c_bits = np.stack([d[:, x] if int(x) in written else c_[:, x] for x in ci], axis=1)
            d[:, di] = mma_m16n8k16(a_[:, ai], b_[:, bi], c_bits, dtype)
            written.update(int(x) for x in di)
        warp.regs[op.result] = d


# --------------------------------------------------------------------------------------------------------------
# Launching


def _dtype_name(array: np.ndarray) -> str:
    return {np.dtype(ml_dtypes.bfloat16): "bf16", np.dtype(np.float16): "f16", np.dtype(np.float32): "f32"}[array.dtype]


def simulate(module: ModuleOp, name: str, args: Sequence[Any], grid: int | Sequence[int], order: str = "ascending",
             seed: int = 0) -> None:
    """Run `ptx.kernel` `name` on numpy arguments (tensors are updated in place) over a grid."""
    from tkc.interpreter import normalize_grid

    kernel = next((op for op in module.walk() if isinstance(op, ptx.KernelOp) and op.sym_name.data == name), None)
    if kernel is None:
        raise TkcError(f"no ptx kernel named {name}")
    grid3 = normalize_grid(grid)
    memory = GlobalMemory()
    params: dict[str, Any] = {}
    param_names = [p for p, _ in kernel.param_list]
    tensors: list[tuple[np.ndarray, np.ndarray]] = []
    arg_iter = iter(args)
    seen: set[str] = set()
    for pname in param_names:
        stem = pname.rsplit("_", 1)[0]
        if pname.endswith("_ptr"):
            array = next(arg_iter)
            raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1).copy()
            base = memory.add(raw)
            params[pname] = base
            itemsize = array.dtype.itemsize
            for d, (size, stride) in enumerate(zip(array.shape, array.strides)):
                params[f"{stem}_d{d}"] = size
                params[f"{stem}_s{d}"] = int(np.ascontiguousarray(array).strides[d] // itemsize)
            tensors.append((array, raw))
            seen.add(stem)
        elif stem in seen and (pname.startswith(stem + "_d") or pname.startswith(stem + "_s")):
            continue
        else:
            params[pname] = next(arg_iter)
    smem = kernel.attributes.get("tkc.smem_bytes")
    shared_bytes = (smem.value.data if smem is not None else 0) + 1024  # type: ignore[union-attr]
    launch = Launch(params, memory, grid3, shared_bytes, order, seed)
    for z in range(grid3[2]):
        for y in range(grid3[1]):
            for x in range(grid3[0]):
                BlockSimulator(kernel, launch, (x, y, z)).run()
    for array, raw in tensors:
        array[...] = raw.view(array.dtype).reshape(array.shape)
