"""The sm_90a units of the simulated block (simulator.py's BlockSimulator takes them in): mbarriers and their
phases, TMA loads and stores (boxes landing swizzled, multicast into the blocks of a cluster), bulk groups,
cluster addresses (`mapa`) and `barrier.cluster`, and wgmma (operands read through their descriptors when issued,
accumulators landing at the `wgmma.wait_group` that covers them), with the checks that a TMA load or a store does
not overwrite bytes a wgmma or an ldmatrix may still read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from xdsl.ir import SSAValue

from tkc.backend import ptx
from tkc.backend import wgmma as wg
from tkc.backend.ptx_semantics import (LANES, OPERAND_BYTES, SimulationError, bits32, decode_operand, f32, s32, s64,
                                       u32, unpack16)
from tkc.backend.simulator_state import CLUSTER_WINDOW, Mbarrier, TensorMap, Warp, first_reader, halfword_units

if TYPE_CHECKING:
    from tkc.backend.simulator import BlockSimulator


class Sm90Units:
    """BlockSimulator's methods for the sm_90a instructions (a mixin: they use the block's registers, shared
    memory and cluster)."""

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
        for lanes, copies in bar.copies:  # cp.async copies land, and their threads' arrivals count, only now too
            bar.landing.extend(copies)
            bar.pending -= lanes
        bar.copies = []
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
        if kind == "cp_async_arrive":  # every cp.async this warp started and has not waited for
            if active.size != LANES:
                raise SimulationError("cp.async.mbarrier.arrive by some lanes of a warp only (not simulated)")
            copies = [copy for group in warp.groups for copy in group] + warp.open_group
            warp.groups, warp.open_group = [], []
            bar.copies.append((active.size, copies))
            return
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

            reads = halfword_units(chunks, 16)
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
        other = first_reader(pending, addresses, nbytes)
        if other is not None:
            raise SimulationError(f"{what} writes shared memory that a wgmma or TMA store of warp {other.index} "
                                  f"still reads (not yet waited for)")

    def _check_unread_ldmatrix(self, addresses: np.ndarray, nbytes: int) -> None:
        """A TMA load (the async proxy) issued into shared memory that an ldmatrix (the generic proxy) of some warp
        may not have read yet, as nothing has used its registers: the mbarrier handing the stage over does not
        order the two (seen on the H200: a stage released right after its ldmatrix, refilled, read wrong)."""
        unread = [(other, units) for other in self.warps for _, units in other.ldmatrix_pending]
        other = first_reader(unread, addresses, nbytes)
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
