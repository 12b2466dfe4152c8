"""The simulated machine's state (simulator.py runs kernels over it): global tensors as bytes at made-up addresses
and shared memory as bytes, warps with their registers, the sm_90a objects (tensor maps, mbarriers, the cluster
barrier), and a launch's parameters with what it reads once for every block (each InstrOp's plan)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from xdsl.ir import Operation, SSAValue

from tkc.backend import ptx
from tkc.backend.ptx_semantics import LANES, SimulationError, bits32, parse_immediate, u32, u64

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


def bytes_to_words(data: np.ndarray, word: int) -> np.ndarray:
    """[lane, nbytes] → [lane, nbytes / word] little-endian words (zero-extended to 32 bits for 8- and 16-bit words)."""
    if word == 1:
        return data.astype(np.uint32)
    if word == 2:
        return data.view(np.uint16).astype(np.uint32)
    if word == 4:
        return data.view(np.uint32)
    return data.view(np.uint64)


def words_to_bytes(words: np.ndarray, word: int) -> np.ndarray:
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


def first_reader(readers: list[tuple[Any, np.ndarray]], addresses: np.ndarray, nbytes: int) -> Any:
    """The first of (warp, 2-byte units it reads) pairs whose units the accesses of `nbytes` at `addresses` touch,
    or None."""
    if not readers:
        return None
    halves = halfword_units(addresses, nbytes)
    return next((who for who, units in readers if _overlap(units, halves)), None)


def _overlap(units: np.ndarray, halves: np.ndarray) -> bool:
    """Whether two sorted arrays of distinct 2-byte units share one (binary search: no sort, unlike intersect1d)."""
    if not units.size or not halves.size or halves[-1] < units[0] or halves[0] > units[-1]:
        return False
    at = np.minimum(np.searchsorted(units, halves), units.size - 1)
    return bool((units[at] == halves).any())


def halfword_units(addresses: np.ndarray, nbytes: int) -> np.ndarray:
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
    # cp.async copies a warp's arrival (cp.async.mbarrier.arrive.noinc) waits for: (its lanes, their copies)
    copies: list[tuple[int, list[tuple[np.ndarray, np.ndarray]]]] = field(default_factory=list)


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
