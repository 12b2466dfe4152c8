"""The `tkc` command, run in-process through `tkc.cli.main` (and twice as the installed script)."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tkc
from tkc.cli import main

ROOT = Path(__file__).resolve().parent.parent
ATTENTION = str(ROOT / "tkc" / "kernels" / "attention.py")
GEMM = str(ROOT / "tkc" / "kernels" / "gemm.py")
DUMP = "// -----// IR Dump After {} //----- //"
TILE = ("--emit", "tile")  # print tile IR (the default is PTX, through the backend's pipeline)

TWO_KERNELS = '''\
import tkc
from tkc.lang import *


@tkc.kernel(warps=1)
def double(X: gl[f32, 2], Y: gl[f32, 2], N: const = 16):
    store(Y, load(X, (0, 0), rt[f32, 16, N]) * 2.0, (0, 0))


@tkc.kernel(warps=1, min_target="sm_90a")
def negate(X: gl[f32, 2], Y: gl[f32, 2]):
    store(Y, -load(X, (0, 0), rt[f32, 16, 16]), (0, 0))
'''


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of `tkc ARGV`."""
    try:
        rc = main(list(argv))
    except SystemExit as e:  # argparse: --help, --version, usage errors
        rc = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_error(err: str, *words: str) -> list[str]:
    """stderr holds one readable error mentioning `words`, and no traceback."""
    assert "Traceback" not in err
    assert len(re.findall(r"(?m)(^|: )error: ", err)) == 1, err
    for w in words:
        assert w in err, err
    return err.splitlines()


@pytest.fixture
def two_kernels(tmp_path: Path) -> str:
    path = tmp_path / "two_kernels.py"
    path.write_text(TWO_KERNELS)
    return str(path)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


# --------------------------------------------------------------------------------------------------------------
# Help and version


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--help")
    assert rc == 0 and "compile" in out and "opt" in out and "--version" in out


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys)
    assert rc == 0 and out.startswith("usage: tkc")


@pytest.mark.parametrize("command", ["compile", "opt"])
def test_subcommand_help(capsys: pytest.CaptureFixture[str], command: str) -> None:
    rc, out, _ = run(capsys, command, "--help")
    assert rc == 0
    for flag in ("--dump-ir-after-all", "--dump-dir", "--time-passes", "-o"):
        assert flag in out
    assert ("--target" in out and "--kernel" in out and "-D" in out) if command == "compile" else "--list-passes" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and out.strip() == f"tkc {tkc.__version__}"


# --------------------------------------------------------------------------------------------------------------
# compile


def test_compile_attention(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "compile", *TILE, ATTENTION, "-D", "D=64", "-D", "CAUSAL=1")
    assert rc == 0 and err == ""
    assert out.startswith('builtin.module attributes {tkc.target = "sm_90a"}')
    assert "func.func @attention_fwd" in out and "scf.for" in out and "tile.tril" in out
    assert ("tkc.constants = {D = 64 : i64, CAUSAL = 1 : i64, ROWS = 16 : i64, KEYS = 64 : i64, Q_IN_SHARED = 0 : i64, "
            "DT = \"bf16\", GROUP = 1 : i64, STAGES = 3 : i64}") in out


