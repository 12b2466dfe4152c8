"""The compile driver: frontend, then a pass pipeline, with IR dumps and pass timings one flag away."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import IO, Any, NoReturn

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.parser.core import ForwardDeclaredValue
from xdsl.passes import ModulePass, PassPipeline
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from tkc.errors import SourceLoc, TkcError
from tkc.passes import PASSES


def print_module(module: ModuleOp, debuginfo: bool = False) -> str:
    out = StringIO()
    Printer(stream=out, print_debuginfo=debuginfo).print_op(module)
    out.write("\n")
    return out.getvalue()


def parse_pipeline(spec: str) -> list[ModulePass]:
    """`pass-a,pass-b{opt=1}` → pass instances; unknown passes or options are a TkcError."""
    if not spec.strip():
        return []
    try:
        return list(PassPipeline.parse_spec(PASSES, spec).passes)
    except Exception as e:  # xDSL raises ValueError / custom errors for unknown names and bad options
        known = ", ".join(sorted(PASSES))
        raise TkcError(f"bad pipeline {spec!r}: {e} (passes: {known})") from None


def verify(module: ModuleOp, stage: str) -> None:
    check_values_in_scope(module, stage)
    try:
        module.verify()
    except VerifyException as e:
        raise TkcError(f"the IR after {stage} does not verify: {_verifier_message(e)}") from None


def check_values_in_scope(module: ModuleOp, stage: str) -> None:
    """Every operand is defined before its use, in the use's block or in a block around it (dominance, for regions
    of one block), and every loop, branch and function body ends in its terminator. xDSL's verifier checks neither:
    its parser accepts a value used above its definition in a nested region (an unresolved forward reference that
    its verifier then trips over) and an scf.for whose scf.yield is missing."""
    from xdsl.dialects import func, scf

    terminators = {scf.ForOp: scf.YieldOp, scf.IfOp: scf.YieldOp, func.FuncOp: func.ReturnOp}

    def fail(op: Operation, operand: Any) -> NoReturn:
        name = f"%{operand.name_hint}" if operand.name_hint else "a value"
        owner = getattr(operand, "owner", None) if not isinstance(operand, ForwardDeclaredValue) else None
        block = owner if isinstance(owner, Block) else owner.parent_block() if owner is not None else None
        user: Operation | None = op
        while user is not None and user.parent_block() is not block:
            user = user.parent_op()
        where = ("is not defined in its scope" if owner is None else "is defined after its use"
                 if user is not None else "is defined in a region that does not enclose its use")
        raise TkcError(f"the IR after {stage}: {op.name} uses {name}, which {where}", SourceLoc.from_attr(op.location))

    def check_block(block: Block, visible: set[SSAValue]) -> None:
        visible = visible | set(block.args)
        for op in block.ops:
            for operand in op.operands:
                if operand not in visible and not _in_multiblock_region(operand):
                    fail(op, operand)
            terminator = terminators.get(type(op))
            for region in op.regions:
                last = region.blocks[-1].last_op if region.blocks else None
                if terminator and region.blocks and not isinstance(last, terminator):
                    raise TkcError(f"the IR after {stage}: a region of {op.name} does not end in {terminator.name}",
                                   SourceLoc.from_attr(op.location))
                if isinstance(last, scf.YieldOp) and [v.type for v in last.operands] != [r.type for r in op.results]:
                    where = SourceLoc.from_attr(last.location) or SourceLoc.from_attr(op.location)  # implicit: none
                    raise TkcError(f"the IR after {stage}: {op.name} has {len(op.results)} results but a region of "
                                   f"it yields {len(last.operands)} values (or of other types)", where)
                for inner in region.blocks:
                    check_block(inner, visible)
            visible.update(op.results)

    for block in module.body.blocks:
        check_block(block, set())


def _in_multiblock_region(value: SSAValue) -> bool:
    """Defined in a region of several blocks, where dominance needs the control flow (not checked here)."""
    if isinstance(value, ForwardDeclaredValue):
        return False
    owner = value.owner
    block = owner if isinstance(owner, Block) else owner.parent_block()
    region = block.parent_region() if block is not None else None
    return region is not None and len(region.blocks) > 1


def _verifier_message(e: Exception) -> str:
    """xDSL's message without the dump of the module it appends (which starts at the first IR line)."""
    lines = []
    for line in str(e).splitlines():
        if line.lstrip().startswith(("builtin.module", '"builtin.module"', "^^^")) or line.startswith("  "):
            break
        lines.append(line.strip())
    return " ".join(line for line in lines if line) or str(e).splitlines()[0]


