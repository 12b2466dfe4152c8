"""`@tkc.kernel` and `@tkc.func`: Python functions that tkc compiles instead of running."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from xdsl.dialects import builtin, func
from xdsl.dialects.builtin import DictionaryAttr, FloatAttr, IntegerAttr, ModuleOp, StringAttr, UnitAttr, f32, i32
from xdsl.ir import Attribute, Block, Region

from tkc import lang
from tkc.errors import SourceLoc, TkcError, user_loc
from tkc.ir.ops import CLUSTER_ATTR
from tkc.targets import DEFAULT_TARGET, TARGETS, Target, get_target

_BoundLaunch: Any = None  # tkc.runtime.launch.BoundLaunch, imported on the first launch (compiling never needs it)

REQUIRED = inspect.Parameter.empty
MAX_CLUSTER = 16  # blocks in a cluster (`cluster=`): up to 8 every sm_90 GPU launches (the portable size); 9 to 16
# only where the GPU places them (the runtime opts in: NON_PORTABLE_CLUSTER_SIZE_ALLOWED; cuOccupancyMaxActiveClusters)


class SourceFunction:
    """A Python function's parsed source, with what is needed to map AST positions back to the file."""

    def __init__(self, fn: Callable[..., Any]):
        try:
            lines, first_line = inspect.getsourcelines(fn)
        except (OSError, TypeError) as e:
            raise TkcError(f"cannot read the source of `{fn.__name__}`: {e}") from None
        text = "".join(lines)
        dedented = textwrap.dedent(text)
        self.indent = len(lines[0]) - len(lines[0].lstrip()) if lines else 0
        self.filename = fn.__code__.co_filename
        self.first_line = first_line
        module = ast.parse(dedented)
        defs = [n for n in module.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        if not defs:
            raise TkcError(f"`{fn.__name__}` is not a plain function")
        self.tree: ast.FunctionDef = defs[0]  # type: ignore[assignment]
        if isinstance(self.tree, ast.AsyncFunctionDef):
            raise TkcError(f"`{fn.__name__}` must be a plain `def`, not `async def`", self.loc(self.tree))
        self.globals: dict[str, Any] = fn.__globals__
        self.closure: dict[str, Any] = {}
        if fn.__closure__:
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
                try:
                    self.closure[name] = cell.cell_contents
                except ValueError:
                    pass

    def loc(self, node: ast.AST) -> SourceLoc:
        return SourceLoc(self.filename, self.first_line + node.lineno - 1, node.col_offset + self.indent)  # type: ignore[attr-defined]


class Helper:
    """`@tkc.func`: a function that kernels call; it is inlined at each call with its arguments."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.name = fn.__name__
        self.signature = inspect.signature(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self._source: SourceFunction | None = None

    @property
    def source(self) -> SourceFunction:
        if self._source is None:
            self._source = SourceFunction(self.fn)
        return self._source

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TkcError(f"@tkc.func `{self.name}` can only be called from a kernel", user_loc())

    def __repr__(self) -> str:
        return f"<tkc.func {self.name}>"


def helper(fn: Callable[..., Any]) -> Helper:
    return Helper(fn)


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "tensor", "int", "float", "const"
    spec: lang.GlSpec | None
    default: Any
    loc: SourceLoc

    def resolved_spec(self, constants: Mapping[str, Any]) -> lang.GlSpec | None:
        """The tensor type with its dtype constant's value (`constants`: the kernel's resolved constants)."""
        if self.spec is None:
            return None
        try:
            return self.spec.resolve(dict(constants))
        except TkcError as e:  # a constant that is no dtype: point at the parameter it types
            e.loc = e.loc or self.loc
            raise

    def ir_type(self, constants: Mapping[str, Any]) -> Attribute:
        if self.kind == "tensor":
            return self.resolved_spec(constants).ir  # type: ignore[union-attr]
        return {"int": i32, "float": f32}[self.kind]


class Kernel:
    """A tile kernel. `build()` gives its tile IR, `interpret()` runs it on the CPU."""

    def __init__(self, fn: Callable[..., Any], warps: int | str, min_target: str, stages: int | str | None = None,
                 blocks_per_sm: int | str | None = None, producer: int | str | None = None,
                 tma_store: int | str | None = None, pingpong: int | str | None = None,
                 overlap: int | str | None = None, defer: int | str | None = None,
                 exp2_poly: int | str | None = None, late_sums: int | str | None = None,
                 stagger: int | str | None = None, late_pv: int | str | None = None, dependent_launch: bool = False,
                 cluster: int | str | None = None, split_ring: int | str | None = None,
                 mixed_ring: int | str | None = None):
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self.source = SourceFunction(fn)
        if min_target not in TARGETS:
            raise TkcError(
                f"@tkc.kernel(min_target=...) must be one of {', '.join(TARGETS)}, got {min_target!r}",
                self.decorator_loc("min_target"),
            )
        self.min_target = get_target(min_target)
        self.params = self._parse_params()
        self.warps = warps
        self.stages = stages
        self.blocks_per_sm = blocks_per_sm
        self.producer = producer
        self.tma_store = tma_store
        self.pingpong = pingpong
        self.overlap = overlap
        self.defer = defer
        self.exp2_poly = exp2_poly
        self.late_sums = late_sums
        self.stagger = stagger
        self.late_pv = late_pv
        self.split_ring = split_ring
        self.mixed_ring = mixed_ring
        self.cluster = cluster
        if not isinstance(dependent_launch, bool):
            raise TkcError(f"@tkc.kernel(dependent_launch=...) must be True or False, got {dependent_launch!r}",
                           self.decorator_loc("dependent_launch"))
        self.dependent_launch = dependent_launch  # a launch-time choice: the PTX is the same either way
        self._check_count("warps", warps, 1, 32)
        if producer is not None:
            self._check_count("producer", producer, 0, 2)
        if tma_store is not None:
            self._check_count("tma_store", tma_store, 0, 1)
        if pingpong is not None:
            self._check_count("pingpong", pingpong, 0, 1)
        if overlap is not None:
            self._check_count("overlap", overlap, 0, 1)
        if late_sums is not None:
            self._check_count("late_sums", late_sums, 0, 1)
        if stagger is not None:
            self._check_count("stagger", stagger, 0, 8)
        if late_pv is not None:
            self._check_count("late_pv", late_pv, 0, 1)
        if split_ring is not None:
            self._check_count("split_ring", split_ring, 0, 1)
        if mixed_ring is not None:
            self._check_count("mixed_ring", mixed_ring, 0, 1)
        if defer is not None:
            self._check_count("defer", defer, 0, 4)
        if exp2_poly is not None:
            self._check_count("exp2_poly", exp2_poly, 0, 64)
        if stages is not None:
            self._check_count("stages", stages, 1, 8)
        if blocks_per_sm is not None:
            self._check_count("blocks_per_sm", blocks_per_sm, 1, 32)
        if cluster is not None:
            self._check_count("cluster", cluster, 1, MAX_CLUSTER)

    def _check_count(self, keyword: str, value: Any, low: int, high: int) -> None:
        """`warps` / `stages`: a number, or the name of a const parameter that gives it."""
        if isinstance(value, str):
            if value not in self.constants:
                raise TkcError(f"@tkc.kernel({keyword}={value!r}) names no const parameter of `{self.name}`",
                               self.decorator_loc(keyword))
            return
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise TkcError(f"@tkc.kernel({keyword}=...) must be {low} to {high} (or the name of a const parameter), "
                           f"got {value!r}", self.decorator_loc(keyword))

    def _resolve_count(self, keyword: str, value: Any, constants: Mapping[str, Any], low: int, high: int) -> int:
        if not isinstance(value, str):
            return value
        n = constants[value]
        if not isinstance(n, int) or isinstance(n, bool) or not low <= n <= high:
            raise TkcError(f"kernel `{self.name}`: {keyword} comes from constant {value}, which must be {low} to {high}, "
                           f"got {n!r}", self.decorator_loc(keyword))
        return n

    def __repr__(self) -> str:
        return f"<tkc.kernel {self.name}>"

    def decorator_loc(self, keyword: str) -> SourceLoc:
        """Where `@tkc.kernel(keyword=...)` sets `keyword`; the `def` line if the decorator does not."""
        for deco in self.source.tree.decorator_list:
            if isinstance(deco, ast.Call):
                for kw in deco.keywords:
                    if kw.arg == keyword:
                        return self.source.loc(kw)
        return self.source.loc(self.source.tree)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TkcError(
            f"a kernel is launched with a grid: `{self.name}[grid](*args)`; on the CPU: `{self.name}.interpret(*args, grid=...)`",
            user_loc(),
        )

    def __getitem__(self, grid: Any) -> Any:
        """`kernel[grid](*args, **constants)`: launch on CUDA torch tensors, on torch's current stream."""
        global _BoundLaunch
        if _BoundLaunch is None:
            from tkc.runtime.launch import BoundLaunch as _BoundLaunch
        return _BoundLaunch(self, grid)

    def specialize(self, *, target: str | None = None, pipeline: str | None = None, **constants: Any) -> Any:
        """This kernel with its constants (and target, pipeline) given once: `spec = kernel.specialize(D=128)`,
        then `spec[grid](*args)`. Launches then skip reading and hashing the constants (hot loops, entry points)."""
        from tkc.runtime.launch import specialize

        return specialize(self, constants, target, pipeline)

    def resident_blocks(self, *args: Any, target: str | None = None, **constants: Any) -> int:
        """How many blocks of this kernel (for these arguments and constants) the GPU holds at once: the grid of a
        persistent kernel that strides over its work (`for i in range(block_idx()[0], n, num_blocks()[0])`)."""
        from tkc.runtime.launch import resident_blocks

        return resident_blocks(self, args, constants, target)

    # ----------------------------------------------------------------------------------------------------------

    def _parse_params(self) -> list[Param]:
        sig = inspect.signature(self.fn)
        nodes = {a.arg: a for a in self.source.tree.args.args}
        params = []
        for p in sig.parameters.values():
            node = nodes.get(p.name, self.source.tree)
            loc = self.source.loc(node)
            if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                raise TkcError(f"kernel parameter `{p.name}`: *args and **kwargs are not supported", loc)
            annotation = p.annotation
            if isinstance(annotation, str):
                try:
                    annotation = eval(annotation, self.source.globals, dict(self.source.closure))  # noqa: S307
                except Exception as e:
                    raise TkcError(f"kernel parameter `{p.name}`: cannot evaluate its annotation: {e}", loc) from None
            if isinstance(annotation, lang.GlSpec):
                kind, spec = "tensor", annotation
            elif annotation is int:
                kind, spec = "int", None
            elif annotation is float:
                kind, spec = "float", None
            elif annotation is lang.const:
                kind, spec = "const", None
            elif annotation is p.empty:
                raise TkcError(
                    f"kernel parameter `{p.name}` needs an annotation: gl[dtype, rank], int, float or const", loc
                )
            else:
                got = annotation.__name__ if isinstance(annotation, type) else repr(annotation)
                raise TkcError(f"kernel parameter `{p.name}`: {got} is not gl[dtype, rank], int, float or const", loc)
            if kind != "const" and p.default is not p.empty:
                raise TkcError(f"kernel parameter `{p.name}`: only `const` parameters take defaults", loc)
            params.append(Param(p.name, kind, spec, p.default, loc))
        consts = {p.name for p in params if p.kind == "const"}
        for p in params:
            if p.spec is not None and isinstance(p.spec.dtype, str) and p.spec.dtype not in consts:
                raise TkcError(f"kernel parameter `{p.name}`: {p.spec} takes its dtype from a const parameter "
                               f"`{p.spec.dtype}`, which `{self.name}` does not have", p.loc)
        return params

    @property
    def constants(self) -> dict[str, Any]:
        """The compile-time constants and their defaults (`inspect.Parameter.empty` where none)."""
        return {p.name: p.default for p in self.params if p.kind == "const"}

    @property
    def runtime_params(self) -> list[Param]:
        return [p for p in self.params if p.kind != "const"]

    def resolve_constants(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        values = {}
        for p in self.params:
            if p.kind != "const":
                continue
            value = overrides.get(p.name, p.default)
            if value is REQUIRED:
                raise TkcError(
                    f"kernel `{self.name}`: constant `{p.name}` has no default; give it one (`{p.name}: const = ...`) "
                    f"or a value when compiling (`-D {p.name}=...`, or `{p.name}=...` to build/interpret)",
                    p.loc,
                )
            values[p.name] = value
        unknown = set(overrides) - set(values)
        if unknown:
            raise TkcError(
                f"kernel `{self.name}` has no constant named {', '.join(sorted(unknown))}"
                + (f"; its constants are {', '.join(values)}" if values else "; it declares none"),
                self.source.loc(self.source.tree),
            )
        return values

    def check_target(self, target: Target) -> None:
        if target.sm < self.min_target.sm:
            raise TkcError(
                f"kernel `{self.name}` needs {self.min_target} or newer (min_target) and cannot compile for {target}; "
                f"compile for {self.min_target} (--target {self.min_target})",
                self.decorator_loc("min_target"),
            )

    def build_func(self, target: str | Target = DEFAULT_TARGET, constants: Mapping[str, Any] | None = None) -> func.FuncOp:
        """This kernel's tile IR for one target and one set of constants, as a `func.func`."""
        from tkc.frontend.checks import check_shared_memory, check_shared_versions
        from tkc.frontend.codegen import CodeGen

        target = get_target(target)
        self.check_target(target)
        values = self.resolve_constants(constants or {})
        cg = CodeGen(self.source, target.name)
        cg.cluster = 1 if self.cluster is None else self._resolve_count("cluster", self.cluster, values, 1, MAX_CLUSTER)
        runtime = self.runtime_params
        arg_types = [p.ir_type(values) for p in runtime]
        block = Block(arg_types=arg_types)
        for arg, p in zip(block.args, runtime):
            arg.location = p.loc.to_attr()
            arg.name_hint = p.name
        for p in self.params:
            cg.scope.vars[p.name] = values[p.name] if p.kind == "const" else block.args[runtime.index(p)]
        cg.start(block)
        cg.node = self.source.tree
        cg.build_body(self.source.tree.body)
        cg.node = None
        ret = func.ReturnOp()
        ret.location = _end_loc(self.source).to_attr()
        cg.builder.insert(ret)  # type: ignore[union-attr]
        fn = func.FuncOp(self.name, (arg_types, []), Region(block))
        fn.location = self.source.loc(self.source.tree).to_attr()
        fn.attributes["tkc.warps"] = IntegerAttr(self._resolve_count("warps", self.warps, values, 1, 32), 64)
        if self.stages is not None:
            fn.attributes["tkc.stages"] = IntegerAttr(self._resolve_count("stages", self.stages, values, 1, 8), 64)
        if self.blocks_per_sm is not None:  # from a constant, 0 leaves it to ptxas
            blocks = self._resolve_count("blocks_per_sm", self.blocks_per_sm, values, 0, 32)
            if blocks:
                fn.attributes["tkc.blocks_per_sm"] = IntegerAttr(blocks, 64)
        producer = 0 if self.producer is None else self._resolve_count("producer", self.producer, values, 0, 2)
        if producer:
            fn.attributes["tkc.producer"] = UnitAttr()
        if producer == 2:
            fn.attributes["tkc.lean_producer"] = UnitAttr()
        if self.tma_store is not None and self._resolve_count("tma_store", self.tma_store, values, 0, 1):
            fn.attributes["tkc.tma_store"] = UnitAttr()
        if self.pingpong is not None and self._resolve_count("pingpong", self.pingpong, values, 0, 1):
            fn.attributes["tkc.pingpong"] = UnitAttr()
        if self.overlap is not None and self._resolve_count("overlap", self.overlap, values, 0, 1):
            fn.attributes["tkc.overlap"] = UnitAttr()
        if self.late_sums is not None and self._resolve_count("late_sums", self.late_sums, values, 0, 1):
            fn.attributes["tkc.late_sums"] = UnitAttr()
        if self.late_pv is not None and self._resolve_count("late_pv", self.late_pv, values, 0, 1):
            fn.attributes["tkc.late_pv"] = UnitAttr()
        if self.split_ring is not None and self._resolve_count("split_ring", self.split_ring, values, 0, 1):
            fn.attributes["tkc.split_ring"] = UnitAttr()
        if self.mixed_ring is not None and self._resolve_count("mixed_ring", self.mixed_ring, values, 0, 1):
            fn.attributes["tkc.mixed_ring"] = UnitAttr()
        stagger = 0 if self.stagger is None else self._resolve_count("stagger", self.stagger, values, 0, 8)
        if stagger:
            fn.attributes["tkc.stagger"] = IntegerAttr(stagger, 64)
        defer = 0 if self.defer is None else self._resolve_count("defer", self.defer, values, 0, 4)
        if defer:
            fn.attributes["tkc.defer"] = UnitAttr()
        if defer >= 2:
            fn.attributes["tkc.peel"] = UnitAttr()
        if defer >= 3:
            fn.attributes["tkc.rotate"] = UnitAttr()
        if defer == 4:
            fn.attributes["tkc.rotate_step"] = UnitAttr()
        if self.exp2_poly is not None:
            every = self._resolve_count("exp2_poly", self.exp2_poly, values, 0, 64)
            if every:
                fn.attributes["tkc.exp2_poly"] = IntegerAttr(every, 64)
        cluster = cg.cluster
        if cluster > 1:
            if target.sm < 90:
                raise TkcError(f"kernel `{self.name}`: clusters of blocks (cluster={cluster}) need sm_90a, not "
                               f"{target.name}", self.decorator_loc("cluster"))
            fn.attributes[CLUSTER_ATTR] = IntegerAttr(cluster, 64)
        fn.attributes["tkc.min_target"] = StringAttr(self.min_target.name)
        if values:
            fn.attributes["tkc.constants"] = DictionaryAttr({k: _constant_attr(k, v) for k, v in values.items()})
        check_shared_memory(fn, target)
        check_shared_versions(fn)
        return fn

    def build(self, target: str | Target = DEFAULT_TARGET, **constants: Any) -> ModuleOp:
        """A module holding this kernel's tile IR (verified)."""
        return build_module([self], target, constants)

    def ptx(self, target: str | Target = DEFAULT_TARGET, **constants: Any) -> str:
        """This kernel's PTX (the default pipeline; `tkc compile --emit ptx`), with its line info (`.loc`)."""
        from tkc.compiler import compile_kernels

        return compile_kernels([self], get_target(target).name, constants)

    def sass(self, target: str | Target = DEFAULT_TARGET, **constants: Any) -> str:
        """The machine code ptxas makes of `ptx()` (nvdisasm), each run of instructions under the Python line it
        came from (`tkc compile --emit sass`; ptxas and nvdisasm from the nvidia-cuda-nvcc wheel)."""
        from tkc.backend.ptxas import sass_listing

        name = get_target(target).name
        return sass_listing(self.ptx(name, **constants), name)

    def interpret(self, *args: Any, grid: int | tuple[int, ...], target: str | Target | None = None, **constants: Any) -> None:
        """Run the kernel on the CPU with the tile IR interpreter. Tensors are numpy arrays (ml_dtypes.bfloat16
        for bf16) or CPU torch tensors; stores write into them."""
        from tkc.interpreter import interpret_kernel

        tgt = get_target(target) if target is not None else max(self.min_target, DEFAULT_TARGET, key=lambda t: t.sm)
        module = self.build(tgt, **constants)
        interpret_kernel(module, self, args, grid)


def _end_loc(source: SourceFunction) -> SourceLoc:
    last = source.tree.body[-1]
    return source.loc(last)


def _constant_attr(name: str, value: Any) -> Attribute:
    if isinstance(value, bool):
        return IntegerAttr(int(value), 1)
    if isinstance(value, int):
        return IntegerAttr(value, 64)
    if isinstance(value, float):
        return FloatAttr(value, builtin.f64)
    return StringAttr(repr(value))


def build_module(kernels: list[Kernel], target: str | Target, constants: Mapping[str, Any] | None = None) -> ModuleOp:
    """One module holding each kernel's tile IR. Each kernel takes the constants it declares from `constants`;
    a name no kernel declares is an error."""
    constants = dict(constants or {})
    target = get_target(target)
    declared = set().union(*(k.constants for k in kernels)) if kernels else set()
    unknown = set(constants) - declared
    if unknown:
        raise TkcError(
            f"no selected kernel declares a constant named {', '.join(sorted(unknown))}"
            + (f" (they declare {', '.join(sorted(declared))})" if declared else " (they declare none)"),
            kernels[0].source.loc(kernels[0].source.tree) if kernels else None,
        )
    funcs = [k.build_func(target, {n: v for n, v in constants.items() if n in k.constants}) for k in kernels]
    module = ModuleOp(funcs)
    module.attributes["tkc.target"] = StringAttr(target.name)
    return module


def kernel(fn: Callable[..., Any] | None = None, *, warps: int | str = 4, min_target: str = "sm_80",
           stages: int | str | None = None, blocks_per_sm: int | str | None = None, producer: int | str | None = None,
           tma_store: int | str | None = None, pingpong: int | str | None = None, overlap: int | str | None = None,
           defer: int | str | None = None, exp2_poly: int | str | None = None, late_sums: int | str | None = None,
           stagger: int | str | None = None, late_pv: int | str | None = None, dependent_launch: bool = False,
           cluster: int | str | None = None, split_ring: int | str | None = None,
           mixed_ring: int | str | None = None, **unknown: Any) -> Any:
    """Declare a tile kernel: `@tkc.kernel(warps=4, min_target="sm_80")`.

    Parameters are global tensors (`gl[bf16, 4]`), run-time scalars (`int`, `float`) and compile-time constants
    (`D: const = 64`). `warps` is the number of warps per block; `min_target` the oldest GPU it supports; `stages`
    the depth of the asynchronous pipelines of its loops (default: the pass's); `blocks_per_sm` asks ptxas to fit
    that many blocks on a multiprocessor (`.minnctapersm`: it caps the registers per thread); `producer=1` adds a
    producer warpgroup that issues the TMA loads of the pipelined loop while the kernel's warps compute
    (`specialize-warps`, sm_90a; it keeps 40 registers a thread, `producer=2` only 24, the rest going to the
    computing warps); `tma_store=1` stores register tiles to aligned 2-D tensors through shared memory
    and TMA (`insert-tma-stores`, sm_90a); `pingpong=1` has two warpgroups take turns at the tensor cores, one's
    wgmmas running while the other computes (`pingpong-warpgroups`, sm_90a); `overlap=1` issues a loop's first
    wgmma one step early, so that it runs while the step works on the previous result (`overlap-wgmma`, sm_90a);
    `defer=1` issues a loop's last wgmma in the next step, right behind its first, so that it runs while the step
    works on the first one's result (`defer-wgmma`, sm_90a: FlashAttention-3's overlap of P·V with the softmax;
    with `overlap=1` as well, the next step's first wgmma runs under the softmax too);
    `defer=2` also runs the loop's step 0 before it, without that step's P·V of a zero P (`peel-deferred-step`);
    `defer=3` also reads a tile loop's next queries and starts their first Q·Kᵀ under this tile's epilogue
    (`rotate-tile-loop`; the queries in registers); `defer=4` runs all of the next tile's step 0 there, its softmax
    under this tile's last P·V. `exp2_poly=N` computes every N-th element of a register tile's exp2 on the FMA
    pipe (a cubic in the fraction, the integer part added to the exponent; relative error ~1e-4, inputs below -127
    give ~0, NaN and +inf are not kept) instead of the multi-function unit, which does 16 a cycle per
    multiprocessor, so that a softmax-bound loop shares the work between both (FlashAttention-4's trick).
    `late_sums=1` leaves the lanes' partial row sums of a loop-carried sum (FlashAttention's l) apart until after
    the loop: one cross-lane reduction instead of one a step (`sum-rows-after-loop`). `stagger=N` starts the second
    of two warpgroups N key steps after the first, so that their tiles' ends (epilogue, step 0) fall apart
    (`stagger-warpgroups`, sm_90a). `late_pv=1` (with `defer`) issues the deferred wgmma after the step's row max
    instead of right behind the step's first. `split_ring=1` gives each of a pipelined loop's TMA loads barriers of
    its own (`insert-tma-pipeline`): each waited for where the step first reads it, released once its own readers are
    done (K after Q·Kᵀ, V a step late after the deferred P·V), so that a two-stage ring still loads a step ahead.
    `mixed_ring=1` (sm_90a) keeps a pipelined loop on its TMA ring where some of its loads cannot go by TMA (rows
    gathered by `rows_at`, or cut at an end): those become every thread's cp.async chunks counted on the ring's
    barriers (`tile.stage_copy`) instead of the whole loop falling back to a cp.async ring.
    These options may name a const parameter instead, e.g.
    `warps="WARPS"`. `dependent_launch=True` launches the kernel on sm_90 with programmatic dependent launch (its
    blocks may start while the kernel before it in the stream finishes, each waiting at its entry for that kernel's
    results: a short memory-bound kernel loses no launch gap to the one before it, though its waiting blocks may
    slow that one: bench/probe_dependent_launch.py); TKC_DEPENDENT_LAUNCH=1 or 0 turns it on or off for every kernel.
    `cluster=N` (sm_90a, 1 to 16; above 8 only where the GPU places such clusters: `resident_blocks` says how many)
    launches the blocks in clusters of N, consecutive in x (the grid's x a multiple of N; `cluster_rank()` is a
    block's place in its cluster): a global → shared load marked `multicast=True`, which
    every block of a cluster makes alike, is then copied once for the cluster by TMA, each block fetching 1/N of it
    for all (`insert-tma-pipeline`).
    """
    if unknown:
        raise TkcError(
            f"@tkc.kernel takes warps=..., min_target=..., stages=..., blocks_per_sm=..., producer=..., tma_store=..., pingpong=..., overlap=..., defer=..., exp2_poly=..., late_sums=..., stagger=..., late_pv=..., dependent_launch=..., cluster=..., split_ring=... and mixed_ring=..., not "
            f"{', '.join(f'{k}=' for k in unknown)}",
            user_loc(),
        )
    if fn is not None and not callable(fn):
        raise TkcError(f"@tkc.kernel takes only keyword arguments (warps=..., min_target=...), got {fn!r}", user_loc())
    if fn is not None:
        return Kernel(fn, warps, min_target, stages, blocks_per_sm, producer, tma_store, pingpong, overlap, defer,
                      exp2_poly, late_sums, stagger, late_pv, dependent_launch, cluster, split_ring, mixed_ring)
    return lambda f: Kernel(f, warps, min_target, stages, blocks_per_sm, producer, tma_store, pingpong, overlap, defer,
                            exp2_poly, late_sums, stagger, late_pv, dependent_launch, cluster, split_ring, mixed_ring)