def test_compile_resources(capsys: pytest.CaptureFixture[str], two_kernels: str) -> None:
    """--resources: what ptxas says each kernel uses, the shared memory its launch asks for (its buffers, named in a
    comment before each .entry of the PTX, and the 1 KB that aligns them), and how many of its blocks a
    multiprocessor holds."""
    from tkc.backend import ptxas

    if ptxas.find_ptxas() is None:
        pytest.skip("ptxas not installed")
    rc, out, err = run(capsys, "compile", two_kernels, "--target", "sm_90a", "--resources")
    assert rc == 0 and ".visible .entry double(" in out and ".visible .entry negate(" in out
    lines = err.strip().splitlines()
    assert len(lines) == 2 and all(re.fullmatch(r"tkc: `(double|negate)` on sm_90a: \d+ registers a thread, 0 / 0 "
                                                r"bytes of spill stores / loads, 0 bytes of stack, \d+ bytes of shared "
                                                r"memory; \d+ blocks? a multiprocessor on an H100 / H200 \(registers "
                                                r"allow \d+, shared memory \d+, threads \d+\)(; \d+ would need at most "
                                                r"\d+ registers a thread)?", line) for line in lines), lines
    rc, out, err = run(capsys, "compile", *TILE, ATTENTION, "-D", "D=64", "--target", "sm_80", "--resources")
    assert rc == 0 and out.startswith("builtin.module") and "bytes of shared memory" in err
    shared = re.search(r"(\d+) bytes of shared memory", err).group(1)
    assert int(shared) > 1024
    # a producer warpgroup: the registers each side holds at run time (setmaxnreg) beside ptxas's launch count
    rc, out, err = run(capsys, "compile", ATTENTION, "--kernel", "attention_sm90", "-D", "PRODUCER=1", "--resources")
    assert rc == 0 and re.search(r"`attention_sm90` on sm_90a: \d+ registers a thread \(at run time the producer "
                                 r"warpgroup \d+, the others \d+: setmaxnreg\), 0 / 0 bytes", err), err


def test_compile_emit_sass(capsys: pytest.CaptureFixture[str], two_kernels: str) -> None:
    """--emit sass: ptxas's machine code as nvdisasm prints it, each run of instructions under the Python line it
    came from (the file's name, the line's number and its text); with --resources too."""
    from tkc.backend import ptxas

    if ptxas.find_ptxas() is None or ptxas.find_nvdisasm() is None:
        pytest.skip("ptxas / nvdisasm not installed")
    rc, out, err = run(capsys, "compile", two_kernels, "--kernel", "double", "--target", "sm_80", "--emit", "sass",
                       "--resources")
    assert rc == 0 and "`double` on sm_80" in err
    assert "double:" in out and re.search(r"/\*[0-9a-f]{4}\*/\s+STG\.E", out), out
    store_line = TWO_KERNELS.splitlines().index(
        "    store(Y, load(X, (0, 0), rt[f32, 16, N]) * 2.0, (0, 0))") + 1
    assert f"// two_kernels.py:{store_line}: store(Y, load(X, (0, 0), rt[f32, 16, N]) * 2.0, (0, 0))" in out
    assert "//## File" not in out


def test_compile_every_kernel_or_one(capsys: pytest.CaptureFixture[str], two_kernels: str) -> None:
    rc, out, _ = run(capsys, "compile", *TILE, two_kernels)
    assert rc == 0 and "@double" in out and "@negate" in out
    rc, out, _ = run(capsys, "compile", *TILE, two_kernels, "--kernel", "double", "--target", "sm_80")
    assert rc == 0 and "@double" in out and "@negate" not in out
    assert 'tkc.target = "sm_80"' in out


def test_compile_target(capsys: pytest.CaptureFixture[str], two_kernels: str) -> None:
    """A whole file compiles the kernels the target runs and says which it skips; a kernel asked for by name
    that needs a newer target is an error at its decorator."""
    rc, out, err = run(capsys, "compile", *TILE, two_kernels, "--target", "sm_80")
    assert rc == 0 and "@double" in out and "@negate" not in out
    assert err == "tkc: skipping `negate` (needs sm_90a; compile with --target sm_90a or --kernel negate)\n"
    rc, out, err = run(capsys, "compile", *TILE, two_kernels, "--target", "sm_80", "--kernel", "negate")
    lines = assert_one_error(err, "kernel `negate` needs sm_90a", "cannot compile for sm_80")
    assert rc == 1 and out == ""
    assert lines[0].startswith(f"{two_kernels}:10:")  # the decorator's min_target
    assert 'min_target="sm_90a"' in lines[1] and lines[2].strip() == "^"


