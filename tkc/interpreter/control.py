"""scf.for / scf.if over lanes that may disagree: a loop runs as long as its longest lane and a branch runs for the
lanes that take it; lanes that are done keep their values (see lanes.py)."""

from __future__ import annotations

import numpy as np
from xdsl.dialects import scf
from xdsl.interpreter import (
    Interpreter,
    InterpreterFunctions,
    PythonValues,
    ReturnedValues,
    TerminatorValue,
    impl,
    impl_terminator,
    register_impls,
)
from xdsl.ir import Attribute

from tkc.errors import TkcError
from tkc.interpreter.lanes import LaneState, select
from tkc.ir.types import SharedTileType, SharedVecType

MAX_TRIPS = 1 << 20


def lane_state(interpreter: Interpreter) -> LaneState:
    return interpreter.get_data(LaneState, "state", lambda: None)  # type: ignore[no-any-return]


def _merge(cond: np.ndarray, new: object, old: object, result_type: Attribute, what: str) -> object:
    merged = select(cond, new, old)  # type: ignore[arg-type]
    if isinstance(result_type, SharedTileType | SharedVecType) and merged.shape[1] > 1:
        from tkc.interpreter.lanes import block_uniform

        return block_uniform(merged, f"a shared tile carried by {what}")
    return merged


@register_impls
class ControlFunctions(InterpreterFunctions):
    @impl(scf.ForOp)
    def run_for(self, interpreter: Interpreter, op: scf.ForOp, args: PythonValues) -> PythonValues:
        state = lane_state(interpreter)
        lb, ub, step, *carried = args
        step_value = int(np.asarray(step).flat[0])
        if not (np.asarray(step) == step_value).all() or step_value <= 0:
            raise TkcError("scf.for needs one positive step for all lanes")
        trips = np.maximum(-np.floor_divide(-(np.asarray(ub) - np.asarray(lb)), step_value), 0)
        active = state.active()
        longest = int((trips * active).max()) if trips.size else 0
        if longest > MAX_TRIPS:
            raise TkcError(f"a loop runs {longest} iterations; the interpreter stops at {MAX_TRIPS}")
        uniform = bool((trips == trips.flat[0]).all())
        values = list(carried)
        for k in range(longest):
            iv = np.asarray(lb) + k * step_value
            if uniform:
                values = list(interpreter.run_ssacfg_region(op.body, (iv, *values), "scf.for"))
                continue
            running = trips > k
            state.push_mask(running)
            try:
                new = interpreter.run_ssacfg_region(op.body, (iv, *values), "scf.for")
            finally:
                state.pop_mask()
            values = [_merge(running, n, o, r.type, "a loop") for n, o, r in zip(new, values, op.results)]
        return tuple(values)

    @impl(scf.IfOp)
    def run_if(self, interpreter: Interpreter, op: scf.IfOp, args: PythonValues) -> PythonValues:
        state = lane_state(interpreter)
        cond = np.asarray(args[0], dtype=bool)
        active = state.active()
        takes_then = bool((cond & active).any())
        takes_else = bool((~cond & active).any())
        if not takes_else or not takes_then:
            region = op.false_region if takes_else else op.true_region
            if not region.blocks:
                return ()
            return interpreter.run_ssacfg_region(region, (), "scf.if")
        role = "tkc.warp_role" in op.attributes  # warp specialization: each branch is a block of its own
        for branch_mask in (cond, ~cond):
            state.push_mask(branch_mask)
            if role:
                state.roles.append(branch_mask)
            try:
                if branch_mask is cond:
                    then_values = interpreter.run_ssacfg_region(op.true_region, (), "scf.if")
                else:
                    else_values = (interpreter.run_ssacfg_region(op.false_region, (), "scf.else")
                                   if op.false_region.blocks else ())
            finally:
                state.pop_mask()
                if role:
                    state.roles.pop()
        return tuple(_merge(cond, t, e, r.type, "an if") for t, e, r in zip(then_values, else_values, op.results))

    @impl_terminator(scf.YieldOp)
    def run_yield(
        self, interpreter: Interpreter, op: scf.YieldOp, args: PythonValues
    ) -> tuple[TerminatorValue, PythonValues]:
        return ReturnedValues(args), ()