@dataclass
class Dumps:
    """Where the IR goes between stages: `--dump-ir-after-all` (stderr) and `--dump-dir DIR`."""

    after_all: bool = False
    directory: Path | None = None
    debuginfo: bool = False
    stream: IO[str] = field(default_factory=lambda: sys.stderr)
    stage: int = 0

    def stage_done(self, name: str, module: ModuleOp) -> None:
        if not self.after_all and self.directory is None:
            return
        text = print_module(module, self.debuginfo)
        if self.after_all:
            self.stream.write(f"// -----// IR Dump After {name} //----- //\n{text}\n")
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            (self.directory / f"{self.stage:02d}-{name}.mlir").write_text(text)
        self.stage += 1


@dataclass
class PassTimer:
    """`--time-passes`: seconds per stage, printed as a table."""

    enabled: bool = False
    times: list[tuple[str, float]] = field(default_factory=list)

    def record(self, name: str, seconds: float) -> None:
        self.times.append((name, seconds))

    def report(self) -> str:
        total = sum(s for _, s in self.times) or 1e-12
        lines = ["===-------------------------------------------------------------------------===",
                 "                         ... Pass execution timing report ...",
                 "===-------------------------------------------------------------------------===",
                 f"  Total Execution Time: {total:.4f} seconds", "",
                 "  ----Wall Time----  ----Name----"]
        for name, seconds in self.times:
            lines.append(f"    {seconds:.4f} ({100 * seconds / total:5.1f}%)  {name}")
        lines.append(f"    {total:.4f} (100.0%)  Total")
        return "\n".join(lines) + "\n"


def verify_each_pass(dumps: Dumps) -> bool:
    """Whether to verify the IR after every pass: with TKC_VERIFY_EACH=1 (`--verify-each`) or an IR dump asked for.
    Else only after the last pass: xDSL's verifier run after each of the ~20 passes was about 40 % of a kernel's
    compile (attention_sm90: 0.29 s with it, 0.14 s without), and the frontend verifies each op it builds."""
    return os.environ.get("TKC_VERIFY_EACH", "0") not in ("", "0") or dumps.after_all or dumps.directory is not None


def run_passes(module: ModuleOp, passes: list[ModulePass], dumps: Dumps, timer: PassTimer,
               verify_each: bool | None = None) -> None:
    from tkc.ir import make_context

    if verify_each is None:
        verify_each = verify_each_pass(dumps)
    ctx = make_context()
    for i, p in enumerate(passes):
        start = time.perf_counter()
        try:
            p.apply(ctx, module)
        except TkcError:
            raise
        except VerifyException as e:
            raise TkcError(f"pass {p.name} failed: {str(e).splitlines()[0]}") from e
        timer.record(p.name, time.perf_counter() - start)
        if verify_each:
            verify(module, f"pass {p.name}")
        elif i == len(passes) - 1:  # which pass broke it: TKC_VERIFY_EACH=1 tells
            verify(module, f"the pipeline (its last pass {p.name}; TKC_VERIFY_EACH=1 verifies after every pass)")
        dumps.stage_done(p.name, module)


def compile_kernels(
    kernels: list[Any],
    target: str,
    constants: Mapping[str, Any] | None = None,
    pipeline: str | None = None,
    emit: str = "ptx",
    dumps: Dumps | None = None,
    timer: PassTimer | None = None,
    verify_each: bool | None = None,
) -> str:
    """Compile kernels into one module and return its text: tile IR (emit="tile") or PTX. `verify_each`: verify
    the IR after every pass (default: verify_each_pass)."""
    from tkc.frontend.kernel import build_module

    dumps = dumps or Dumps()
    timer = timer or PassTimer()
    if emit not in ("tile", "ptx"):
        raise TkcError(f"--emit must be tile or ptx, got {emit!r}")
    if pipeline is None:
        pipeline = default_pipeline(target) if emit == "ptx" else ""
    passes = parse_pipeline(pipeline)
    start = time.perf_counter()
    module = build_module(kernels, target, constants)
    timer.record("frontend", time.perf_counter() - start)
    dumps.stage_done("frontend", module)
    run_passes(module, passes, dumps, timer, verify_each)
    if emit == "tile":
        return print_module(module, dumps.debuginfo)
    return emit_ptx_text(module, target, dumps, timer)


def default_pipeline(target: str, stages: int | None = None) -> str:
    """The passes from frontend IR to the ptx dialect (`stages`: pipeline depth; default: each kernel's own)."""
    return ",".join([
        "canonicalize",
        "cse",
        "sum-rows-after-loop",
        "overlap-wgmma",
        "insert-tma-pipeline" + (f"{{stages={stages}}}" if stages is not None else ""),
        "defer-wgmma",
        "specialize-warps",
        "insert-tma-stores",
        "peel-deferred-step",
        "rotate-tile-loop",
        "verify-tma-pipeline",
        "pingpong-warpgroups",
        "stagger-warpgroups",
        "insert-async-pipeline" + (f"{{stages={stages}}}" if stages is not None else ""),
        "assign-layouts",
        "assign-swizzles",
        "allocate-shared",
        "insert-barriers",
        "unroll-overlapped-loop",
        "lower-to-ptx",
    ])


