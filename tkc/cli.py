"""The `tkc` command: `tkc compile` (Python kernels → IR/PTX) and `tkc opt` (textual IR → passes → IR)."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import linecache
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

from tkc._version import __version__
from tkc.diagnostics import TkcWarning
from tkc.errors import SourceLoc, TkcError
from tkc.targets import DEFAULT_TARGET, TARGETS


def _add_dump_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dump-ir-after-all", action="store_true", help="print the IR after every stage to stderr")
    p.add_argument("--dump-dir", metavar="DIR", help="write NN-STAGE.mlir for every stage into DIR")
    p.add_argument("--time-passes", action="store_true", help="print the time each stage took to stderr")
    p.add_argument("--print-debuginfo", action="store_true", help="print source locations, loc(\"file\":line:col)")
    p.add_argument("--werror", action="store_true", help="treat warnings (e.g. bank conflicts) as errors")
    # SUPPRESS: without it the subcommand's default (False) would override `tkc --traceback compile ...`
    p.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS,
                   help="show Python tracebacks of errors")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tkc",
        description="tkc: compile ThunderKittens-style tile kernels written in Python to PTX.",
    )
    parser.add_argument("--version", action="version", version=f"tkc {__version__}")
    parser.add_argument("--traceback", action="store_true", help="show Python tracebacks of errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser("compile", help="compile the kernels of a Python file", description="Compile the @tkc.kernel "
                       "functions of FILE into one module and print it (tile IR or PTX).")
    c.add_argument("file", metavar="FILE", help="a Python file defining @tkc.kernel functions")
    c.add_argument("--kernel", metavar="NAME", help="compile only this kernel (default: every kernel in FILE)")
    c.add_argument("--target", choices=list(TARGETS), default=DEFAULT_TARGET.name, help="GPU to compile for (default %(default)s)")
    c.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE", help="set a compile-time constant")
    c.add_argument("--emit", choices=["tile", "ptx", "sass"], default="ptx",
                   help="what to print (default %(default)s; sass: ptxas's machine code as nvdisasm prints it, each run "
                        "of instructions under the Python line it came from)")
    c.add_argument("-o", dest="output", metavar="OUT", default="-", help="output file (default: stdout)")
    c.add_argument("--pipeline", metavar="SPEC", default=None, help="passes to run after the frontend, e.g. 'canonicalize,cse'")
    c.add_argument("--resources", action="store_true",
                   help="assemble the PTX with ptxas and print each kernel's registers, spills, stack and shared "
                        "memory to stderr")
    c.add_argument("--verify-each", action="store_true",
                   help="verify the IR after every pass, naming the pass that broke it (default: after the last; "
                        "TKC_VERIFY_EACH=1; `tkc opt` always does)")
    _add_dump_flags(c)

    o = sub.add_parser("opt", help="run passes over textual tile IR", description="Parse FILE.mlir (or - for stdin), "
                       "run the passes of SPEC and print the result.")
    o.add_argument("file", metavar="FILE.mlir", nargs="?", help="textual IR, or - for stdin")
    o.add_argument("-p", "--passes", dest="pipeline", metavar="SPEC", default="", help="passes to run, e.g. 'cse,dce'")
    o.add_argument("--list-passes", action="store_true", help="list the available passes and exit")
    o.add_argument("-o", dest="output", metavar="OUT", default="-", help="output file (default: stdout)")
    _add_dump_flags(o)
    return parser


def _parse_define(text: str) -> tuple[str, Any]:
    name, sep, raw = text.partition("=")
    if not sep or not name.isidentifier():
        raise TkcError(f"-D expects NAME=VALUE, got {text!r}")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        from tkc.lang import DTYPES, INDEX_DTYPES

        value = (DTYPES | INDEX_DTYPES).get(raw, raw)  # -D DT=f16: a dtype constant
    return name, value


def load_kernels(path: str) -> list[Any]:
    """Import FILE and return the kernels it defines, in definition order."""
    from tkc.frontend.kernel import Kernel

    file = Path(path)
    if not file.is_file():
        raise TkcError(f"no such file: {path}")
    name = f"tkc_user_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise TkcError(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(file.resolve().parent))
    try:
        spec.loader.exec_module(module)
    except TkcError as e:
        if e.loc is None:
            e.loc = _frame_in(file, e)
        raise
    except SyntaxError as e:
        loc = SourceLoc(e.filename or path, e.lineno or 1, max((e.offset or 1) - 1, 0))
        raise TkcError(f"syntax error: {e.msg}", loc) from None
    except Exception as e:
        raise TkcError(f"importing {path} failed: {type(e).__name__}: {e}", _frame_in(file, e)) from None
    finally:
        sys.path.pop(0)
    real = os.path.realpath(file)
    return [v for v in vars(module).values() if isinstance(v, Kernel) and os.path.realpath(v.source.filename) == real]


def _frame_in(file: Path, error: BaseException) -> SourceLoc | None:
    """The innermost line of `file` that an exception passed through."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if Path(f.filename).resolve() == file.resolve()]
    if not frames:
        return None
    return SourceLoc(frames[-1].filename, frames[-1].lineno or 1, frames[-1].colno or 0)


