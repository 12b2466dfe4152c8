"""Line info: the PTX names the kernel's Python lines (`.file` / `.loc`), ptxas carries them into the machine code's
line table (what Nsight Compute's source view and compute-sanitizer's reports read), and the instructions are the
same with and without them."""

from __future__ import annotations

import inspect
import re

import pytest
from xdsl.dialects.builtin import FileLineColLoc, IntAttr, StringAttr

import tkc
from tkc.backend import ptx
from tkc.backend.ptx_printer import emit_ptx
from tkc.backend.ptxas import disassemble, find_nvdisasm, find_ptxas
from tkc.compiler import Dumps, PassTimer, compile_kernels, default_pipeline, parse_pipeline, run_passes
from tkc.frontend.kernel import build_module
from tkc.lang import *  # noqa: F403

needs_tools = pytest.mark.skipif(find_ptxas() is None or find_nvdisasm() is None, reason="ptxas / nvdisasm not found")
CODE = re.compile(r"^\s+/\*[0-9a-f]{4}\*/.*$", re.M)  # nvdisasm's instruction lines


@tkc.kernel(warps=1, min_target="sm_80")
def softmax_tile(X: gl[f32, 2], Y: gl[f32, 2]):
    x = load(X, (block_idx()[0], 0), rt[f32, 16, 64])
    p = exp2(sub_row(x, row_max(x)))
    store(Y, div_row(p, row_sum(p)), (block_idx()[0], 0))


def _statement_lines() -> dict[str, int]:
    """This file's line of each statement of softmax_tile: "x", "p", "store"."""
    source, first = inspect.getsourcelines(softmax_tile.fn)
    return {text.strip().split(" = ")[0].split("(")[0]: first + i for i, text in enumerate(source)
            if text.startswith("    ")}


def _lowered(kernel, target: str):
    module = build_module([kernel], target, None)
    run_passes(module, parse_pipeline(default_pipeline(target)), Dumps(), PassTimer())
    return module


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_the_ptx_names_the_kernels_lines(target: str) -> None:
    """One `.file`, this test file; a `.loc` at each of the kernel's statements and nowhere else, the load's
    before the store's."""
    text = compile_kernels([softmax_tile], target)
    assert re.findall(r'^\.file (\d+) "([^"]+)"$', text, re.M) == [("1", __file__)]
    locs = [int(line) for line in re.findall(r"^ +\.loc 1 (\d+) \d+$", text, re.M)]
    lines = _statement_lines()
    assert set(locs) == set(lines.values())
    assert locs.index(lines["x"]) < locs.index(lines["store"])


@needs_tools
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_the_machine_code_keeps_the_lines_and_only_them(target: str) -> None:
    """ptxas with line info maps the machine code back to the kernel's own file and lines, and its instructions
    are those of the PTX without line info (softmax_tile; layernorm_kernel: a loop, shuffles, barriers)."""
    from tkc.kernels.layernorm import layernorm_kernel

    for kernel in (softmax_tile, layernorm_kernel):
        module = _lowered(kernel, target)
        with_lines = disassemble(emit_ptx(module, target), target, line_info=True)
        without = disassemble(emit_ptx(module, target, line_info=False), target)
        assert CODE.findall(with_lines) == CODE.findall(without)
        named = set(re.findall(r'//## File "([^"]+)", line (\d+)', with_lines))
        assert {path for path, _ in named} == {kernel.source.filename}
        source, first = inspect.getsourcelines(kernel.fn)
        assert {int(line) for _, line in named} <= set(range(first, first + len(source)))


def test_a_path_ptx_cannot_spell_gets_no_line_info() -> None:
    """Ops from a file whose path PTX cannot hold (a quote, non-ASCII: ptxas has no escapes and refuses
    non-ASCII) get no `.file` and no `.loc`; the ops from other files keep theirs."""
    module = _lowered(softmax_tile, "sm_80")
    kernel = next(op for op in module.walk() if isinstance(op, ptx.KernelOp))
    odd = FileLineColLoc(StringAttr('/tmp/d\u00e9j\u00e0 "vu".py'), IntAttr(3), IntAttr(1))
    located = [op for op in kernel.body.block.ops if isinstance(op.location, FileLineColLoc)]
    for op in located[: len(located) // 2]:
        op.location = odd
    text = emit_ptx(module, "sm_80")
    assert text.isascii()
    assert re.findall(r"^\.file .*$", text, re.M) == [f'.file 1 "{__file__}"']
    assert re.findall(r"^ +\.loc ", text, re.M) and not re.search(r"^ +\.loc \d+ 3 1$", text, re.M)


@needs_tools
def test_a_kernel_shows_its_ptx_and_machine_code() -> None:
    """`kernel.ptx()` is `tkc compile`'s PTX; `kernel.sass()` its machine code, each run of instructions under the
    Python line it came from (the line's text, as `tkc compile --emit sass`)."""
    assert softmax_tile.ptx("sm_90a") == compile_kernels([softmax_tile], "sm_90a")
    sass = softmax_tile.sass("sm_90a")
    lines = _statement_lines()
    assert f"// test_line_info.py:{lines['store']}: store(Y, div_row(p, row_sum(p)), (block_idx()[0], 0))" in sass
    assert f"// test_line_info.py:{lines['p']}: p = exp2(sub_row(x, row_max(x)))" in sass
    assert re.search(r"MUFU\.EX2", sass) and CODE.search(sass)


@pytest.mark.parametrize("by", ["ptxas", "the driver's JIT"])
def test_a_rejected_ptx_line_names_its_python_line(by: str) -> None:
    """When ptxas (or the driver's JIT: its error log, stand-in here) rejects a line of the PTX, the error quotes
    the Python line that line came from, through the `.loc` before it."""
    from tkc.errors import TkcError

    text = softmax_tile.ptx("sm_80")
    broken = re.sub(r"\bex2\.approx", "ex3.approx", text, count=1)
    lineno = next(i + 1 for i, line in enumerate(broken.splitlines()) if "ex3.approx" in line)
    want = f"from {__file__}:{_statement_lines()['p']}: p = exp2(sub_row(x, row_max(x)))"
    if by == "ptxas":
        if find_ptxas() is None:
            pytest.skip("ptxas not found")
        with pytest.raises(TkcError) as caught:
            from tkc.backend.ptxas import assemble

            assemble(broken, "sm_80")
        assert f"line {lineno};" in str(caught.value) and want in str(caught.value), str(caught.value)
    else:
        from tkc.runtime.driver import _quote_ptx_line

        quoted = _quote_ptx_line(f"ptxas application ptx input, line {lineno}; error   : Unknown opcode", broken)
        assert quoted.splitlines()[1:] == [f"  PTX line {lineno}: {broken.splitlines()[lineno - 1].strip()}",
                                           f"  {want}"]