def emit_ptx_text(module: ModuleOp, target: str, dumps: Dumps, timer: PassTimer) -> str:
    from tkc.backend.ptx import KernelOp
    from tkc.backend.ptx_printer import emit_ptx

    if not any(isinstance(op, KernelOp) for op in module.ops):
        raise TkcError("--emit ptx needs a pipeline that ends with lower-to-ptx")
    start = time.perf_counter()
    text = emit_ptx(module, target)
    timer.record("emit-ptx", time.perf_counter() - start)
    if dumps.directory is not None:
        dumps.directory.mkdir(parents=True, exist_ok=True)
        (dumps.directory / f"{dumps.stage:02d}-kernel.ptx").write_text(text)
    return text


def location_of(error: Exception) -> SourceLoc | None:
    return getattr(error, "loc", None)


Callback = Callable[[str, ModuleOp], None]


def specialize_alignment(module: ModuleOp, aligns: Mapping[str, int]) -> None:
    """Record, per tensor argument, the bytes that divide its address, strides and row length (default 16): the
    lowering picks vector widths from it, so a launch must use a variant its tensors satisfy."""
    from xdsl.dialects import func
    from xdsl.dialects.builtin import ArrayAttr, IntegerAttr

    for fn in module.ops:
        if isinstance(fn, func.FuncOp):
            names = [a.name_hint for a in fn.body.block.args]
            fn.attributes["tkc.arg_align"] = ArrayAttr([IntegerAttr(int(aligns.get(n or "", 16)), 64) for n in names])


def tensor_alignment(array: Any) -> int:
    """The largest of 16, 8, 4, 2, 1 bytes dividing a tensor's address (numpy: its data pointer), its strides
    (but the last) and its row length."""
    itemsize = array.dtype.itemsize
    values = [array.shape[-1] * itemsize] + [s for s in array.strides[:-1]]
    if hasattr(array, "ctypes"):
        values.append(array.ctypes.data)
    for align in (16, 8, 4, 2):
        if all(v % align == 0 for v in values):
            return align
    return 1


def lower_kernel(kernel: Any, target: str = "sm_80", constants: Mapping[str, Any] | None = None,
                 pipeline: str | None = None, aligns: Mapping[str, int] | None = None) -> ModuleOp:
    """A kernel's module after the pipeline (default: all the way to the ptx dialect), for the simulator and tests."""
    from tkc.frontend.kernel import build_module

    module = build_module([kernel], target, constants)
    specialize_alignment(module, aligns or {})
    run_passes(module, parse_pipeline(default_pipeline(target) if pipeline is None else pipeline), Dumps(), PassTimer())
    return module


@dataclass(frozen=True)
class CompiledKernel:
    """What a launch needs: the PTX of one kernel and how to call it."""

    name: str
    ptx: str
    params: list[tuple[str, str]]  # (name, PTX type) in order
    threads: int
    shared_bytes: int  # dynamic shared memory to request (the kernel's buffers + 1 KB to align them)
    dependent_launch: bool = False  # it waits for the kernels before it itself (griddepcontrol.wait, sm_90)
    cluster: int = 1  # blocks per cluster along x (.reqnctapercluster): the launch must say so too

    def meta(self) -> dict[str, Any]:
        return {"name": self.name, "params": self.params, "threads": self.threads, "shared_bytes": self.shared_bytes,
                "dependent_launch": self.dependent_launch, "cluster": self.cluster}


def compile_for_launch(kernel: Any, target: str, constants: Mapping[str, Any], aligns: Mapping[str, int],
                       pipeline: str | None = None) -> CompiledKernel:
    """Frontend → PTX for one kernel, specialized to its tensors' alignment."""
    from tkc.backend.ptx import GridDependencyOp, KernelOp
    from tkc.backend.ptx_printer import emit_ptx
    from tkc.passes.allocate_shared import ALIGNMENT_PAD

    module = lower_kernel(kernel, target, constants, pipeline, aligns)
    ptx_kernel = next(op for op in module.walk() if isinstance(op, KernelOp))
    smem = ptx_kernel.attributes.get("tkc.smem_bytes")
    shared = smem.value.data if smem is not None else 0  # type: ignore[attr-defined]
    return CompiledKernel(
        name=ptx_kernel.sym_name.data,
        ptx=emit_ptx(module, target),
        params=[tuple(p) for p in ptx_kernel.param_list],  # type: ignore[misc]
        threads=ptx_kernel.threads.data,
        shared_bytes=shared + ALIGNMENT_PAD if shared else 0,
        dependent_launch=any(isinstance(op, GridDependencyOp) for op in ptx_kernel.body.block.ops),
        cluster=ptx_kernel.cluster_blocks,
    )
