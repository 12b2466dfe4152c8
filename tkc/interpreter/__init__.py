"""The CPU oracle: run tile IR on numpy arrays, over a whole grid at once (see lanes.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp
from xdsl.interpreter import Interpreter
from xdsl.interpreters.func import FuncFunctions
from xdsl.ir import Operation
from xdsl.utils.exceptions import InterpretationError

from tkc.errors import KernelArgumentError, KernelTypeError, SourceLoc, TkcError, check_cluster_grid
from tkc.interpreter.async_copies import AsyncFunctions
from tkc.interpreter.control import ControlFunctions
from tkc.interpreter.lanes import GlobalTensor, LaneState, round_to
from tkc.interpreter.scalar import ScalarFunctions
from tkc.interpreter.tile import TileFunctions
from tkc.interpreter.tma import TmaFunctions
from tkc.ir.ops import cluster_size
from tkc.ir.types import GlobalType

if TYPE_CHECKING:
    from tkc.frontend.kernel import Kernel

_NUMPY_DTYPES = {"bf16": np.dtype(ml_dtypes.bfloat16), "f16": np.dtype(np.float16), "f32": np.dtype(np.float32),
                 "fp8e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "fp8e5m2": np.dtype(ml_dtypes.float8_e5m2),
                 "i32": np.dtype(np.int32), "i64": np.dtype(np.int64)}


class _CurrentOp(Interpreter.Listener):
    """Remembers the op being interpreted, so that an error can point at its source line."""

    def __init__(self) -> None:
        self.op: Operation | None = None

    def will_interpret_op(self, op: Operation, args: Any) -> None:
        self.op = op


def normalize_grid(grid: int | Sequence[int]) -> tuple[int, int, int]:
    dims = (grid,) if isinstance(grid, int) else tuple(grid)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int | np.integer) and d >= 1 for d in dims):
        raise KernelArgumentError(f"grid must be 1 to 3 positive integers, got {grid!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))  # type: ignore[return-value]


def _to_global(name: str, value: Any, gtype: GlobalType) -> GlobalTensor:
    from tkc.ir.types import element_name

    dtype_name = element_name(gtype.element_type)
    array = value
    if type(value).__module__.startswith("torch"):
        array = _torch_to_numpy(value, name)
    if not isinstance(array, np.ndarray):
        raise KernelTypeError(f"argument `{name}` must be a numpy array or a CPU torch tensor, got {type(value).__name__}")
    if array.dtype != _NUMPY_DTYPES[dtype_name]:
        raise KernelArgumentError(
            f"argument `{name}` must hold {dtype_name} ({_NUMPY_DTYPES[dtype_name]}), got {array.dtype}"
        )
    if array.ndim != gtype.rank:
        raise KernelArgumentError(f"argument `{name}` must have rank {gtype.rank}, got shape {array.shape}")
    working = np.int64 if array.dtype.kind == "i" else np.float32  # row numbers stay exact past 2**24
    return GlobalTensor(name, array.astype(working), gtype.element_type, value)


def _torch_to_numpy(tensor: Any, name: str) -> np.ndarray:
    import torch

    if tensor.device.type != "cpu":
        raise KernelArgumentError(f"argument `{name}`: the interpreter runs on the CPU; pass a CPU tensor")
    held_as = {torch.bfloat16: ml_dtypes.bfloat16, torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
               torch.float8_e5m2: ml_dtypes.float8_e5m2}.get(tensor.dtype)  # types numpy has not: their bytes
    if held_as is not None:
        return tensor.detach().contiguous().view(torch.uint8 if tensor.element_size() == 1 else torch.int16
                                                 ).numpy().view(held_as)
    return tensor.detach().numpy()


def _write_back(tensor: GlobalTensor) -> None:
    if not tensor.written:
        return
    result = round_to(tensor.data, tensor.element_type)
    target = tensor.user_array
    if isinstance(target, np.ndarray):
        target[...] = result.astype(target.dtype)
    else:
        import torch

        target.copy_(torch.from_numpy(result).to(target.dtype))


def run_function(module: ModuleOp, name: str, args: Sequence[Any], grid: int | Sequence[int]) -> None:
    """Run kernel `name` of a tile IR module on a grid. Tensor arguments are numpy arrays (ml_dtypes.bfloat16
    for bf16) or CPU torch tensors and are updated in place; scalar arguments are Python numbers."""
    fn = next((op for op in module.ops if isinstance(op, func.FuncOp) and op.sym_name.data == name), None)
    if fn is None:
        raise TkcError(f"no kernel named `{name}` in the module")
    warps_attr = fn.attributes.get("tkc.warps")
    warps = warps_attr.value.data if isinstance(warps_attr, IntegerAttr) else 1
    arg_names = [a.name_hint or f"arg{i}" for i, a in enumerate(fn.body.block.args)]
    types = fn.function_type.inputs.data
    if len(args) != len(types):
        raise KernelArgumentError(f"kernel `{name}` takes {len(types)} arguments ({', '.join(arg_names)}), got {len(args)}")
    values: list[Any] = []
    tensors: list[GlobalTensor] = []
    for arg_name, value, type_ in zip(arg_names, args, types):
        if isinstance(type_, GlobalType):
            tensor = _to_global(arg_name, value, type_)
            tensors.append(tensor)
            values.append(tensor)
        elif isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
            raise KernelTypeError(f"argument `{arg_name}` must be a number, got {type(value).__name__}")
        elif str(type_) == "i32":
            if not float(value).is_integer():
                raise KernelTypeError(f"argument `{arg_name}` must be an int, got {value!r}")
            values.append(np.full((1, 1), int(value), dtype=np.int64))
        else:
            values.append(np.full((1, 1), float(value), dtype=np.float32))

    current = _CurrentOp()
    interpreter = Interpreter(module, listeners=(current,))
    for functions in (FuncFunctions(), ScalarFunctions(), ControlFunctions(), TileFunctions(), AsyncFunctions(),
                      TmaFunctions()):
        interpreter.register_implementations(functions)
    grid3 = normalize_grid(grid)
    check_cluster_grid(grid3, cluster_size(fn), name)
    interpreter.set_data(LaneState, "state", LaneState(grid3, warps))
    try:
        interpreter.call_op(name, tuple(values))
    except TkcError as e:
        e.__notes__ = []  # xDSL attaches a dump of the whole module; the source line says more
        if e.loc is None and current.op is not None:
            e.loc = SourceLoc.from_attr(current.op.location)
        raise
    except (InterpretationError, FloatingPointError, IndexError, ValueError) as e:
        loc = SourceLoc.from_attr(current.op.location) if current.op is not None else None
        op_name = current.op.name if current.op is not None else "?"
        message = str(e).split("\n", 1)[0]
        raise TkcError(f"internal error interpreting {op_name}: {type(e).__name__}: {message}", loc) from None
    for tensor in tensors:
        _write_back(tensor)


def interpret_kernel(module: ModuleOp, kernel: Kernel, args: Sequence[Any], grid: int | Sequence[int]) -> None:
    run_function(module, kernel.name, args, grid)
