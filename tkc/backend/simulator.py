"""A CPU simulation of the `ptx` dialect: the oracle for lowering.

It runs a kernel block by block, warp by warp, with every lane's registers (numpy arrays of raw bits, one row per
lane), global tensors as bytes at made-up addresses (an access outside them is an error: an illegal address on
the GPU), and shared memory as bytes. Instruction semantics (ptx_semantics.py) come from the PTX ISA, written
independently of the lowering: the mma.m16n8k16 and ldmatrix fragment layouts there are the ISA's, not fragments.py's.

* `cp.async` reads its source when issued, but its bytes land in shared memory only at the issuing thread's
  `cp.async.wait_group` that covers its group (or, after `cp.async.mbarrier.arrive.noinc`, when the barrier's phase
  completes, the thread's arrival counting only then); until then the destination keeps its old (poisoned) bytes.
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

Here: the block (its warps' scheduling, barriers, and the sm_80 instructions) and `simulate`; the machine's state
in simulator_state.py, the sm_90a instructions in simulator_sm90.py, instruction semantics in ptx_semantics.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from tkc.backend import ptx
from tkc.backend.ptx_semantics import (LANES, SimulationError, bits32, execute, ldmatrix_x4, mma_m16n8k16, movmatrix_trans,
                                       s32, s64, u32, u64)
from tkc.backend.simulator_sm90 import Sm90Units
from tkc.backend.simulator_state import (TENSOR_MAP_BASE, ClusterBarrier, GlobalMemory, InstrPlan, Launch, Mbarrier,
                                         SharedMemory, TensorMap, Warp, bytes_to_words, halfword_units, words_to_bytes)
from tkc.ir.tma_ops import tensor_map_param
from tkc.errors import SourceLoc, TkcError, check_cluster_grid


class BlockSimulator(Sm90Units):
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
                words[lanes] = bytes_to_words(data, word).astype(np.uint32)
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
            data = words_to_bytes(words.astype(np.uint64 if word == 8 else np.uint32), word)
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
        warp.ldmatrix_pending.append((op.result, halfword_units(addrs, 16)))

    def mma(self, warp: Warp, op: ptx.MmaOp) -> None:
        dtype = "bf16" if ".bf16." in op.shape.data else "f16"
        a_, b_, c_ = (self.get(warp, v) for v in (op.a, op.b, op.c))
        d = c_.copy()  # (an instruction reads C from d: the earlier instructions' results where they wrote, else c)
        for row in op.instructions:
            di, ai, bi, ci = row[0:4], row[4:8], row[8:10], row[10:14]
            d[:, di] = mma_m16n8k16(a_[:, ai], b_[:, bi], d[:, ci], dtype)
        warp.regs[op.result] = d


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
