"""A CPU simulation of the `ptx` dialect: the oracle for lowering.

It runs a kernel block by block, warp by warp, with every lane's registers (numpy arrays of raw bits, one row per
lane), global tensors as bytes at made-up addresses (an access outside them is an error: an illegal address on
the GPU), and shared memory as bytes. Instruction semantics (ptx_semantics.py) come from the PTX ISA, written
independently of the lowering: the mma.m16n8k16 and ldmatrix fragment layouts there are the ISA's, not fragments.py's.

* `cp.async` reads its source when issued, but its bytes land in shared memory only at the issuing thread's
  `cp.async.wait_group` that covers its group; until then the destination keeps its old (poisoned) bytes.
* Warps run one at a time up to the next `bar.sync`, in an order that tests vary (ascending, descending,
  shuffled; "sliced" also hands over every 1-47 instructions), so a missing barrier shows up as a read of data
  another warp has not written yet. The blocks of a cluster take turns; in order "ahead" each runs as far as it
  can first, so a block that overwrites a shared tile its peers have yet to read shows up too.
* An ldmatrix reads shared memory when it runs, but until something reads its registers (or its warp runs
  `fence.proxy.async`) the hardware may not have: a TMA load issued into those bytes meanwhile is reported.
* Branches must be uniform across a warp; all warps must meet at every `bar.sync`.
* sm_90a: an mbarrier completes its phase when its arrivals and its transaction bytes are all in; a TMA load's
  bytes count (and its box lands in shared memory, swizzled) only when a thread waits on the barrier. A warp at an `mbarrier.try_wait` of a phase not yet complete
  yields to the others; if every warp waits, the block would hang on the GPU and the simulation says so. A wgmma
  reads its operands through their descriptors when issued; its accumulator registers read as NaN until the
  `wgmma.wait_group` that covers it.
* Clusters (`.reqnctapercluster`): the blocks of a cluster run together, their warps interleaved. `mapa` maps a
  shared address to the same offset in another block (made-up cluster addresses); a remote `mbarrier.arrive`
  and a TMA multicast land in the blocks they name (the multicast's bytes in each block's shared memory, counted
  on each block's barrier); `barrier.cluster.wait` lets a warp on once every warp of the cluster has arrived.
  Signalling a block that has exited is reported (on the GPU: undefined).

Speed (the test suite runs thousands of simulated launches): each InstrOp is read off its xDSL properties once per
launch (`InstrPlan`), ops are dispatched by their class's identity, and a wgmma's operand addresses are kept by
descriptor; what is simulated is the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from tkc.backend import ptx
from tkc.backend import wgmma as wg
from tkc.backend.ptx_semantics import (LANES, OPERAND_BYTES, SimulationError, bits32, decode_operand, execute, f32,
                                       ldmatrix_x4, mma_m16n8k16, movmatrix_trans, parse_immediate, s32, s64, u32,
                                       u64, unpack16)
from tkc.ir.tma_ops import tensor_map_param
from tkc.errors import SourceLoc, TkcError, check_cluster_grid

GLOBAL_SPACING = 1 << 32  # each tensor lives at its own 4 GiB-aligned made-up address
POISON = 0xFF  # shared memory and fresh registers start as 0xFF bytes (NaN in every float format)


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

    def span(self, addr: int, nbytes: int, what: str) -> np.ndarray:
        """The bytes at one address, any alignment (a TMA box's row), as a view into the tensor."""
        which, offset = self.locate(np.array([addr]), 1, what)
        w, o = int(which[0]), int(offset[0])
        if o + nbytes > self.buffers[w].size:
            raise SimulationError(f"{what}: illegal global address {addr + nbytes:#x} (outside every tensor)")
        return self.buffers[w][o:o + nbytes]

    def write_span(self, addr: int, data: np.ndarray, what: str) -> None:
        self.span(addr, data.size, what)[:] = data

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
    """[lane, nbytes] → [lane, nbytes / word] little-endian words (zero-extended to 32 bits for 8- and 16-bit words)."""
    if word == 1:
        return data.astype(np.uint32)
    if word == 2:
        return data.view(np.uint16).astype(np.uint32)
    if word == 4:
        return data.view(np.uint32)
    return data.view(np.uint64)


def _words_to_bytes(words: np.ndarray, word: int) -> np.ndarray:
    if word == 1:
        return (words & 0xFF).astype(np.uint8).reshape(words.shape[0], -1)
    if word == 2:
        return (words & 0xFFFF).astype(np.uint16).view(np.uint8).reshape(words.shape[0], -1)
    if word == 4:
        return words.astype(np.uint32).view(np.uint8).reshape(words.shape[0], -1)
    return words.astype(np.uint64).view(np.uint8).reshape(words.shape[0], -1)


# --------------------------------------------------------------------------------------------------------------
# Warps and blocks


@dataclass
class Warp:
    index: int
    regs: dict[SSAValue, np.ndarray] = field(default_factory=dict)
    pc: int = 0
    done: bool = False
    at_barrier: bool = False
    barrier: int = 0  # the barrier it waits at
    groups: list[list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=list)  # committed cp.async groups
    open_group: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    wgmma_results: dict[SSAValue, np.ndarray] = field(default_factory=dict)  # accumulators as wgmmas left them
    # (accumulator, completion, 2-byte units of shared memory it reads) per wgmma not yet waited for
    wgmma_groups: list[list[tuple[SSAValue, Any, np.ndarray]]] = field(default_factory=list)
    wgmma_open: list[tuple[SSAValue, Any, np.ndarray]] = field(default_factory=list)
    # TMA stores: (2-byte units of shared memory it reads, completion) per store, in bulk groups
    bulk_groups: list[list[tuple[np.ndarray, Any]]] = field(default_factory=list)
    bulk_open: list[tuple[np.ndarray, Any]] = field(default_factory=list)
    # (registers, 2-byte units of shared memory) per ldmatrix whose registers nothing has read yet: the hardware
    # may not have read its shared memory yet either (an LDSM completes at the first use of its registers)
    ldmatrix_pending: list[tuple[SSAValue, np.ndarray]] = field(default_factory=list)
    cluster_arrival: int | None = None  # the cluster barrier's round this warp arrived in, until its wait passes


def _first_reader(readers: list[tuple[Any, np.ndarray]], addresses: np.ndarray, nbytes: int) -> Any:
    """The first of (warp, 2-byte units it reads) pairs whose units the accesses of `nbytes` at `addresses` touch,
    or None."""
    if not readers:
        return None
    halves = _halves(addresses, nbytes)
    return next((who for who, units in readers if _overlap(units, halves)), None)


def _overlap(units: np.ndarray, halves: np.ndarray) -> bool:
    """Whether two sorted arrays of distinct 2-byte units share one (binary search: no sort, unlike intersect1d)."""
    if not units.size or not halves.size or halves[-1] < units[0] or halves[0] > units[-1]:
        return False
    at = np.minimum(np.searchsorted(units, halves), units.size - 1)
    return bool((units[at] == halves).any())


def _halves(addresses: np.ndarray, nbytes: int) -> np.ndarray:
    """The 2-byte units of shared memory that accesses of `nbytes` at the addresses touch (sorted, once each)."""
    return np.unique((addresses.reshape(-1)[:, None] + np.arange(0, nbytes, 2)[None, :]).reshape(-1) // 2)


@dataclass
class TensorMap:
    """What the simulator needs of a TMA descriptor: a row-major array (2-D, or more: boxes one matrix of the last
    two dimensions deep) copied in boxes, with a swizzle."""

    array: np.ndarray
    box_rows: int
    box_cols: int
    swizzle: int = 128
    address: int = 0  # where the array lives in the simulated global memory


@dataclass
class Mbarrier:
    expected: int
    pending: int
    tx: int = 0
    completed: int = 0  # phases completed so far: the current phase's parity is completed % 2
    landing: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # TMA bytes waiting for the phase
    in_flight: list[tuple[np.ndarray, np.ndarray, int]] = field(default_factory=list)  # TMA copies not yet counted


class InstrPlan(NamedTuple):
    """An InstrOp as the simulator executes it, read off its properties once: per source slot either a register
    bundle and the columns it reads or the immediates' bits; the destination's columns and guard."""

    opcode: str
    n: int
    slots: list[tuple[SSAValue | None, Any]]  # (bundle, its columns: a slice or an array) or (None, immediates' bits)
    target: SSAValue
    into: bool
    dest: np.ndarray
    guard: SSAValue | None
    guard_indices: np.ndarray | None
    guard_negate: bool
    whole: Any  # the bundle's dtype where the instruction writes a new bundle's every register in order, unguarded

    @classmethod
    def of(cls, op: ptx.InstrOp) -> InstrPlan:
        table = op.slot_table
        imms = [parse_immediate(s.data) for s in op.immediates.data]
        opcode = op.opcode.data
        float_imm = ".f32" in opcode or opcode.startswith("selp") or opcode.startswith("mov")
        slots: list[tuple[SSAValue | None, Any]] = []
        for s, k in enumerate(op.operand_of_slot):
            if k == -1:
                vals = [imms[i] for i in table[:, s]]
                if any(isinstance(v, float) for v in vals):
                    arr = bits32(np.array(vals, dtype=np.float32)) if float_imm else np.array(vals)
                else:  # 64-bit immediates at or past 2**63 (descriptor bits) as their two's complement
                    arr = np.array([v - (1 << 64) if v >= 1 << 63 else v for v in vals], dtype=np.int64)
                    if not opcode.startswith(("shl", "shr", "prmt")):
                        arr = u32(arr) if not ("64" in opcode) else u64(arr)
                slots.append((None, np.broadcast_to(arr, (LANES, len(vals)))))
            else:  # a run of consecutive registers as a slice: a view, not a gathered copy
                cols = table[:, s].copy()
                run = len(cols) and np.array_equal(cols, np.arange(cols[0], cols[0] + len(cols)))
                slots.append((op.args[int(k)], slice(int(cols[0]), int(cols[0]) + len(cols)) if run else cols))
        negate = op.guard_negate is not None and bool(op.guard_negate.value.data)
        dest, target = op.dest_indices.copy(), op.target
        whole = None
        if op.into is None and op.guard is None and np.array_equal(dest, np.arange(target.type.n)):  # type: ignore[attr-defined]
            cls_ = target.type.reg_class  # type: ignore[attr-defined]
            whole = bool if cls_ == "pred" else np.uint64 if cls_ == "b64" else np.uint32
        return cls(opcode, op.n, slots, target, op.into is not None, dest, op.guard, op.guard_indices, negate, whole)


@dataclass
class Launch:
    params: dict[str, Any]
    global_memory: GlobalMemory
    grid: tuple[int, int, int]
    shared_bytes: int
    order: str = "ascending"
    seed: int = 0
    tensor_maps: dict[int, TensorMap] = field(default_factory=dict)  # by the made-up generic address of the param
    decoded: dict[Operation, InstrPlan] = field(default_factory=dict)  # each InstrOp read once, for every block
    wgmma_addresses: dict[tuple[Any, ...], Any] = field(default_factory=dict)  # Simulator.wgmma's, by descriptors


TENSOR_MAP_BASE = 0x7F00_0000_0000  # made-up generic addresses of tensor-map parameters
CLUSTER_WINDOW = 1 << 24  # a made-up shared::cluster address: (rank + 1) · CLUSTER_WINDOW + offset in that block


@dataclass
class ClusterBarrier:
    """`barrier.cluster`: warps arrived in the current round (a round completes when every warp of the cluster
    has arrived) and the rounds completed."""

    warps: int
    arrived: int = 0
    rounds: int = 0


class BlockSimulator:
    def __init__(self, kernel: ptx.KernelOp, launch: Launch, block: tuple[int, int, int]):
        self.kernel = kernel
        self.ops: list[Operation] = list(kernel.body.block.ops)
        self.labels = {op.label.data: i for i, op in enumerate(self.ops) if isinstance(op, ptx.LabelOp)}
        self.launch = launch
        self.block = block
        self.shared = SharedMemory(launch.shared_bytes)
        self.warps = [Warp(w) for w in range(kernel.threads.data // LANES)]
        self.arrivals: dict[int, int] = {}  # named barrier → warps that arrived at it (bar.arrive) without waiting
        self.rng = np.random.default_rng(launch.seed + 7919 * (block[0] + 31 * block[1] + 997 * block[2]))
        self.mbarriers: dict[int, Mbarrier] = {}
        self.cluster: list[BlockSimulator] = [self]  # the blocks of its cluster, by rank
        self.rank = 0
        self.cluster_barrier = ClusterBarrier(len(self.warps))  # one object shared by the cluster's blocks

    def run(self) -> None:
        run_cluster([self])

    @property
    def exited(self) -> bool:
        return all(w.done for w in self.warps)

    def advance(self) -> bool:
        """Run each live warp until it blocks (or, in order "sliced", for a while) and let barriers pass; whether
        anything moved. A block that has exited checks that it left no named barrier half-arrived."""
        live = [w for w in self.warps if not w.done]
        if not live:
            left = {b: n for b, n in self.arrivals.items() if n}
            if left:
                raise SimulationError(f"the block exits with warps arrived at named barriers {left} that nobody "
                                      "waited for (a later kernel on this multiprocessor would inherit them)")
            return False
        order = list(live)
        if self.launch.order == "descending":
            order.reverse()
        elif self.launch.order in ("shuffled", "sliced"):
            self.rng.shuffle(order)
        progress = False
        for warp in order:
            if not warp.at_barrier:
                budget = int(self.rng.integers(1, 48)) if self.launch.order == "sliced" else None
                progress |= self.run_warp(warp, budget)
        return self._pass_barriers() or progress

    def hang(self) -> SimulationError:
        """What a block whose warps all wait, with nothing left to wake them, would be on the GPU."""
        waiting = [w for w in self.warps if not w.done]
        if waiting and all(w.at_barrier for w in waiting) and len(waiting) != len(self.warps):
            return SimulationError("some warps exited while others wait at a barrier (a hang on the GPU)")
        return SimulationError("every warp waits, at a barrier or on an mbarrier phase that nothing will complete "
                               "(a hang on the GPU)")

    def _pass_barriers(self) -> bool:
        """Let the warps at a barrier through once all of its participants are there: every warp of the block for
        `bar.sync 0`, N/32 warps for `bar.sync ID, N`, counting the warps that `bar.arrive`d at it."""
        passed = False
        at: dict[int, list[Warp]] = {}
        for w in self.warps:
            if w.at_barrier and not w.done:
                at.setdefault(w.barrier, []).append(w)
        for barrier, warps in at.items():
            counts = {self.ops[w.pc].threads for w in warps}  # type: ignore[attr-defined]
            if len(counts) != 1:
                raise SimulationError(f"warps meet at barrier {barrier} with different thread counts")
            count = counts.pop()
            needed = len(self.warps) if count is None else count.data // LANES
            arrived = len(warps) + self.arrivals.get(barrier, 0)
            if arrived > needed:
                raise SimulationError(f"{arrived} warps at barrier {barrier}, which counts {needed}")
            if arrived == needed:
                reducing = {type(self.ops[w.pc]) is ptx.BarRedOp for w in warps}
                if len(reducing) != 1:
                    raise SimulationError(f"warps meet at barrier {barrier}, some at bar.sync and some at bar.red")
                if reducing.pop():  # bar.red.or.pred: every thread gets whether any thread's p was set
                    verdict = any(bool(self.get(w, self.ops[w.pc].value)[:, 0].any()) for w in warps)
                    for w in warps:
                        w.regs[self.ops[w.pc].result] = np.full((LANES, 1), verdict)
                for w in warps:
                    w.at_barrier = False
                    w.pc += 1
                self.arrivals[barrier] = 0
                passed = True
        return passed

    def _barrier_of(self, warp: Warp, op: ptx.BarSyncOp) -> int:
        if op.barrier_reg is None:
            return op.barrier.data
        ids = np.unique(self.get(warp, op.barrier_reg)[:, 0])
        if len(ids) != 1:
            raise SimulationError(f"the lanes of warp {warp.index} name different barriers {ids.tolist()}")
        return int(ids[0])

    def _arrive(self, warp: Warp, op: ptx.BarSyncOp) -> None:
        """`bar.arrive`: count toward the barrier without waiting; a barrier whose count is met by arrivals alone
        completes at once."""
        barrier = self._barrier_of(warp, op)
        needed = op.threads.data // LANES  # type: ignore[union-attr]
        self.arrivals[barrier] = self.arrivals.get(barrier, 0) + 1
        waiting = [w for w in self.warps if w.at_barrier and not w.done and w.barrier == barrier]
        if self.arrivals[barrier] + len(waiting) > needed:
            raise SimulationError(f"warp {warp.index} arrives at barrier {barrier} once more than it counts "
                                  f"({needed} warps): an arrival for a later use of the barrier mixes into this one")
        if self.arrivals[barrier] + len(waiting) == needed:  # complete now: a later arrival belongs to the next use
            for w in waiting:
                w.at_barrier = False
                w.pc += 1
            self.arrivals[barrier] = 0

    def run_warp(self, warp: Warp, budget: int | None = None) -> bool:
        """Run until the warp reaches a barrier, returns, or waits on an mbarrier phase that is not complete (or,
        in order "sliced", has run `budget` instructions); whether it got anywhere."""
        moved = False
        while True:
            if budget is not None:
                if budget == 0:
                    return True
                budget -= 1
            if warp.pc >= len(self.ops):
                warp.done = True
                return True
            op = self.ops[warp.pc]
            t = type(op)  # (ops are leaf classes: identity, not isinstance's ABC checks)
            if t is ptx.BarRedOp:
                warp.barrier = 0
                warp.at_barrier = True
                return True
            if t is ptx.BarSyncOp:
                if op.arrives:
                    self._arrive(warp, op)
                    warp.pc += 1
                    moved = True
                    continue
                warp.barrier = self._barrier_of(warp, op)
                warp.at_barrier = True
                return True
            elif t is ptx.RetOp:
                if warp.bulk_groups or warp.bulk_open:
                    raise SimulationError(f"warp {warp.index} exits while a TMA store still reads its shared memory "
                                          "(cp.async.bulk.wait_group first)")
                warp.done = True
                return True
            elif t is ptx.MbarrierOp and op.kind.data == "try_wait" and not self.phase_complete(warp, op):
                return moved  # its `@!p bra` loop would spin until another warp (or a TMA) completes the phase
            elif t is ptx.ClusterBarrierOp and op.kind.data == "wait" and not self._cluster_passed(warp):
                return moved
            try:
                jump = self.step(warp, op)
            except SimulationError as e:
                if e.loc is None:
                    e.loc = SourceLoc.from_attr(op.location)
                raise
            moved = True
            warp.pc = self.labels[jump] if jump is not None else warp.pc + 1

    # ---------------------------------------------------------------------------------------------------------

    def get(self, warp: Warp, value: SSAValue) -> np.ndarray:
        if warp.ldmatrix_pending:
            warp.ldmatrix_pending = [(regs, units) for regs, units in warp.ldmatrix_pending if regs is not value]
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
        t = type(op)  # (ops are leaf classes: identity, not isinstance's ABC checks)
        if t is ptx.InstrOp:  # most of what runs: first
            self.instr(warp, op)
        elif t is ptx.ParamOp:
            value = self.launch.params[op.param.data]
            kind = op.ptx_type.data
            if kind == "f32":
                bits = bits32(np.full(LANES, value))
            elif kind in ("u64", "s64"):
                bits = u64(np.full(LANES, int(value)))
            else:
                bits = u32(np.full(LANES, int(value)))
            warp.regs[op.result] = bits.reshape(LANES, 1)
        elif t is ptx.SpecialOp:
            name = op.register.data
            grid = self.launch.grid
            values = {"%tid.x": warp.index * LANES + np.arange(LANES), "smem": 0,
                      "%ctaid.x": self.block[0], "%ctaid.y": self.block[1], "%ctaid.z": self.block[2],
                      "%nctaid.x": grid[0], "%nctaid.y": grid[1], "%nctaid.z": grid[2],
                      "%cluster_ctarank": self.rank, "%cluster_nctarank": len(self.cluster)}
            if name not in values:
                raise SimulationError(f"special register {name} is not simulated")
            warp.regs[op.result] = u32(np.broadcast_to(values[name], LANES)).reshape(LANES, 1)
        elif t is ptx.RegsOp:
            warp.regs[op.result] = self.fresh(op.result)
        elif t is ptx.LoadOp:
            self.load(warp, op)
        elif t is ptx.StoreOp:
            self.store(warp, op)
        elif t is ptx.CpAsyncOp:
            self.cp_async(warp, op)
        elif t is ptx.CpAsyncCommitOp:
            warp.groups.append(warp.open_group)
            warp.open_group = []
        elif t is ptx.CpAsyncWaitOp:
            keep = op.pending.data
            landing = warp.groups[:len(warp.groups) - keep] if keep else warp.groups
            for group in landing:
                for addr, data in group:
                    self.shared.write(addr, data, "cp.async landing")
            warp.groups = warp.groups[len(landing):]
        elif t is ptx.LdmatrixOp:
            self.ldmatrix(warp, op)
        elif t is ptx.MmaOp:
            self.mma(warp, op)
        elif t is ptx.MbarrierOp:
            self.mbarrier(warp, op)
        elif t is ptx.TmaLoadOp:
            self.tma_load(warp, op)
        elif t is ptx.ParamAddrOp:
            warp.regs[op.result] = u64(np.full((LANES, 1), self.launch.params[op.param.data]))
        elif t is ptx.WgmmaOp:
            self.wgmma(warp, op)
        elif t is ptx.WgmmaSyncOp:
            self.wgmma_sync(warp, op)
        elif t is ptx.TmaStoreOp:
            self.tma_store(warp, op)
        elif t is ptx.BulkGroupOp:
            self.bulk_group(warp, op)
        elif t is ptx.FenceOp and op.kind.data.startswith("proxy.async"):
            warp.ldmatrix_pending = []  # its generic-proxy reads are ordered before what the async proxy does next
        elif t in (ptx.FenceOp, ptx.SetmaxnregOp, ptx.WarpSyncOp, ptx.GridDependencyOp):
            pass  # ordering only; the simulation is sequentially consistent and runs one grid
        elif t is ptx.ElectOp:
            warp.regs[op.result] = (np.arange(LANES) == 0).reshape(LANES, 1)
        elif t is ptx.AtomOp:
            self.atom(warp, op)
        elif t is ptx.ClusterBarrierOp:
            if op.kind.data.startswith("arrive"):
                self._cluster_arrive(warp)
        elif t is ptx.LabelOp:
            pass
        elif t is ptx.BraOp:
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
        plan = self.launch.decoded.get(op)
        if plan is None:
            plan = self.launch.decoded[op] = InstrPlan.of(op)
        opcode = plan.opcode
        operands = [bits if bundle is None else self.get(warp, bundle)[:, bits] for bundle, bits in plan.slots]
        if opcode.startswith("shfl.sync.bfly"):
            x, dist = operands[0], np.asarray(operands[1])[0]
            partner = np.arange(LANES)[:, None] ^ dist[None, :]
            result = np.take_along_axis(x, partner, axis=0)
        elif opcode.startswith("shfl.sync.idx"):  # from a lane given by an immediate (a broadcast)
            source = np.asarray(operands[1])[0]
            result = operands[0][source, np.arange(plan.n)][None, :]
        elif opcode.startswith("mapa"):
            result = self._mapa(np.asarray(operands[0]), np.asarray(operands[1]))
        elif opcode.startswith("movmatrix"):
            x = operands[0]
            result = np.stack([movmatrix_trans(x[:, i]) for i in range(x.shape[1])], axis=1)
        else:
            result = execute(opcode, operands)
        target_value = plan.target
        if getattr(result, "shape", None) != (LANES, plan.n):
            result = np.broadcast_to(result, (LANES, plan.n))
        if plan.whole is not None:  # a new bundle written whole, unguarded: the result is the bundle
            warp.regs[target_value] = result.astype(plan.whole)  # (a copy: results may be operands' views)
            return
        if plan.into:
            target = self.get(warp, target_value).copy()
        else:
            target = self.fresh(target_value)
        result = result.astype(target.dtype, copy=False)
        dest = plan.dest
        if plan.guard is not None:
            g = self.get(warp, plan.guard)[:, plan.guard_indices].astype(bool)
            if plan.guard_negate:
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
                if space == "global":
                    data = self.launch.global_memory.read(addrs[lanes, i], word * vec, what)
                elif space == "shared::cluster":
                    data = self._cluster_read(addrs[lanes, i], word * vec, what)
                else:
                    data = self.shared.read(addrs[lanes, i], word * vec, what)
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
            if op.reduce is not None:  # red.global.add.f32: each lane's add lands whole (lanes of one address too)
                for lane in range(lanes.size):
                    at = addrs[lanes[lane:lane + 1], i]
                    old = self.launch.global_memory.read(at, word * vec, "red.global").view(np.float32)
                    total = old + words[lane].astype(np.uint32).view(np.float32)
                    self.launch.global_memory.write(at, total.view(np.uint8).reshape(1, -1), "red.global")
                continue
            data = _words_to_bytes(words.astype(np.uint64 if word == 8 else np.uint32), word)
            if space == "global":
                self.launch.global_memory.write(addrs[lanes, i], data, "st.global")
            else:
                self._check_wgmma_reads(addrs[lanes, i], word * vec, "st.shared")
                self.shared.write(addrs[lanes, i], data, "st.shared")

    def atom(self, warp: Warp, op: ptx.AtomOp) -> None:
        """`atom.global.add.u32` in each guarded-on lane, one after another (each sees the others' adds); the old
        word in d, 0 in guarded-off lanes."""
        on = np.ones(LANES, dtype=bool) if op.guard is None else self.get(warp, op.guard)[:, 0].astype(bool)
        addrs, values = self.get(warp, op.addr)[:, 0], self.get(warp, op.value)[:, 0]
        out = np.zeros((LANES, 1), dtype=np.uint32)
        for lane in np.flatnonzero(on):
            at = addrs[lane:lane + 1]
            old = self.launch.global_memory.read(at, 4, "atom.global").view(np.uint32)
            out[lane, 0] = old[0, 0]
            new = (old.astype(np.uint64) + int(values[lane])).astype(np.uint32)
            self.launch.global_memory.write(at, new.view(np.uint8).reshape(1, -1), "atom.global")
        warp.regs[op.result] = out

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
            self._check_wgmma_reads(dst[lanes, i], nbytes, "cp.async")
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
        warp.ldmatrix_pending.append((op.result, _halves(addrs, 16)))

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


    # ---------------------------------------------------------------------------------------------------------
    # sm_90a: mbarriers, TMA, wgmma

    def _active(self, warp: Warp, op: Any) -> np.ndarray:
        if op.guard is None:
            return np.arange(LANES)
        return np.nonzero(self.get(warp, op.guard)[:, 0].astype(bool))[0]

    def _barrier_address(self, warp: Warp, op: ptx.MbarrierOp) -> int:
        addrs = s32(self.get(warp, op.addr)[:, op.addr_index.data]) + op.offset.data
        if not (addrs == addrs[0]).all():
            raise SimulationError("the lanes of a warp name different mbarriers")
        addr = int(addrs[0])
        if addr % 8 or not 0 <= addr <= self.shared.data.size - 8:
            raise SimulationError(f"mbarrier at shared address {addr}: not 8-byte aligned inside shared memory")
        return addr

    def _barrier(self, addr: int) -> Mbarrier:
        if addr not in self.mbarriers:
            raise SimulationError(f"mbarrier at shared address {addr} is used before mbarrier.init")
        return self.mbarriers[addr]

    def phase_complete(self, warp: Warp, op: ptx.MbarrierOp) -> bool:
        """try_wait.parity p: true once the phase of parity p has completed (the current phase's parity is
        completed % 2, so on a fresh barrier parity 1 passes at once and parity 0 waits)."""
        bar = self._barrier(self._barrier_address(warp, op))
        # TMA copies complete (count their bytes) only when someone looks: without a wait, nothing lands.
        for addr, data, nbytes in bar.in_flight:
            bar.landing.append((addr, data))
            bar.tx -= nbytes
        bar.in_flight = []
        self._settle(bar)
        parity = s32(self.get(warp, op.parity)[:, op.parity_index.data])  # type: ignore[arg-type, union-attr]
        if not (parity == parity[0]).all():
            raise SimulationError("the lanes of a warp wait on different parities")
        return int(parity[0]) % 2 != bar.completed % 2

    def _settle(self, bar: Mbarrier) -> None:
        if bar.pending < 0:
            raise SimulationError("more arrivals on an mbarrier than its count in one phase")
        if bar.pending == 0 and bar.tx == 0:
            for addr, data in bar.landing:
                self.shared.write(addr, data, "TMA landing")
            bar.landing = []
            bar.completed += 1
            bar.pending = bar.expected

    def mbarrier(self, warp: Warp, op: ptx.MbarrierOp) -> None:
        kind = op.kind.data
        if kind == "try_wait":
            warp.regs[op.result] = np.full((LANES, 1), self.phase_complete(warp, op))  # type: ignore[index]
            return
        active = self._active(warp, op)
        if not active.size:
            return
        if kind == "arrive_cluster":
            for lane in active:
                block, offset = self._in_cluster(int(u32(self.get(warp, op.addr)[lane, op.addr_index.data])),
                                                 "a remote mbarrier.arrive")
                bar = block._barrier(offset + op.offset.data)
                bar.pending -= 1
                block._settle(bar)
            return
        addr = self._barrier_address(warp, op)
        if kind == "init":
            count = op.count.data  # type: ignore[union-attr]
            self.mbarriers[addr] = Mbarrier(count, count)
            return
        bar = self._barrier(addr)
        for _ in active:
            if kind == "arrive_expect_tx":
                bar.tx += op.count.data  # type: ignore[union-attr]
            bar.pending -= 1
            self._settle(bar)

    def _box(self, warp: Warp, op: ptx.TmaLoadOp | ptx.TmaStoreOp, lane: int) -> tuple[TensorMap, list[int]]:
        """The tensor map a lane's TMA instruction names, and its coordinates (innermost first)."""
        where = int(s64(self.get(warp, op.tmap)[lane:lane + 1, 0])[0])
        tmap = self.launch.tensor_maps.get(where)
        if tmap is None:
            raise SimulationError(f"cp.async.bulk.tensor: {where:#x} is not a tensor-map parameter's address")
        return tmap, [int(v) for v in s32(self.get(warp, op.coords)[lane, op.table("coord_index", 0)])]

    def tma_load(self, warp: Warp, op: ptx.TmaLoadOp) -> None:
        active = self._active(warp, op)
        for lane in active:
            tmap, (x, y, *outer) = self._box(warp, op, lane)
            e = tmap.array.dtype.itemsize
            row_bytes = tmap.box_cols * e
            if len(outer) != tmap.array.ndim - 2:
                raise SimulationError(f"a {tmap.array.ndim}-D tensor map takes {tmap.array.ndim} coordinates")
            matrix = tmap.array  # the box comes from one matrix (none past the outer dimensions' ends)
            for index, size in zip(outer[::-1], tmap.array.shape[:-2]):
                matrix = matrix[index] if 0 <= index < size else matrix[0][..., :0, :]
            if tmap.swizzle and row_bytes > tmap.swizzle:
                raise SimulationError(f"a TMA box row of {row_bytes} bytes is wider than its {tmap.swizzle}-byte swizzle")
            dst = int(s32(self.get(warp, op.dst)[lane:lane + 1, op.dst_index.data])[0]) + op.dst_offset.data
            repeat = max(128, 8 * tmap.swizzle)
            if dst % repeat:
                raise SimulationError(f"TMA destination {dst} is not aligned to its swizzle pattern ({repeat} bytes)")
            box = np.zeros((tmap.box_rows, tmap.box_cols), dtype=tmap.array.dtype)  # out of bounds: zeros
            rows, cols = matrix.shape
            r0, r1, c0, c1 = max(y, 0), min(y + tmap.box_rows, rows), max(x, 0), min(x + tmap.box_cols, cols)
            if r0 < r1 and c0 < c1:
                box[r0 - y:r1 - y, c0 - x:c1 - x] = matrix[r0:r1, c0:c1]
            data = np.ascontiguousarray(box).view(np.uint8).reshape(tmap.box_rows, row_bytes)
            chunks = data.reshape(-1, 16)  # 16-byte chunks move together under every swizzle
            linear = dst + 16 * np.arange(chunks.shape[0])
            bar_addr = int(s32(self.get(warp, op.bar)[lane:lane + 1, op.bar_index.data])[0]) + op.bar_offset.data
            for block in self._tma_destinations(warp, op, lane):
                bar = block._barrier(bar_addr)
                block.shared._check(linear, 16, "TMA destination")
                block._check_wgmma_reads(wg.swizzled(linear, tmap.swizzle), 16, "a TMA load")
                block._check_unread_ldmatrix(wg.swizzled(linear, tmap.swizzle), 16)
                bar.in_flight.append((wg.swizzled(linear, tmap.swizzle), chunks, box.nbytes))

    def _tma_destinations(self, warp: Warp, op: ptx.TmaLoadOp, lane: int) -> list[BlockSimulator]:
        """The blocks a TMA load lands in: this one, or with `.multicast::cluster` those its mask names."""
        if op.mask is None:
            return [self]
        mask = int(self.get(warp, op.mask)[lane, 0]) & 0xFFFF
        if mask >> len(self.cluster) or not mask:
            raise SimulationError(f"a TMA multicast to blocks {mask:#06b} of a cluster of {len(self.cluster)}")
        blocks = [self.cluster[r] for r in range(len(self.cluster)) if mask >> r & 1]
        for block in blocks:
            if block.exited:
                raise SimulationError(f"a TMA multicast into block {block.rank} of the cluster, which has exited")
        return blocks

    # Clusters ----------------------------------------------------------------------------------------------------

    def _mapa(self, addresses: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        """`mapa.shared::cluster`: this block's shared address in block `rank` of the cluster."""
        ranks = u32(ranks).astype(np.int64)
        if (ranks >= len(self.cluster)).any():
            raise SimulationError(f"mapa to block {int(ranks.max())} of a cluster of {len(self.cluster)}")
        offsets = u32(addresses).astype(np.int64)
        if (offsets >= CLUSTER_WINDOW).any():
            raise SimulationError("mapa of an address that is already a cluster address")
        return u32((ranks + 1) * CLUSTER_WINDOW + offsets)

    def _cluster_read(self, addresses: np.ndarray, nbytes: int, what: str) -> np.ndarray:
        """bytes [lane, nbytes] at each lane's shared::cluster address (in whichever block of the cluster)."""
        out = np.empty((len(addresses), nbytes), dtype=np.uint8)
        for i, address in enumerate(u32(addresses).astype(np.int64)):
            block, offset = self._in_cluster(int(address), what)
            out[i] = block.shared.read(np.array([offset]), nbytes, what)[0]
        return out

    def _in_cluster(self, address: int, what: str) -> tuple[BlockSimulator, int]:
        """(block, offset in its shared memory) of a shared::cluster address (a plain one is this block's)."""
        rank, offset = divmod(address, CLUSTER_WINDOW)
        block = self if rank == 0 else self.cluster[rank - 1] if rank <= len(self.cluster) else None
        if block is None:
            raise SimulationError(f"{what} at cluster address {address:#x}: no such block in the cluster")
        if block.exited:
            raise SimulationError(f"{what} reaches block {block.rank} of the cluster, which has exited")
        return block, offset

    def _cluster_arrive(self, warp: Warp) -> None:
        state = self.cluster_barrier
        if warp.cluster_arrival is not None:
            raise SimulationError(f"warp {warp.index} arrives at the cluster barrier twice without waiting")
        warp.cluster_arrival = state.rounds
        state.arrived += 1
        if state.arrived == state.warps:
            state.arrived = 0
            state.rounds += 1

    def _cluster_passed(self, warp: Warp) -> bool:
        if warp.cluster_arrival is None:
            raise SimulationError(f"warp {warp.index} waits at the cluster barrier without arriving")
        if self.cluster_barrier.rounds > warp.cluster_arrival:
            warp.cluster_arrival = None
            return True
        return False

    def tma_store(self, warp: Warp, op: ptx.TmaStoreOp) -> None:
        """Issue: which shared bytes the box comes from is fixed now; they are read (and the box written to
        global memory, clipped to the tensor) when a `cp.async.bulk.wait_group.read` covers the store."""
        for lane in self._active(warp, op):
            tmap, (x, y, *outer) = self._box(warp, op, lane)
            if len(outer) != tmap.array.ndim - 2:
                raise SimulationError(f"a {tmap.array.ndim}-D tensor map takes {tmap.array.ndim} coordinates")
            if y + tmap.box_rows <= 0:  # the H200 stops with an illegal instruction (no clipping to nothing)
                raise SimulationError(f"TMA store of a box wholly before row 0 (rows {y}..{y + tmap.box_rows - 1})")
            e = tmap.array.dtype.itemsize
            shape = tmap.array.shape
            inside = all(0 <= i < n for i, n in zip(outer[::-1], shape[:-2]))  # else the box writes nothing
            strides = np.cumprod((1, *shape[::-1]))[::-1][1:]  # elements, row-major: the outer dimensions' first
            matrix = tmap.address + e * sum(i * int(st) for i, st in zip(outer[::-1], strides[:-2]))
            row_bytes = tmap.box_cols * e
            src = int(s32(self.get(warp, op.src)[lane:lane + 1, op.src_index.data])[0]) + op.src_offset.data
            if src % max(128, 8 * tmap.swizzle):
                raise SimulationError(f"TMA store source {src} is not aligned to its swizzle pattern")
            linear = src + 16 * np.arange(tmap.box_rows * row_bytes // 16)
            chunks = wg.swizzled(linear, tmap.swizzle)
            self.shared._check(chunks, 16, "TMA store source")

            def complete(tmap: TensorMap = tmap, chunks: np.ndarray = chunks, x: int = x, y: int = y,
                         matrix: int = matrix, inside: bool = inside, reduce: bool = op.reduce is not None) -> None:
                data = self.shared.read(chunks, 16, "TMA store source").reshape(tmap.box_rows, row_bytes)
                rows, cols = tmap.array.shape[-2:]
                r0, r1, c0, c1 = max(y, 0), min(y + tmap.box_rows, rows), max(x, 0), min(x + tmap.box_cols, cols)
                for r in range(r0, r1 if inside else r0):
                    if c0 < c1:
                        addr = matrix + (r * cols + c0) * e
                        piece = np.ascontiguousarray(data[r - y, (c0 - x) * e:(c1 - x) * e])
                        if reduce:  # cp.reduce.async.bulk.tensor .add (f32): the box added to what is there
                            held = self.launch.global_memory.span(addr, piece.size, "TMA reduction")
                            piece = (held.view(np.float32) + piece.view(np.float32)).view(np.uint8)
                        self.launch.global_memory.write_span(addr, piece, "TMA store")

            reads = _halves(chunks, 16)
            warp.bulk_open.append((reads, complete))

    def bulk_group(self, warp: Warp, op: ptx.BulkGroupOp) -> None:
        kind = op.kind.data
        if kind == "commit":
            if warp.bulk_open:
                warp.bulk_groups.append(warp.bulk_open)
            warp.bulk_open = []
            return
        keep = op.pending.data  # type: ignore[union-attr]
        landing = warp.bulk_groups[:len(warp.bulk_groups) - keep] if keep else warp.bulk_groups
        warp.bulk_groups = warp.bulk_groups[len(landing):]
        for group in landing:
            for _, complete in group:
                complete()

    def wgmma(self, warp: Warp, op: ptx.WgmmaOp) -> None:
        """Issue: the descriptors and a register A are read now; shared memory is read when a wait_group covers
        the wgmma (as the tensor cores may read it any time until then), so a stage refilled too early shows."""
        n = op.n.data
        w = warp.index % 4  # this warp's rows of the 64-row tile: 16w .. 16w + 15

        def desc_of(value: SSAValue, index: int) -> int:
            bits = self.get(warp, value)[:, index]
            if not (bits == bits[0]).all():
                raise SimulationError("a wgmma descriptor differs between the lanes of a warp")
            return int(bits[0])

        def read(addresses: np.ndarray, dtype: str) -> np.ndarray:
            raw = self.shared.read(addresses.reshape(-1), OPERAND_BYTES[dtype], "wgmma operand").reshape(-1)
            return decode_operand(raw, dtype).reshape(addresses.shape)

        a_type, b_type = op.a_type.data, op.b_type.data
        if op.a_in_registers:
            a_index = op.table("a_index", 0)
            issued_words = self.get(warp, op.a)[:, a_index].copy()  # [32, 4] bf16x2

            def a_of() -> np.ndarray:
                # the tensor cores may read A's registers until the wait: they must not change before it
                words = self.get(warp, op.a)[:, a_index]
                if not np.array_equal(words, issued_words):
                    raise SimulationError(f"warp {warp.index} overwrites the registers of a wgmma's A operand "
                                          "before a wgmma.wait_group covers that wgmma")
                a_regs = np.zeros((16, 16), dtype=np.float32)
                rows, ks = wg.a_fragment()
                a_regs[rows[w * 32:(w + 1) * 32] - 16 * w, ks[w * 32:(w + 1) * 32]] = unpack16(words, a_type)
                return a_regs
        a_desc = None if op.a_in_registers else desc_of(op.a, int(op.table("a_index", 0)[0]))
        b_desc = desc_of(op.b, op.b_index.data)
        # the operands' addresses and the 2-byte units they read, by descriptors (a ring's stages repeat them)
        key = (a_desc, b_desc, n, bool(op.trans_a.data), bool(op.trans_b.data), a_type, b_type)
        found = self.launch.wgmma_addresses.get(key)
        if found is None:
            a_at = None if a_desc is None else wg.operand_addresses(a_desc, 64, "MN" if key[3] else "K",
                                                                    OPERAND_BYTES[a_type])
            b_at = wg.operand_addresses(b_desc, n, "MN" if key[4] else "K", OPERAND_BYTES[b_type])
            reads = b_at if a_at is None else np.concatenate([a_at.reshape(-1), b_at.reshape(-1)])
            found = self.launch.wgmma_addresses[key] = (a_at, b_at, np.unique(reads.reshape(-1) // 2))
        a_addresses, b_addresses, units_read = found
        if not op.a_in_registers:
            a_of = lambda: read(a_addresses, a_type)[16 * w:16 * w + 16]  # noqa: E731
        acc_index = op.table("acc_index", 0)
        if op.acc not in warp.wgmma_results:
            warp.wgmma_results[op.acc] = self.get(warp, op.acc).copy()  # C as the first wgmma of a chain finds it
        rows_, cols_ = wg.accumulator_fragment(n)
        r, c = rows_[w * 32:(w + 1) * 32] - 16 * w, cols_[w * 32:(w + 1) * 32]  # [32, n/2]
        scale_d = op.scale_d.data

        def complete() -> None:
            current = warp.wgmma_results[op.acc]
            D = a_of().astype(np.float32) @ read(b_addresses, b_type).astype(np.float32).T
            if scale_d:
                C = np.zeros((16, n), dtype=np.float32)
                C[r, c] = f32(current[:, acc_index])
                D = D + C
            result = current.copy()
            result[:, acc_index] = bits32(D[r, c])
            warp.wgmma_results[op.acc] = result

        poisoned = self.get(warp, op.acc).copy()
        poisoned[:, acc_index] = 0xFFFFFFFF  # NaN until a wgmma.wait_group covers this wgmma
        warp.regs[op.acc] = poisoned
        warp.wgmma_open.append((op.acc, complete, units_read))

    def _check_wgmma_reads(self, addresses: np.ndarray, nbytes: int, what: str) -> None:
        """A write (landing now or later) into shared memory that a wgmma or a TMA store not yet waited for reads
        is a race."""
        pending = [(other, reads) for other in self.warps for group in [*other.wgmma_groups, other.wgmma_open]
                   for *_, reads in group]
        pending += [(other, reads) for other in self.warps for group in [*other.bulk_groups, other.bulk_open]
                    for reads, _ in group]
        other = _first_reader(pending, addresses, nbytes)
        if other is not None:
            raise SimulationError(f"{what} writes shared memory that a wgmma or TMA store of warp {other.index} "
                                  f"still reads (not yet waited for)")

    def _check_unread_ldmatrix(self, addresses: np.ndarray, nbytes: int) -> None:
        """A TMA load (the async proxy) issued into shared memory that an ldmatrix (the generic proxy) of some warp
        may not have read yet, as nothing has used its registers: the mbarrier handing the stage over does not
        order the two (seen on the H200: a stage released right after its ldmatrix, refilled, read wrong)."""
        unread = [(other, units) for other in self.warps for _, units in other.ldmatrix_pending]
        other = _first_reader(unread, addresses, nbytes)
        if other is not None:
            raise SimulationError(f"a TMA load writes shared memory that an ldmatrix of warp {other.index} may "
                                  "not have read yet (nothing has used its registers)")

    def wgmma_sync(self, warp: Warp, op: ptx.WgmmaSyncOp) -> None:
        kind = op.kind.data
        if kind == "commit":
            warp.wgmma_groups.append(warp.wgmma_open)
            warp.wgmma_open = []
        elif kind == "wait":
            keep = op.pending.data  # type: ignore[union-attr]
            landing = warp.wgmma_groups[:len(warp.wgmma_groups) - keep] if keep else warp.wgmma_groups
            warp.wgmma_groups = warp.wgmma_groups[len(landing):]
            for group in landing:  # in issue order: the tensor cores read shared memory now at the latest
                for _, complete, _ in group:
                    complete()
            still = {e[0] for group in warp.wgmma_groups for e in group} | {e[0] for e in warp.wgmma_open}
            for group in landing:
                for acc, *_ in group:
                    if acc in warp.wgmma_results and acc not in still:
                        warp.regs[acc] = warp.wgmma_results.pop(acc)


# --------------------------------------------------------------------------------------------------------------
# Launching


def _dtype_name(array: np.ndarray) -> str:
    return {np.dtype(ml_dtypes.bfloat16): "bf16", np.dtype(np.float16): "f16", np.dtype(np.float32): "f32"}[array.dtype]


AHEAD_STEPS = 10_000  # order "ahead": how many times a block may advance before the next one moves


def run_cluster(blocks: list[BlockSimulator]) -> None:
    """Run the blocks of one cluster together, until all have exited. In order "ahead" each block runs as far as it
    can before the next one moves, the first block alternating (a block gets ahead of its peers: it passes a
    cluster barrier and goes on to its next stores while a peer has yet to read what the barrier published)."""
    rounds = 0
    while True:
        progress = False
        ahead = blocks[0].launch.order == "ahead"
        for block in blocks if rounds % 2 == 0 or not ahead else blocks[::-1]:
            for _ in range(AHEAD_STEPS if ahead else 1):
                if not block.advance():
                    break
                progress = True
        rounds += 1
        if all(block.exited for block in blocks):
            for block in blocks:
                block.advance()  # its exit checks
            return
        if not progress:
            raise next(block.hang() for block in blocks if not block.exited)


def simulate(module: ModuleOp, name: str, args: Sequence[Any], grid: int | Sequence[int], order: str = "ascending",
             seed: int = 0, shared_bytes: int | None = None) -> None:
    """Run `ptx.kernel` `name` on numpy arguments (tensors are updated in place; a `TensorMap` for each
    tensor-map parameter) over a grid."""
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
    tensor_maps: dict[int, TensorMap] = {}
    arrays: dict[str, np.ndarray] = {}
    kinds = dict(kernel.param_list)
    for pname in param_names:
        stem = pname.rsplit("_", 1)[0]
        if kinds[pname] == "tensormap":
            described = tensor_map_param(pname)
            if described is not None and described[0] in arrays:  # a compiled kernel's: built from its tensor
                source = arrays[described[0]]
                tensor, rows, cols, swizzle, stack = described
                tmap = TensorMap(source if stack else source.reshape(-1, source.shape[-1]), rows, cols, swizzle)
                tmap.address = params[f"{described[0]}_ptr"]  # the tensor's own bytes (TMA stores write them)
            else:
                tmap = next(arg_iter)
                if not isinstance(tmap, TensorMap):
                    raise TkcError(f"parameter {pname} is a tensor map: pass a simulator.TensorMap")
                tmap.address = memory.add(np.ascontiguousarray(tmap.array).view(np.uint8).reshape(-1).copy())
            params[pname] = TENSOR_MAP_BASE + 256 * len(tensor_maps)
            tensor_maps[params[pname]] = tmap
        elif pname.endswith("_ptr"):
            array = next(arg_iter)
            raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1).copy()
            base = memory.add(raw)
            params[pname] = base
            arrays[stem] = array
            itemsize = array.dtype.itemsize
            for d, (size, stride) in enumerate(zip(array.shape, array.strides)):
                params[f"{stem}_d{d}"] = size
                params[f"{stem}_s{d}"] = int(np.ascontiguousarray(array).strides[d] // itemsize)
            tensors.append((array, raw))
            seen.add(stem)
        elif stem in seen and (pname.startswith(stem + "_d") or pname.startswith(stem + "_s")):
            continue
        else:
            value = next(arg_iter)
            if isinstance(value, np.ndarray):  # a bare pointer parameter (hand-built kernels)
                raw = np.ascontiguousarray(value).view(np.uint8).reshape(-1).copy()
                tensors.append((value, raw))
                value = memory.add(raw)
            params[pname] = value
    if shared_bytes is None:
        smem = kernel.attributes.get("tkc.smem_bytes")
        shared_bytes = (smem.value.data if smem is not None else 0) + 1024  # type: ignore[union-attr]
    launch = Launch(params, memory, grid3, shared_bytes, order, seed, tensor_maps)
    size = kernel.cluster_blocks
    check_cluster_grid(grid3, size, name)
    for z in range(grid3[2]):
        for y in range(grid3[1]):
            for x in range(0, grid3[0], size):
                blocks = [BlockSimulator(kernel, launch, (x + r, y, z)) for r in range(size)]
                barrier = ClusterBarrier(sum(len(b.warps) for b in blocks))
                for rank, block in enumerate(blocks):
                    block.cluster, block.rank, block.cluster_barrier = blocks, rank, barrier
                run_cluster(blocks)
    for array, raw in tensors:
        array[...] = raw.view(array.dtype).reshape(array.shape)
