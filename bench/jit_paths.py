"""Three ways to turn our PTX into machine code on the GPU, side by side: registers per thread and the JIT's
performance notes for a kernel that uses setmaxnreg (the GEMM with a producer warpgroup) and for attention_sm90.

* cuLink* (the driver's linker) and nvJitLink compile PTX as a separate compilation unit: on the H200 they ignored
  setmaxnreg (C7504) and gave attention_sm90 188 registers;
* cuModuleLoadDataEx (what tkc's runtime uses) compiles it as one program: setmaxnreg honoured, 182 registers.

(The notes only appear when the driver really compiles: its compute cache serves a PTX it has seen.)

    python bench/jit_paths.py
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from tkc.compiler import compile_for_launch
from tkc.kernels import attention_sm90, gemm_sm90_kernel
from tkc.kernels.gemm import CONFIG_SM90
from tkc.runtime.driver import check, device, driver, make_current

LOG = 1 << 16


def _log_options(cu) -> tuple[list, list]:
    info, error = bytearray(LOG), bytearray(LOG)
    opts = [cu.CUjit_option.CU_JIT_INFO_LOG_BUFFER, cu.CUjit_option.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            cu.CUjit_option.CU_JIT_ERROR_LOG_BUFFER, cu.CUjit_option.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            cu.CUjit_option.CU_JIT_LOG_VERBOSE]
    return opts, [info, LOG, error, LOG, 1]


def _text(buffer: bytearray) -> str:
    return buffer.split(b"\0", 1)[0].decode(errors="replace")


def _registers(cu, module, name: str) -> int:
    function = check(cu.cuModuleGetFunction(module, name.encode()), "cuModuleGetFunction")
    return check(cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, function), "attribute")


def whole_program(cu, ptx: str, name: str) -> tuple[int, str]:
    opts, values = _log_options(cu)
    module = check(cu.cuModuleLoadDataEx(ptx.encode() + b"\0", len(opts), opts, values), "cuModuleLoadDataEx")
    return _registers(cu, module, name), _text(values[0])


def driver_linker(cu, ptx: str, name: str) -> tuple[int, str]:
    opts, values = _log_options(cu)
    state = check(cu.cuLinkCreate(len(opts), opts, values), "cuLinkCreate")
    data = ptx.encode() + b"\0"
    check(cu.cuLinkAddData(state, cu.CUjitInputType.CU_JIT_INPUT_PTX, data, len(data), name.encode(), 0, None, None),
          "cuLinkAddData")
    pointer, size = check(cu.cuLinkComplete(state), "cuLinkComplete")
    cubin = ctypes.string_at(int(pointer), size)
    cu.cuLinkDestroy(state)
    return _registers(cu, check(cu.cuModuleLoadData(cubin), "cuModuleLoadData"), name), _text(values[0])


def nvjitlink(cu, ptx: str, name: str) -> tuple[int, str]:
    from cuda.bindings import nvjitlink as nj

    handle = nj.create(1, ["-arch=sm_90a"])
    nj.add_data(handle, nj.InputType.PTX, ptx.encode(), len(ptx.encode()), name)
    nj.complete(handle)
    cubin = bytearray(nj.get_linked_cubin_size(handle))
    nj.get_linked_cubin(handle, cubin)
    log = bytearray(nj.get_info_log_size(handle))
    nj.get_info_log(handle, log)
    nj.destroy(handle)
    return _registers(cu, check(cu.cuModuleLoadData(bytes(cubin)), "cuModuleLoadData"), name), _text(log)


def main() -> None:
    cu = driver()
    make_current(device(0))
    cases = {
        "gemm, producer warpgroup": (gemm_sm90_kernel, {**CONFIG_SM90[0], "TRANS_B": 0, "PRODUCER": 1},
                                     {"A": 16, "B": 16, "C": 16}),
        "attention_sm90 D=128": (attention_sm90, {"D": 128, "KEYS": 128, "WARPS": 8},
                                 {"Q": 16, "K": 16, "V": 16, "O": 16, "L": 4}),
    }
    paths: dict[str, Callable] = {"cuModuleLoadDataEx": whole_program, "cuLink": driver_linker,
                                  "nvJitLink": nvjitlink}
    for label, (kernel, constants, aligns) in cases.items():
        compiled = compile_for_launch(kernel, "sm_90a", constants, aligns)
        for path, load in paths.items():
            try:
                regs, log = load(cu, compiled.ptx, compiled.name)
                notes = [line.strip() for line in log.splitlines() if "Performance Loss" in line]
                print(f"{label:26s} {path:20s} {regs:4d} registers  {'; '.join(notes) or 'no notes'}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"{label:26s} {path:20s} failed: {type(e).__name__}: {str(e)[:160]}", flush=True)


if __name__ == "__main__":
    main()
