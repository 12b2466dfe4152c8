"""`@tkc.autotune`: pick a kernel's constants by timing them on the GPU, once per problem.

    @tkc.autotune(configs=[{"ROWS": 64}, {"ROWS": 128, "STAGES": 3}], key=["X"])
    @tkc.kernel(warps=4)
    def k(X: gl[bf16, 2], Y: gl[bf16, 2], ROWS: const = 64, STAGES: const = 2): ...

    k[lambda c: (-(-m // c["ROWS"]),)](x, y)      # the grid may depend on the config

The first launch for a key (the shapes, dtypes and strides of the tensors named in `key`, the values of the numbers
named there; by default every tensor argument and no number; and the constants passed at the call) launches every config on the
call's own arguments and times it with CUDA events (after a launch that compiles it and warms up), then launches the
fastest; later launches for that key go straight to it. A config that does not compile or load for this GPU (shared
memory over the budget, a tile that does not fit) is left out, with its error kept; if none runs, the first config's
error is raised. Tuning runs the kernel many times on the call's arguments: name in `restore` the tensors it reads
after writing (accumulators), and they are put back before each config's runs and before the real launch.

What was measured stays visible: `k.report()` prints each key's configs with their times (or errors), and
`TKC_AUTOTUNE_VERBOSE=1` prints it as each key is tuned. Results live in the process (no disk cache).
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tkc.errors import TkcError


class Autotuned:
    """A kernel with configs to choose from: `tuned[grid](*args, **constants)` as `kernel[grid]`; `grid` may be a
    function of the config (every constant of the launch: the defaults, the call's over them, the config's over
    those)."""

    def __init__(self, kernel: Any, configs: Sequence[Mapping[str, Any]], key: Sequence[str] | None = None,
                 restore: Sequence[str] = (), rounds: int = 5, launches: int = 10):
        from tkc.frontend.kernel import Kernel

        if not isinstance(kernel, Kernel):
            raise TkcError("@tkc.autotune goes above @tkc.kernel (it tunes a kernel's constants)")
        self.kernel = kernel
        where = kernel.source.loc(kernel.source.tree)
        if not configs:
            raise TkcError(f"@tkc.autotune on `{kernel.name}`: no configs to choose from", where)
        constants = kernel.constants
        for i, config in enumerate(configs):
            unknown = [name for name in config if name not in constants]
            if not isinstance(config, Mapping) or unknown:
                raise TkcError(f"@tkc.autotune on `{kernel.name}`: config {i} ({config!r}) sets "
                               f"{', '.join(map(repr, unknown)) or 'nothing it can'}; the kernel's constants are "
                               f"{', '.join(constants) or 'none'}", where)
        params = [p.name for p in kernel.runtime_params]
        tensors = [p.name for p in kernel.runtime_params if p.kind == "tensor"]
        for what, names, allowed in (("key", key or (), params), ("restore", restore, tensors)):
            for name in names:
                if name not in allowed:
                    raise TkcError(f"@tkc.autotune on `{kernel.name}`: {what} names `{name}`, which is not one of its "
                                   f"run-time {'parameters' if what == 'key' else 'tensors'} ({', '.join(allowed)})",
                                   where)
        self.configs = [dict(c) for c in configs]
        self.key = list(key) if key is not None else tensors
        self.restore = list(restore)
        self.rounds, self.launches = rounds, launches
        self.params = params
        self.results: dict[tuple, list[tuple[dict[str, Any], float | str]]] = {}  # key → (config, ms or error)
        self.best: dict[tuple, dict[str, Any]] = {}

    def __getattr__(self, name: str) -> Any:  # build, ptx, sass, interpret, specialize: the kernel's own
        if name == "kernel":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.kernel, name)

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, target: str | None = None, pipeline: str | None = None, **constants: Any) -> None:
            self._launch(grid, args, constants, target, pipeline)

        return launch

    def _problem(self, args: Sequence[Any], constants: Mapping[str, Any], target: str | None,
                 pipeline: str | None) -> tuple:
        parts: list[Any] = []
        for name, value in zip(self.params, args):
            if name not in self.key:
                continue
            if hasattr(value, "shape") and hasattr(value, "stride"):
                parts.append((name, tuple(value.shape), str(value.dtype), tuple(value.stride()), str(value.device)))
            else:
                parts.append((name, value))
        return (tuple(parts), tuple(sorted((k, repr(v)) for k, v in constants.items())), target, pipeline)

    def _launch(self, grid: Any, args: Sequence[Any], constants: dict[str, Any], target: str | None,
                pipeline: str | None) -> None:
        problem = self._problem(args, constants, target, pipeline)
        best = self.best.get(problem)
        if best is None:
            best = self._tune(problem, grid, args, constants, target, pipeline)
        merged = {**constants, **best}
        self.kernel[self._grid(grid, merged)](*args, target=target, pipeline=pipeline, **merged)

    def _grid(self, grid: Any, constants: dict[str, Any]) -> Any:
        return grid(self.kernel.resolve_constants(constants)) if callable(grid) else grid

    def _tune(self, problem: tuple, grid: Any, args: Sequence[Any], constants: dict[str, Any], target: str | None,
              pipeline: str | None) -> dict[str, Any]:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise TkcError(f"`{self.kernel.name}`: autotuning launches and times each config, which a CUDA graph "
                           "capture cannot do: launch it once for these shapes before capturing")
        saved = {i: args[i].clone() for i, name in enumerate(self.params) if name in self.restore and i < len(args)}

        def put_back() -> None:
            for i, copy in saved.items():
                args[i].copy_(copy)

        results: list[tuple[dict[str, Any], float | str]] = []
        first_error: TkcError | None = None
        for config in self.configs:
            merged = {**constants, **config}

            def run(merged: dict[str, Any] = merged) -> None:
                self.kernel[self._grid(grid, merged)](*args, target=target, pipeline=pipeline, **merged)

            put_back()
            try:
                ms = _time_ms(run, self.rounds, self.launches)
            except TkcError as e:  # this config does not compile or load here; the arguments' own errors fail all
                first_error = first_error or e
                where = f"{e.loc}: " if e.loc is not None else ""
                results.append((config, where + e.message.splitlines()[0]))
                continue
            results.append((config, ms))
        put_back()
        self.results[problem] = results
        timed = [(ms, i) for i, (_, ms) in enumerate(results) if isinstance(ms, float)]
        if not timed:
            assert first_error is not None
            raise first_error
        best = results[min(timed)[1]][0]
        self.best[problem] = best
        if os.environ.get("TKC_AUTOTUNE_VERBOSE") == "1":
            sys.stderr.write(self._report_one(problem))
        return best

    def report(self) -> str:
        """Each tuned key's configs with their times (ms a launch) or why they did not run; the chosen one marked."""
        return "".join(self._report_one(problem) for problem in self.results)

    def _report_one(self, problem: tuple) -> str:
        args, constants, target, pipeline = problem
        shapes = ", ".join(f"{a[0]} {'×'.join(map(str, a[1]))} {a[2]}" if len(a) > 2 else f"{a[0]}={a[1]!r}"
                           for a in args)
        lines = [f"tkc autotune `{self.kernel.name}` ({shapes}{', ' if constants else ''}"
                 f"{', '.join(f'{k}={v}' for k, v in constants)}{f', target {target}' if target else ''}"
                 f"{f', pipeline {pipeline}' if pipeline else ''}):\n"]
        best = self.best.get(problem)
        for config, ms in self.results[problem]:
            mark = "*" if config == best else " "
            what = f"{ms:9.4f} ms" if isinstance(ms, float) else f"  not run: {ms}"
            lines.append(f"  {mark} {what}  {config}\n")
        return "".join(lines)


def _time_ms(run: Callable[[], None], rounds: int, launches: int) -> float:
    """Milliseconds a launch: the median over `rounds` of `launches` back-to-back launches between two CUDA events,
    after one launch that compiles and warms up."""
    import torch

    run()
    torch.cuda.synchronize()
    means = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(launches):
            run()
        end.record()
        end.synchronize()
        means.append(start.elapsed_time(end) / launches)
    return statistics.median(means)


def autotune(configs: Sequence[Mapping[str, Any]], key: Sequence[str] | None = None, restore: Sequence[str] = (),
             rounds: int = 5, launches: int = 10) -> Callable[[Any], Autotuned]:
    """`@tkc.autotune(configs=[{...}, ...], key=[...], restore=[...])` above `@tkc.kernel`: see this module."""
    def wrap(kernel: Any) -> Autotuned:
        return Autotuned(kernel, configs, key, restore, rounds, launches)

    return wrap
