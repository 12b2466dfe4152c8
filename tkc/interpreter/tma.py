"""TMA loads (and the cp.async copies of a ring that mixes them in, stage_copy) and stage barriers in the tile
interpreter: a step's data lands in its ring stage at its `stage_wait`.

Each block keeps, per stage-barriers value, which steps were acquired, announced (bytes), loaded, waited for and
released. What would hang or race on the GPU is an error here, with the op's source line: waiting for a step
nothing fills, announcing a byte count the loads do not bring, refilling a stage before the step that used it
released it, releasing a step before waiting for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from xdsl.interpreter import Interpreter, InterpreterFunctions, PythonValues, impl, register_impls

from tkc.errors import TkcError
from tkc.interpreter.async_copies import Ring, _active_blocks, _per_block, gather_global
from tkc.interpreter.control import lane_state
from tkc.interpreter.lanes import block_uniform, round_to
from tkc.ir import tma_ops as m
from tkc.ir.ops import index_units


@dataclass
class _BlockSteps:
    acquired: set[int] = field(default_factory=set)
    expected: dict[int, int] = field(default_factory=dict)
    loads: dict[int, list[tuple[Ring, np.ndarray, int]]] = field(default_factory=dict)
    waited: set[int] = field(default_factory=set)
    released: set[int] = field(default_factory=set)


@dataclass
class StageBarriers:
    stages: int
    blocks: list[_BlockSteps]


def _steps(interpreter: Interpreter, op: m._StepOp | m.TmaLoadOp | m.StageCopyOp, bars: StageBarriers, step: np.ndarray,
           what: str) -> list[tuple[int, _BlockSteps, int]]:
    """(block, its bookkeeping, step) for every block running the op."""
    active = _active_blocks(interpreter, what)
    steps = _per_block(step, len(bars.blocks), f"the step of {what}")
    return [(b, bars.blocks[b], int(steps[b])) for b in np.nonzero(active)[0]]


def _free(state: _BlockSteps, k: int, stages: int) -> bool:
    return k < stages or (k - stages) in state.released


def _into_step(interpreter: Interpreter, op: m.TmaLoadOp | m.StageCopyOp, ring: Ring, bars: StageBarriers,
               step: np.ndarray, values: np.ndarray, nbytes: int, what: str) -> None:
    """Each running block's `values` (blocks × tile) to land in step k's stage at its wait, counting `nbytes` toward
    what stage_expect announced; the stage must have been acquired, and released by step k - stages (a producer
    warpgroup's loads run ahead here: the order is then the checker's and the simulator's to verify)."""
    ordered = not lane_state(interpreter).in_role()
    for b, state, k in _steps(interpreter, op, bars, step, what):
        if (ordered and not _free(state, k, bars.stages)) or (k >= bars.stages and k not in state.acquired):
            raise TkcError(f"{what} for step {k} refills a stage that step {k - bars.stages} has not released "
                           "(acquire it first)")
        state.loads.setdefault(k, []).append((ring, values[b].copy(), nbytes))


class TmaFunctions(InterpreterFunctions):
    @impl(m.StageBarriersOp)
    def run_barriers(self, interpreter: Interpreter, op: m.StageBarriersOp, args: PythonValues) -> PythonValues:
        blocks = lane_state(interpreter).blocks
        return (StageBarriers(op.result.type.stages.data, [_BlockSteps() for _ in range(blocks)]),)

    @impl(m.StageAcquireOp)
    def run_acquire(self, interpreter: Interpreter, op: m.StageAcquireOp, args: PythonValues) -> PythonValues:
        bars, step = args
        # a producer warpgroup runs ahead of its consumers (here: its whole loop first); the order of acquires and
        # releases is then the checker's and the simulator's to verify
        ordered = not lane_state(interpreter).in_role()
        for _, state, k in _steps(interpreter, op, bars, step, "stage_acquire"):
            if ordered and not _free(state, k, bars.stages):
                raise TkcError(f"stage_acquire for step {k}: step {k - bars.stages} has not released the stage "
                               "(on the GPU the producer would wait forever)")
            state.acquired.add(k)
        return ()

    @impl(m.StageExpectOp)
    def run_expect(self, interpreter: Interpreter, op: m.StageExpectOp, args: PythonValues) -> PythonValues:
        bars, step = args
        for _, state, k in _steps(interpreter, op, bars, step, "stage_expect"):
            if k in state.expected:
                raise TkcError(f"stage_expect for step {k} twice")
            state.expected[k] = op.nbytes.value.data
        return ()

    @impl(m.TmaLoadOp)
    def run_tma_load(self, interpreter: Interpreter, op: m.TmaLoadOp, args: PythonValues) -> PythonValues:
        source, *indices = args[: 1 + len(op.indices)]
        ring, bars, step = args[1 + len(op.indices):]
        blocks = len(bars.blocks)
        coords = [block_uniform(np.asarray(i), "the index of a TMA load") for i in indices]
        tile = op.tile
        gathered = gather_global(source, coords, tile.shape, index_units(op, tile.shape))
        values = round_to(np.broadcast_to(gathered[:, 0], (blocks, *tile.shape)), tile.element_type)
        _into_step(interpreter, op, ring, bars, step, values, op.nbytes, "a TMA load")
        return ()

    @impl(m.StageCopyOp)
    def run_stage_copy(self, interpreter: Interpreter, op: m.StageCopyOp, args: PythonValues) -> PythonValues:
        source, *indices = args[: 1 + len(op.indices)]
        extras = list(args[1 + len(op.indices): len(args) - 3])
        ring, bars, step = args[len(args) - 3:]
        end = block_uniform(np.asarray(extras.pop()), "a copy's end") if op.rows_end is not None else None
        rows = extras.pop() if op.row_index is not None else None
        blocks = len(bars.blocks)
        coords = [block_uniform(np.asarray(i), "the index of a stage copy") for i in indices]
        tile = op.tile
        gathered = gather_global(source, coords, tile.shape, index_units(op, tile.shape), rows, end)
        values = round_to(np.broadcast_to(gathered[:, 0], (blocks, *tile.shape)), tile.element_type)
        _into_step(interpreter, op, ring, bars, step, values, 0, "a stage copy")  # (its bytes are not announced)
        return ()

    @impl(m.StageWaitOp)
    def run_wait(self, interpreter: Interpreter, op: m.StageWaitOp, args: PythonValues) -> PythonValues:
        bars, step = args
        for b, state, k in _steps(interpreter, op, bars, step, "stage_wait"):
            if k in state.waited:
                continue
            if k not in state.expected:
                raise TkcError(f"stage_wait for step {k}, which nothing announced or filled (a hang on the GPU)")
            loads = state.loads.pop(k, [])
            brought = sum(n for *_, n in loads)
            if brought != state.expected[k]:
                raise TkcError(f"step {k}: stage_expect announced {state.expected[k]} bytes but its TMA loads bring "
                               f"{brought} (on the GPU: a hang, or a phase that completes before its data)")
            for ring, values, _ in loads:
                ring.buffers[b, k % bars.stages] = values
            state.waited.add(k)
        return ()

    @impl(m.StageReleaseOp)
    def run_release(self, interpreter: Interpreter, op: m.StageReleaseOp, args: PythonValues) -> PythonValues:
        bars, step = args
        for _, state, k in _steps(interpreter, op, bars, step, "stage_release"):
            if k not in state.waited:
                raise TkcError(f"stage_release for step {k} before waiting for it")
            state.released.add(k)
        return ()


register_impls(TmaFunctions)