def _write(output: str, text: str) -> None:
    if output == "-":
        sys.stdout.write(text)
    else:
        Path(output).write_text(text)


def cmd_compile(args: argparse.Namespace) -> None:
    from tkc.compiler import Dumps, PassTimer, compile_kernels

    kernels = load_kernels(args.file)
    if not kernels:
        raise TkcError(f"{args.file} defines no @tkc.kernel")
    if args.kernel is not None:
        chosen = [k for k in kernels if k.name == args.kernel]
        if not chosen:
            raise TkcError(f"{args.file} has no kernel named {args.kernel!r}; it defines {', '.join(k.name for k in kernels)}")
        kernels = chosen
    else:  # a whole file: the kernels this target can run (a Hopper-only kernel beside its sm_80 sibling)
        from tkc.targets import get_target

        sm = get_target(args.target).sm
        runnable = [k for k in kernels if k.min_target.sm <= sm]
        for k in kernels:
            if k not in runnable:
                sys.stderr.write(f"tkc: skipping `{k.name}` (needs {k.min_target.name}; compile with --target "
                                 f"{k.min_target.name} or --kernel {k.name})\n")
        if not runnable:
            kernels[0].check_target(get_target(args.target))  # the usual error, for the first kernel
        kernels = runnable
    constants = dict(_parse_define(d) for d in args.defines)
    dumps = Dumps(args.dump_ir_after_all, Path(args.dump_dir) if args.dump_dir else None, args.print_debuginfo)
    timer = PassTimer(args.time_passes)
    try:
        text = compile_kernels(kernels, args.target, constants, args.pipeline,
                               "ptx" if args.emit == "sass" else args.emit, dumps, timer, args.verify_each or None)
    finally:
        if args.time_passes:
            sys.stderr.write(timer.report())
    ptx = text if args.emit != "tile" else None
    if args.emit == "sass":
        from tkc.backend.ptxas import sass_listing

        text = sass_listing(text, args.target)
    _write(args.output, text)
    if args.resources:
        ptx = ptx or compile_kernels(kernels, args.target, constants, None, "ptx")
        sys.stderr.write(resources_report(ptx, args.target))