def test_compile_defines(capsys: pytest.CaptureFixture[str], two_kernels: str) -> None:
    rc, out, _ = run(capsys, "compile", *TILE, two_kernels, "--kernel", "double", "-D", "N=32")
    assert rc == 0 and "!tile.rt<16x32xf32>" in out and "N = 32 : i64" in out
    rc, _, err = run(capsys, "compile", *TILE, two_kernels, "--kernel", "double", "-D", "N=24")
    lines = assert_one_error(err, "rt[f32, 16, 24]", "multiples of 16")
    assert rc == 1 and lines[0].startswith(f"{two_kernels}:7:")


def test_compile_output_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "gemm.mlir"
    rc, out, err = run(capsys, "compile", *TILE, GEMM, "-o", str(target))
    assert rc == 0 and out == "" and err == ""
    text = target.read_text()
    assert "func.func @gemm_kernel" in text
    rc, out, _ = run(capsys, "compile", *TILE, GEMM, "-o", "-")
    assert rc == 0 and out == text


def test_compile_pipeline(capsys: pytest.CaptureFixture[str]) -> None:
    rc, plain, _ = run(capsys, "compile", *TILE, GEMM)
    rc2, piped, _ = run(capsys, "compile", *TILE, GEMM, "--pipeline", "cse,canonicalize,dce")
    assert rc == rc2 == 0
    assert "func.func @gemm_kernel" in piped and piped.count("\n") <= plain.count("\n")


def test_dump_ir_after_all(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "compile", *TILE, GEMM, "--pipeline", "cse,canonicalize", "--dump-ir-after-all")
    assert rc == 0 and "func.func @gemm_kernel" in out
    headers = [line for line in err.splitlines() if line.startswith("// -----// IR Dump After")]
    assert headers == [DUMP.format("frontend"), DUMP.format("cse"), DUMP.format("canonicalize")]
    assert err.startswith(DUMP.format("frontend") + "\nbuiltin.module")
    assert err.split(DUMP.format("canonicalize"))[1].strip() == out.strip()  # the last dump is the output


def test_dump_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    rc, out, _ = run(capsys, "compile", *TILE, GEMM, "--pipeline", "cse,dce", "--dump-dir", str(dumps))
    assert rc == 0
    assert sorted(p.name for p in dumps.iterdir()) == ["00-frontend.mlir", "01-cse.mlir", "02-dce.mlir"]
    assert (dumps / "02-dce.mlir").read_text() == out
    assert "func.func @gemm_kernel" in (dumps / "00-frontend.mlir").read_text()


