"""Run a kernel's tile IR through the interpreter before and after passes."""

from __future__ import annotations

from typing import Any

import numpy as np

from tkc.compiler import Dumps, PassTimer, parse_pipeline, run_passes
from tkc.frontend.kernel import Kernel, build_module
from tkc.interpreter import run_function


def interpret_module(module: Any, name: str, args: list[Any], grid: Any) -> list[Any]:
    copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    run_function(module, name, copies, grid)
    return copies


def before_and_after(kernel: Kernel, pipeline: str, args: list[Any], grid: Any, constants: dict | None = None,
                     target: str = "sm_80", prefix: str = "") -> tuple[list[Any], list[Any], Any]:
    """Interpret the kernel's IR after `prefix` and again after `prefix` + `pipeline`."""
    module = build_module([kernel], target, constants)
    run_passes(module, parse_pipeline(prefix), Dumps(), PassTimer())
    before = interpret_module(module, kernel.name, args, grid)
    run_passes(module, parse_pipeline(pipeline), Dumps(), PassTimer())
    after = interpret_module(module, kernel.name, args, grid)
    return before, after, module
