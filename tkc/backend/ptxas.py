"""Run ptxas (from the `nvidia-cuda-nvcc` wheel) on emitted PTX and read what `-v` reports; disassemble the
result with nvdisasm (the `nvidia-cuda-nvdisasm` wheel) to read the machine code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tkc.backend.ptx_printer import python_line, source_of_line
from tkc.errors import TkcError


def _find_tool(name: str) -> str | None:
    """`name` from $TKC_<NAME>, an nvidia-* wheel, or the PATH."""
    if os.environ.get(f"TKC_{name.upper()}"):
        return os.environ[f"TKC_{name.upper()}"]
    try:
        import nvidia

        for root in nvidia.__path__:
            for sub in (f"cu13/bin/{name}", f"cuda_nvcc/bin/{name}", f"cuda_{name}/bin/{name}"):
                candidate = Path(root) / sub
                if candidate.is_file():
                    return str(candidate)
    except ImportError:
        pass
    return shutil.which(name)


def find_ptxas() -> str | None:
    """ptxas from $TKC_PTXAS, the nvidia-cuda-nvcc wheel, or the PATH."""
    return _find_tool("ptxas")


def find_nvdisasm() -> str | None:
    """nvdisasm from $TKC_NVDISASM, the nvidia-cuda-nvdisasm wheel, or the PATH."""
    return _find_tool("nvdisasm")


@dataclass(frozen=True)
class PtxasReport:
    registers: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int
    notes: tuple[str, ...]  # performance notes such as C7508 / C7511 / C7515
    log: str
    static_shared_bytes: int = 0  # shared memory the PTX declares (tkc's kernels ask for theirs at launch)


def assemble(ptx_text: str, arch: str) -> dict[str, PtxasReport]:
    """Assemble PTX for `arch` (sm_80, sm_90, sm_90a); per kernel, what ptxas -v reported. Raises TkcError with
    ptxas's message if it rejects the PTX."""
    ptxas = find_ptxas()
    if ptxas is None:
        raise TkcError("ptxas not found: pip install nvidia-cuda-nvcc==13.0.88, or set TKC_PTXAS")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx_text)
        proc = subprocess.run([ptxas, f"-arch={arch}", "-v", str(src), "-o", str(Path(tmp) / "kernel.cubin")],
                              capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise TkcError(f"ptxas -arch={arch} rejected the PTX:\n{log.strip()}{_sources(log, ptx_text)}")
    reports: dict[str, PtxasReport] = {}
    for block in re.split(r"(?=ptxas info\s*: Compiling entry function)", log):
        m = re.search(r"Compiling entry function '(\w+)'", block)
        if not m:
            continue
        regs = re.search(r"Used (\d+) registers", block)
        stack = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", block)
        notes = tuple(sorted(set(re.findall(r"\((C\d{4})\)", block))))
        smem = re.search(r"(\d+) bytes smem", block)
        reports[m.group(1)] = PtxasReport(
            int(regs.group(1)) if regs else 0,
            int(stack.group(1)) if stack else 0,
            int(stack.group(2)) if stack else 0,
            int(stack.group(3)) if stack else 0,
            notes,
            block,
            int(smem.group(1)) if smem else 0,
        )
    return reports


def disassemble(ptx_text: str, arch: str, line_info: bool = False) -> str:
    """The SASS that ptxas makes of the PTX for `arch`, as nvdisasm prints it; with `line_info`, each run of
    instructions under the source line it came from (`//## File "...", line N`, from the PTX's `.loc` lines)."""
    ptxas, nvdisasm = find_ptxas(), find_nvdisasm()
    if ptxas is None or nvdisasm is None:
        raise TkcError("ptxas and nvdisasm needed: pip install nvidia-cuda-nvcc==13.0.88 nvidia-cuda-nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(ptx_text)
        lines = ["--generate-line-info"] if line_info else []
        proc = subprocess.run([ptxas, f"-arch={arch}", *lines, str(src), "-o", str(cubin)], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            log = proc.stdout + proc.stderr
            raise TkcError(f"ptxas -arch={arch} rejected the PTX:\n{log.strip()}{_sources(log, ptx_text)}")
        proc = subprocess.run([nvdisasm, "-c", *(["-g"] if line_info else []), str(cubin)], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise TkcError(f"nvdisasm failed:\n{(proc.stdout + proc.stderr).strip()}")
    return proc.stdout


def annotate_sass(sass: str) -> str:
    """nvdisasm's line info (`//## File "PATH", line N`) as the source line itself: `// FILE:N: <its text>`."""
    return re.sub(r'//## File "([^"]*)", line (\d+)',
                  lambda m: "// " + python_line(m.group(1), int(m.group(2)), short=True), sass)


def _sources(log: str, ptx_text: str) -> str:
    """The Python lines of the PTX lines ptxas complains about (`..., line N; error ...`), by their `.loc`."""
    found = dict.fromkeys(filter(None, (source_of_line(ptx_text, int(n)) for n in re.findall(r", line (\d+);", log))))
    return "".join(f"\n  from {source}" for source in found)


def sass_listing(ptx_text: str, arch: str) -> str:
    """The machine code of the PTX with each run of instructions under its Python line (`tkc compile --emit sass`,
    `kernel.sass()`)."""
    return annotate_sass(disassemble(ptx_text, arch, line_info=True))