def test_verify_each(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--verify-each (or TKC_VERIFY_EACH=1) verifies after every pass: the output is the same."""
    import tkc.compiler

    monkeypatch.delenv("TKC_VERIFY_EACH", raising=False)
    stages: list[str] = []
    verify = tkc.compiler.verify
    monkeypatch.setattr(tkc.compiler, "verify", lambda module, stage: (stages.append(stage), verify(module, stage)))
    rc, plain, _ = run(capsys, "compile", GEMM, "--target", "sm_80")
    once = len(stages)
    rc2, each, _ = run(capsys, "compile", GEMM, "--target", "sm_80", "--verify-each")
    assert rc == rc2 == 0 and plain == each
    assert once == 1 and stages[0].startswith("the pipeline (its last pass lower-to-ptx")
    assert len(stages) - once > 10 and stages[-1] == "pass lower-to-ptx"


def test_time_passes(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "compile", *TILE, GEMM, "--pipeline", "cse", "--time-passes")
    assert rc == 0 and "func.func" in out
    assert "Pass execution timing report" in err
    rows = [line.split()[-1] for line in err.splitlines() if "%)" in line]
    assert rows == ["frontend", "cse", "Total"]


def test_print_debuginfo(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "compile", *TILE, GEMM, "--print-debuginfo")
    assert rc == 0 and f'loc("{GEMM}":' in out


# --------------------------------------------------------------------------------------------------------------
# opt


def test_opt_file_and_passes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, ir, _ = run(capsys, "compile", *TILE, ATTENTION)
    path = tmp_path / "attention.mlir"
    path.write_text(ir)
    rc, out, _ = run(capsys, "opt", str(path))
    assert rc == 0 and out == ir  # parse and print round-trips
    rc, out, err = run(capsys, "opt", str(path), "-p", "cse,canonicalize", "--dump-ir-after-all")
    assert rc == 0 and "func.func @attention_fwd" in out
    headers = [line for line in err.splitlines() if line.startswith("// -----//")]
    assert headers == [DUMP.format("parse"), DUMP.format("cse"), DUMP.format("canonicalize")]


def test_opt_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    rc, ir, _ = run(capsys, "compile", *TILE, GEMM)
    monkeypatch.setattr(sys, "stdin", io.StringIO(ir))
    rc, out, _ = run(capsys, "opt", "-", "-p", "cse")
    assert rc == 0 and "func.func @gemm_kernel" in out


def test_opt_list_passes(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "opt", "--list-passes")
    names = [line.split()[0] for line in out.splitlines()]
    assert rc == 0 and {"canonicalize", "cse", "dce", "licm"} <= set(names) and names == sorted(names)


def test_opt_parse_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "bad.mlir", """\
        func.func @k(%a: !tile.rt<16x32xf32>) {
          %b = tile.nonsense %a : !tile.rt<16x32xf32>
          func.return
        }
        """)
    rc, out, err = run(capsys, "opt", path)
    lines = assert_one_error(err, "tile.nonsense")
    assert rc == 1 and out == ""
    assert lines[0].startswith(f"{path}:2:") and "tile.nonsense" in lines[1] and lines[2].strip() == "^"


def test_opt_parse_error_on_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("func.func @k() {\n  garbage {\n}\n"))
    rc, _, err = run(capsys, "opt", "-")
    lines = assert_one_error(err, "<stdin>:2:")
    assert rc == 1 and "garbage" in lines[1]


def test_opt_invalid_type(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "bad.mlir", "func.func @k(%a: !tile.rt<16x30xbf16>) {\n  func.return\n}\n")
    rc, _, err = run(capsys, "opt", path)
    assert rc == 1
    assert_one_error(err, "multiples of 16")


@pytest.mark.parametrize(("body", "line", "words"), [
    ("%b = arith.addi %a, %zz : i32\n%c = arith.addi %a, %a : i32", 2, ["values used but not defined", "%zz"]),
    ("%b = arith.addi %a, %c : i32\n%c = arith.addi %a, %a : i32", 2, ["%c", "defined after its use"]),
    ("%b = arith.addi %a, %c : i32\nscf.execute_region {\n  %c = arith.addi %a, %a : i32\n  scf.yield\n}", 2,
     ["%c", "does not enclose its use"]),
    ("scf.for %i = %a to %n step %a : i32 {\n  %n = arith.addi %a, %a : i32\n  scf.yield\n}", 2,
     ["scf.for uses", "not defined in its scope"]),
    ("%t = arith.constant true\n%r = scf.if %t -> (i32) {\n  scf.yield %a : i32\n} else {\n"
     "  %z = arith.addi %a, %a : i32\n}", 3, ["scf.if has 1 results but a region of it yields 0 values"]),
    ("%b = arith.constant 2.5e+91 : f32", 2, ["out of range"]),
])
def test_opt_values_out_of_scope_and_numbers_out_of_range(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                          body: str, line: int, words: list[str]) -> None:
    """Textual IR that xDSL's parser accepts or trips over (a value used above its definition, a float literal too
    large for f32) is one error at the line that is wrong, not an internal error."""
    path = tmp_path / "bad.mlir"
    path.write_text("func.func @k(%a: i32) {\n" + textwrap.indent(body, "  ") + "\n  func.return\n}\n")
    rc, _, err = run(capsys, "opt", str(path))
    lines = assert_one_error(err, *words)
    assert rc == 1 and lines[0].startswith(f"{path}:{line}:"), err


def test_opt_mutated_kernels_never_fail_inside(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The shipped kernels' tile IR with random lines deleted, copied, swapped or garbled, through `tkc opt` with
    and without passes: every input either compiles or gets one readable error, never an internal error (this
    found the two cases above, each an exception from inside xDSL)."""
    import random

    from tkc.compiler import default_pipeline, print_module
    from tkc.kernels import attention_fwd, gemm_kernel, layernorm_kernel

    texts = [print_module(k.build(**c), False).splitlines()
             for k, c in ((layernorm_kernel, {"D": 256, "WARPS": 2}), (gemm_kernel, {}), (attention_fwd, {}))]
    pipelines = [None, "canonicalize,cse,licm,dce", default_pipeline("sm_80")]
    tokens = ["%0", "%1", "16", "f32", "bf16", "!tile.rt<16x16xf32>", "-1", "64x64", ""]
    rng = random.Random(0)
    path = tmp_path / "mutated.mlir"
    for _ in range(300):
        lines = list(rng.choice(texts))
        for _ in range(rng.randint(1, 3)):
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            edit = rng.randrange(4)
            if edit == 0:
                del lines[i]
            elif edit == 1:
                lines.insert(j, lines[i])
            elif edit == 2:
                lines[i], lines[j] = lines[j], lines[i]
            else:
                words = lines[i].split(" ")
                words[rng.randrange(len(words))] = rng.choice(tokens)
                lines[i] = " ".join(words)
        path.write_text("\n".join(lines))
        pipeline = rng.choice(pipelines)
        _, _, err = run(capsys, "opt", str(path), *(("-p", pipeline) if pipeline else ()))
        assert "internal error" not in err and "Traceback" not in err, "\n".join(lines) + "\n" + err


