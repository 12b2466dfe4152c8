import ctypes, sys
from tkc.compiler import compile_for_launch
from tkc.kernels import attention_sm90, gemm_sm90_kernel
from tkc.runtime.driver import check, device, driver, make_current
from tkc.kernels.gemm import CONFIG_SM90
cu = driver(); make_current(device(0))

def load_ex(ptx, name):
    size = 1 << 16
    info, err = bytearray(size), bytearray(size)
    opts = [cu.CUjit_option.CU_JIT_INFO_LOG_BUFFER, cu.CUjit_option.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            cu.CUjit_option.CU_JIT_ERROR_LOG_BUFFER, cu.CUjit_option.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, cu.CUjit_option.CU_JIT_LOG_VERBOSE]
    mod = check(cu.cuModuleLoadDataEx(ptx.encode() + b"\0", len(opts), opts, [info, size, err, size, 1]), "load")
    f = check(cu.cuModuleGetFunction(mod, name.encode()), "get")
    regs = check(cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, f), "attr")
    return regs, info.split(b"\0",1)[0].decode()

def link_nopic(ptx, name):
    size = 1 << 16
    info, err = bytearray(size), bytearray(size)
    opts = [cu.CUjit_option.CU_JIT_INFO_LOG_BUFFER, cu.CUjit_option.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            cu.CUjit_option.CU_JIT_ERROR_LOG_BUFFER, cu.CUjit_option.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            cu.CUjit_option.CU_JIT_LOG_VERBOSE, cu.CUjit_option.CU_JIT_POSITION_INDEPENDENT_CODE]
    state = check(cu.cuLinkCreate(len(opts), opts, [info, size, err, size, 1, 0]), "cuLinkCreate")
    data = ptx.encode() + b"\0"
    check(cu.cuLinkAddData(state, cu.CUjitInputType.CU_JIT_INPUT_PTX, data, len(data), name.encode(), 0, None, None), "add")
    ptr, n = check(cu.cuLinkComplete(state), "complete")
    cubin = ctypes.string_at(int(ptr), n)
    cu.cuLinkDestroy(state)
    mod = check(cu.cuModuleLoadData(cubin), "load")
    f = check(cu.cuModuleGetFunction(mod, name.encode()), "get")
    regs = check(cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, f), "attr")
    return regs, info.split(b"\0",1)[0].decode() + err.split(b"\0",1)[0].decode()

def nvjit_nopic(ptx, name):
    return nvjit(ptx, name, ["-arch=sm_90a", "-no-pic"])

def nvjit(ptx, name, options=("-arch=sm_90a",)):
    from cuda.bindings import nvjitlink as nj
    h = nj.create(len(options), list(options))
    data = ptx.encode()
    nj.add_data(h, nj.InputType.PTX, data, len(data), name)
    nj.complete(h)
    n = nj.get_linked_cubin_size(h); buf = bytearray(n); nj.get_linked_cubin(h, buf)
    ln = nj.get_info_log_size(h); log = bytearray(ln); nj.get_info_log(h, log)
    nj.destroy(h)
    mod = check(cu.cuModuleLoadData(bytes(buf)), "load")
    f = check(cu.cuModuleGetFunction(mod, name.encode()), "get")
    regs = check(cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, f), "attr")
    return regs, log.decode(errors="replace")

def linkp(ptx, name):
    from tkc.runtime.driver import link_ptx
    import warnings
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cubin = link_ptx(ptx, name)
    mod = check(cu.cuModuleLoadData(cubin), "load")
    f = check(cu.cuModuleGetFunction(mod, name.encode()), "get")
    regs = check(cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, f), "attr")
    return regs, "; ".join(str(x.message) for x in w)

cases = {
 "gemm producer": (gemm_sm90_kernel, {**CONFIG_SM90[0], "TRANS_B": 0, "PRODUCER": 1}, {"A": 16, "B": 16, "C": 16}),
 "attention D128": (attention_sm90, {"D": 128, "KEYS": 128, "WARPS": 8}, {"Q": 16, "K": 16, "V": 16, "O": 16}),
}
for label, (k, c, a) in cases.items():
    comp = compile_for_launch(k, "sm_90a", c, a)
    for path, fn in (("cuLink", linkp), ("cuModuleLoadDataEx", load_ex), ("nvJitLink", nvjit), ("cuLink PIC=0", link_nopic), ("nvJitLink -no-pic", nvjit_nopic)):
        try:
            regs, log = fn(comp.ptx, comp.name)
            notes = [l for l in log.splitlines() if "Loss" in l or "C75" in l]
            print(f"{label:16s} {path:20s} regs {regs:4d}  notes: {notes or '-'}", flush=True)
        except Exception as e:
            print(f"{label:16s} {path:20s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