def resources_report(ptx: str, target: str) -> str:
    """Per kernel of `ptx`, what ptxas says it uses on `target` (and the shared memory the launch asks for), and
    how many of its blocks fit on a multiprocessor of the target's GPU."""
    import re

    from tkc.backend.occupancy import describe, occupancy
    from tkc.backend.ptxas import assemble
    from tkc.passes.allocate_shared import ALIGNMENT_PAD

    shared = {name: int(n) for name, n in re.findall(r"^// (\w+): (\d+) bytes of dynamic shared memory$", ptx, re.M)}
    threads = {name: int(x) * int(y) * int(z)
               for name, x, y, z in re.findall(r"\.entry (\w+)\([^{]*?\.maxntid (\d+), (\d+), (\d+)", ptx)}
    # a kernel with a producer warpgroup hands registers over at run time (setmaxnreg): ptxas's count is the launch's
    bodies = dict(re.findall(r"\.entry (\w+)\((.*?)(?=\.entry |\Z)", ptx, re.S))
    handover = {name: (re.findall(r"setmaxnreg\.dec\S* (\d+);", body), re.findall(r"setmaxnreg\.inc\S* (\d+);", body))
                for name, body in bodies.items()}
    lines = []
    for name, report in assemble(ptx, target).items():
        spills = f"{report.spill_stores} / {report.spill_loads} bytes of spill stores / loads"
        notes = f"; ptxas notes: {' '.join(report.notes)}" if report.notes else ""
        buffers = shared.get(name, 0)  # the launch asks for them and the 1 KB that aligns them (compile_for_launch)
        smem = (buffers + ALIGNMENT_PAD if buffers else 0) + report.static_shared_bytes
        blocks = (f"; {describe(occupancy(report.registers, threads[name], smem, target), target)}"
                  if name in threads else "")
        dec, inc = handover.get(name, ([], []))
        regs = (f" (at run time the producer warpgroup {'/'.join(sorted(set(dec)))}, the others "
                f"{'/'.join(sorted(set(inc)))}: setmaxnreg)" if dec and inc else "")
        lines.append(f"tkc: `{name}` on {target}: {report.registers} registers a thread{regs}, {spills}, "
                     f"{report.stack_bytes} bytes of stack, {smem} bytes of shared memory{blocks}{notes}\n")
    return "".join(lines)


def cmd_opt(args: argparse.Namespace) -> None:
    from xdsl.utils.exceptions import ParseError, VerifyException

    from tkc.compiler import Dumps, PassTimer, parse_pipeline, print_module, run_passes, verify
    from tkc.ir.parse import parse_module
    from tkc.passes import DESCRIPTIONS

    if args.list_passes:
        width = max(map(len, DESCRIPTIONS))
        sys.stdout.write("".join(f"{name:<{width}}  {DESCRIPTIONS[name]}\n" for name in sorted(DESCRIPTIONS)))
        return
    if args.file is None:
        raise TkcError("tkc opt needs FILE.mlir (or - for stdin)")
    if args.file == "-":
        text, name = sys.stdin.read(), "<stdin>"
    else:
        if not Path(args.file).is_file():
            raise TkcError(f"no such file: {args.file}")
        text, name = Path(args.file).read_text(), args.file
    passes = parse_pipeline(args.pipeline)
    if name == "<stdin>":  # so that an error can show the line
        linecache.cache[name] = (len(text), None, text.splitlines(keepends=True), name)
    try:
        module = parse_module(text, name)
    except ParseError as e:
        where = e.span.get_location()
        raise TkcError(f"cannot parse {name}: {e.msg}", SourceLoc(name, where.line, max(where.col - 1, 0))) from None
    except VerifyException as e:  # a type's own check (`!tile.rt<16x30xbf16>`) fails while parsing
        raise TkcError(f"cannot parse {name}: {str(e).splitlines()[0]}") from None
    verify(module, f"parsing {name}")
    dumps = Dumps(args.dump_ir_after_all, Path(args.dump_dir) if args.dump_dir else None, args.print_debuginfo)
    timer = PassTimer(args.time_passes)
    dumps.stage_done("parse", module)
    try:
        run_passes(module, passes, dumps, timer, verify_each=True)  # as mlir-opt: a pass's bad IR is named at once
    finally:
        if args.time_passes:
            sys.stderr.write(timer.report())
    _write(args.output, print_module(module, args.print_debuginfo))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    show_traceback = args.traceback or os.environ.get("TKC_TRACEBACK") == "1"
    werror = getattr(args, "werror", False)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TkcWarning)
            try:
                {"compile": cmd_compile, "opt": cmd_opt}[args.command](args)
            finally:
                kernel_warnings = [w.message for w in caught if isinstance(w.message, TkcWarning)]
                for w in kernel_warnings:
                    sys.stderr.write(w.format("error" if werror else "warning") + "\n")
        if werror and kernel_warnings:
            sys.stderr.write(f"error: {len(kernel_warnings)} warning(s) treated as errors (--werror)\n")
            return 1
    except TkcError as e:
        if show_traceback:
            traceback.print_exc()
        sys.stderr.write(f"{e}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug in tkc: still one readable line unless asked for more
        if show_traceback:
            traceback.print_exc()
        sys.stderr.write(f"tkc: internal error: {type(e).__name__}: {e} (run with --traceback for details)\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
