"""Does the driver's JIT compile our PTX as ptxas does? For one kernel variant: the PTX, the cubin from the
driver's linker (with its info log) and the cubin from `ptxas -arch=sm_90a -v`, disassembled side by side: counts
of HGMMA and of warpgroup waits (`WARPGROUP.DEPBAR`; one per HGMMA means the wgmmas were serialized).

    python bench/jit_vs_ptxas.py [--kernel attention_sm90] [-D NAME=VALUE ...]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import subprocess
import tempfile

from tkc.compiler import compile_for_launch
from tkc.kernels import attention_sm90, gemm_sm90_kernel
from tkc.runtime.driver import check, device, driver, link_ptx, make_current


def jit_with_log(ptx: str, name: str, verbose: bool) -> tuple[bytes, str]:
    cu = driver()
    size = 1 << 16
    info, error = bytearray(size), bytearray(size)
    opts = [cu.CUjit_option.CU_JIT_INFO_LOG_BUFFER, cu.CUjit_option.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            cu.CUjit_option.CU_JIT_ERROR_LOG_BUFFER, cu.CUjit_option.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            cu.CUjit_option.CU_JIT_LOG_VERBOSE]
    state = check(cu.cuLinkCreate(len(opts), opts, [info, size, error, size, int(verbose)]), "cuLinkCreate")
    data = ptx.encode() + b"\0"
    check(cu.cuLinkAddData(state, cu.CUjitInputType.CU_JIT_INPUT_PTX, data, len(data), name.encode(), 0, None, None),
          "cuLinkAddData")
    cubin_ptr, n = check(cu.cuLinkComplete(state), "cuLinkComplete")
    cubin = ctypes.string_at(int(cubin_ptr), n)
    cu.cuLinkDestroy(state)
    return cubin, info.split(b"\0", 1)[0].decode(errors="replace") + error.split(b"\0", 1)[0].decode(errors="replace")


def sass_counts(cubin: bytes, label: str, out: str) -> None:
    path = os.path.join(out, f"{label}.cubin")
    open(path, "wb").write(cubin)
    tool = shutil.which("cuobjdump")
    sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True).stdout if tool else ""
    open(os.path.join(out, f"{label}.sass"), "w").write(sass)
    print(f"{label:8s} HGMMA {sass.count('HGMMA'):4d}  WARPGROUP.DEPBAR {sass.count('WARPGROUP.DEPBAR'):4d}  "
          f"WARPGROUP.ARRIVE {sass.count('WARPGROUP.ARRIVE'):4d}  lines {sass.count(chr(10))}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernel", default="attention_sm90")
    parser.add_argument("-D", action="append", default=[])
    args = parser.parse_args()
    kernel = {"attention_sm90": attention_sm90, "gemm_sm90_kernel": gemm_sm90_kernel}[args.kernel]
    constants = dict(kv.split("=") for kv in args.D) or {"D": "128", "KEYS": "128", "WARPS": "8"}
    constants = {k: int(v) for k, v in constants.items()}
    aligns = {p.name: 16 for p in kernel.runtime_params if p.kind == "tensor"}
    compiled = compile_for_launch(kernel, "sm_90a", constants, aligns)
    out = os.environ.get("OUT") or tempfile.mkdtemp()
    open(os.path.join(out, "kernel.ptx"), "w").write(compiled.ptx)
    cu = driver()
    make_current(device(0))
    print("driver version", check(cu.cuDriverGetVersion(), "cuDriverGetVersion"))
    cubin, log = jit_with_log(compiled.ptx, compiled.name, verbose=True)
    print("JIT log:", log.strip()[:2000] or "(empty)")
    sass_counts(cubin, "jit", out)
    sass_counts(link_ptx(compiled.ptx, compiled.name), "linkptx", out)
    ptxas = shutil.which("ptxas")
    if ptxas:
        path = os.path.join(out, "ptxas.cubin")
        run = subprocess.run([ptxas, "-arch=sm_90a", "-v", os.path.join(out, "kernel.ptx"), "-o", path],
                             capture_output=True, text=True)
        print("ptxas:", (run.stdout + run.stderr).strip()[-800:], subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1])
        sass_counts(open(path, "rb").read(), "ptxas", out)


if __name__ == "__main__":
    main()