def test_opt_does_not_verify(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "bad.mlir", """\
        func.func @k(%a: !tile.rt<16x32xbf16>, %b: !tile.rt<64x16xbf16>, %c: !tile.rt<16x16xf32>) {
          %d = tile.mma_AB %a, %b, %c : !tile.rt<16x32xbf16>, !tile.rt<64x16xbf16>, !tile.rt<16x16xf32>
          func.return
        }
        """)
    rc, _, err = run(capsys, "opt", path)
    assert rc == 1
    assert_one_error(err, "does not verify", "mma_AB")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["opt"], ["needs FILE.mlir"]),
        (["opt", "no_such_file.mlir"], ["no such file: no_such_file.mlir"]),
        (["opt", "-", "-p", "no-such-pass"], ["bad pipeline", "no-such-pass", "canonicalize, cse"]),
    ],
)
def test_opt_usage_errors(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str],
                          words: list[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    rc, _, err = run(capsys, *argv)
    assert rc == 1
    assert_one_error(err, *words)


# --------------------------------------------------------------------------------------------------------------
# Errors: one readable message, exit status 1, no traceback


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["compile", *TILE, ATTENTION, "-D", "D"], ["-D expects NAME=VALUE, got 'D'"]),
        (["compile", *TILE, ATTENTION, "-D", "1x=3"], ["-D expects NAME=VALUE"]),
        (["compile", *TILE, ATTENTION, "-D", "WINDOW=3"], ["constant named WINDOW", "CAUSAL, D"]),
        (["compile", *TILE, ATTENTION, "--kernel", "bwd"], ["no kernel named 'bwd'", "it defines attention_fwd"]),
        (["compile", *TILE, "no/such/file.py"], ["no such file: no/such/file.py"]),
        (["compile", *TILE, GEMM, "--pipeline", "cse{bogus=1}"], ["bad pipeline", "bogus"]),
    ],
)
def test_compile_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]) -> None:
    rc, out, err = run(capsys, *argv)
    assert rc == 1 and out == ""
    assert_one_error(err, *words)


def test_kernel_error_points_at_the_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "compile", *TILE, ATTENTION, "-D", "D=100")
    lines = assert_one_error(err, "head dim D must be 32, 64, 96, 128 or 256, got 100")
    assert rc == 1 and out == ""
    source = Path(ATTENTION).read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if text.strip().startswith("static_assert(D in"))
    col = source[line - 1].index("static_assert") + 1
    assert lines[0] == f"{ATTENTION}:{line}:{col}: error: head dim D must be 32, 64, 96, 128 or 256, got 100"
    assert lines[1].strip() == source[line - 1].strip()
    assert lines[2] == "    " + " " * (col - 1) + "^"


