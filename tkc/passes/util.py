"""Small helpers shared by passes."""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import FunctionType, ModuleOp


def sync_function_types(module: ModuleOp) -> None:
    """After a pass retypes block arguments, make each function's type match its entry block again."""
    for op in module.walk():
        if isinstance(op, func.FuncOp) and op.body.blocks:
            inputs = [a.type for a in op.body.block.args]
            if list(op.function_type.inputs.data) != inputs:
                op.function_type = FunctionType.from_lists(inputs, list(op.function_type.outputs.data))