def test_syntax_error_in_user_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "broken.py", """\
        import tkc
        from tkc.lang import *

        @tkc.kernel
        def k(A: gl[bf16, 2]:
            pass
        """)
    rc, _, err = run(capsys, "compile", *TILE, path)
    lines = assert_one_error(err, "syntax error")
    assert rc == 1 and lines[0].startswith(f"{path}:5:")
    assert "def k(A: gl[bf16, 2]:" in lines[1]


def test_exception_while_importing_user_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "imports.py", """\
        import tkc

        SIZES = {"a": 1}
        SIZE = SIZES["b"]
        """)
    rc, _, err = run(capsys, "compile", *TILE, path)
    lines = assert_one_error(err, "importing", "KeyError")
    assert rc == 1 and lines[0].startswith(f"{path}:4:")


def test_mistake_evaluated_by_python_when_importing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "annotations.py", """\
        import tkc
        from tkc.lang import *

        @tkc.kernel
        def k(A: gl[bf16, 2], B: gl[bf16]):
            pass
        """)
    rc, _, err = run(capsys, "compile", *TILE, path)
    lines = assert_one_error(err, "gl[dtype, rank]")
    assert rc == 1 and lines[0].startswith(f"{path}:5:{lines[1].index('gl[bf16]') - 4 + 1}: error:")


def test_file_without_kernels(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "empty.py", "x = 1\n")
    rc, _, err = run(capsys, "compile", *TILE, path)
    assert rc == 1
    assert_one_error(err, "defines no @tkc.kernel")


@pytest.mark.parametrize("where", ["before", "after"])
def test_traceback_flag(capsys: pytest.CaptureFixture[str], where: str) -> None:
    argv = ["compile", *TILE, ATTENTION, "-D", "D=100"]
    argv = ["--traceback", *argv] if where == "before" else [*argv, "--traceback"]
    rc, _, err = run(capsys, *argv)
    assert rc == 1 and "Traceback (most recent call last)" in err
    assert err.rstrip().endswith("^")  # the readable error still comes last


def test_internal_error_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import tkc.compiler

    def broken(*args: object, **kwargs: object) -> str:
        raise RuntimeError("something inside tkc broke")

    monkeypatch.setattr(tkc.compiler, "compile_kernels", broken)
    rc, _, err = run(capsys, "compile", *TILE, GEMM)
    assert rc == 1 and "Traceback" not in err
    assert err == "tkc: internal error: RuntimeError: something inside tkc broke (run with --traceback for details)\n"


# --------------------------------------------------------------------------------------------------------------
# The installed script


def _script() -> str:
    script = Path(sys.executable).parent / "tkc"
    if script.exists():
        return str(script)
    found = shutil.which("tkc")
    if found is None:
        pytest.skip("the tkc script is not installed")
    return found


def test_script_compiles() -> None:
    result = subprocess.run([_script(), "compile", *TILE, ATTENTION, "-D", "D=128"], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "!tile.rt<16x128xf32>" in result.stdout and result.stderr == ""


def test_script_error_exit(tmp_path: Path) -> None:
    result = subprocess.run([_script(), "compile", *TILE, ATTENTION, "-D", "D=100"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env={**os.environ, "TKC_TRACEBACK": "0"})
    assert result.returncode == 1 and result.stdout == ""
    assert_one_error(result.stderr, f"{ATTENTION}:", "head dim D must be 32, 64, 96, 128 or 256, got 100")


def test_compile_a_dtype_constant(capsys: pytest.CaptureFixture[str]) -> None:
    """`-D DT=f16` gives a dtype constant (gl["DT", 2]): the GEMM's tile IR holds f16 tensors and tiles."""
    assert main(["compile", "tkc/kernels/gemm.py", "--kernel", "gemm_kernel", "--emit", "tile", "-D", "DT=f16"]) == 0
    text = capsys.readouterr().out
    assert "!tile.gl<?x?xf16>" in text and "xbf16" not in text
