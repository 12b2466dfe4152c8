"""The CUDA driver through cuda-python (`cuda.bindings.driver`): torch's primary context, PTX loaded by the
driver's JIT, modules, launches. Every call is checked; failures become TkcRuntimeError with the driver's name
for the error and, for a PTX the JIT rejects, the PTX line it complains about."""

from __future__ import annotations

from collections.abc import Sequence

import ctypes
import os
import re
import threading
from dataclasses import dataclass
from functools import cache
from typing import Any

from tkc.errors import TkcError, check_cluster_grid


class TkcRuntimeError(TkcError, RuntimeError):
    """The GPU, its driver or a launch failed."""


@cache
def driver() -> Any:
    """The cuda.bindings.driver module, initialized; a clear error where there is no usable driver or GPU."""
    try:
        from cuda.bindings import driver as cu
    except ImportError as e:
        raise TkcRuntimeError(f"cuda-python is not installed ({e}); pip install cuda-bindings to run kernels") from None
    try:
        (err,) = cu.cuInit(0)
    except Exception as e:  # the bindings raise when libcuda itself cannot be found
        raise TkcRuntimeError(
            f"no NVIDIA driver on this machine ({type(e).__name__}); tkc can compile here (tkc compile) but not run kernels"
        ) from None
    if err != cu.CUresult.CUDA_SUCCESS:
        raise TkcRuntimeError(f"cuInit failed: {_name(cu, err)}; is there a CUDA GPU on this machine?")
    return cu


def _name(cu: Any, err: Any) -> str:
    try:
        _, text = cu.cuGetErrorName(err)
        return text.decode() if isinstance(text, bytes) else str(text)
    except Exception:
        return str(err)


def check(result: Any, what: str) -> Any:
    """A driver call's (CUresult, values...) → its values; a TkcRuntimeError on failure."""
    cu = driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise TkcRuntimeError(f"{what} failed: {_name(cu, err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@dataclass(frozen=True)
class Device:
    ordinal: int
    name: str
    capability: tuple[int, int]
    context: Any
    multiprocessors: int

    @property
    def sm(self) -> int:
        return 10 * self.capability[0] + self.capability[1]


@cache
def device(ordinal: int) -> Device:
    """Device `ordinal`, with torch's primary context current (so that kernels and torch share memory and streams)."""
    cu = driver()
    dev = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
    major = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute")
    minor = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute")
    name = check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
    name = name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)
    sms = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "cuDeviceGetAttribute")
    context = check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    return Device(ordinal, name, (major, minor), context, sms)


def make_current(dev: Device) -> None:
    cu = driver()
    check(cu.cuCtxSetCurrent(dev.context), "cuCtxSetCurrent")


def _quote_ptx_line(log: str, ptx: str) -> str:
    m = re.search(r"line (\d+)", log)
    if not m:
        return ""
    lineno = int(m.group(1))
    lines = ptx.splitlines()
    if 1 <= lineno <= len(lines):
        from tkc.backend.ptx_printer import source_of_line

        source = source_of_line(ptx, lineno)
        return f"\n  PTX line {lineno}: {lines[lineno - 1].strip()}" + (f"\n  from {source}" if source else "")
    return ""


class TkcPerformanceWarning(UserWarning):
    """The driver's JIT compiled a kernel slower than its PTX asks for (e.g. wgmma serialized)."""


def _warn_performance_notes(log: str, name: str) -> None:
    """The JIT's "Potential Performance Loss" notes (C75xx: wgmma serialized, setmaxnreg ignored, ...) as a warning:
    they mean the kernel runs far below its speed, and the info log is otherwise never seen."""
    import warnings

    notes = [line.split("info    :", 1)[-1].strip() for line in log.splitlines() if "Performance Loss" in line]
    if notes:
        warnings.warn(f"the driver's JIT on `{name}`: " + "; ".join(notes), TkcPerformanceWarning, stacklevel=3)


@dataclass
class LoadedKernel:
    module: Any
    function: Any
    threads: int
    shared_bytes: int  # dynamic shared memory per launch
    dependent_launch: bool = False  # it waits for its predecessors itself (griddepcontrol.wait, sm_90 code)
    prefers_dependent_launch: bool = False  # its kernel asked for programmatic dependent launch (@tkc.kernel)
    cluster: int = 1  # launched in clusters of this many blocks along x (.reqnctapercluster)
    name: str = ""


PORTABLE_CLUSTER = 8  # blocks a cluster that every sm_90 GPU launches; more need the kernel's opt-in


def load_ptx(ptx: str, name: str, threads: int, shared_bytes: int, dependent_launch: bool = False,
             cluster: int = 1) -> LoadedKernel:
    """Load PTX with the driver's JIT as one whole program (`cuModuleLoadDataEx`; the driver keeps the machine code
    in its compute cache, so a later load of the same PTX is quick). Not through a linker (cuLink*, nvJitLink):
    those compile each input as a separate compilation unit, which ignores `setmaxnreg` (C7504) and allocates
    registers differently (bench/jit_paths.py). The JIT's error log becomes the error, quoting the PTX line; its
    performance notes become a TkcPerformanceWarning."""
    cu = driver()
    log_size = 1 << 16
    error_log, info_log = bytearray(log_size), bytearray(log_size)
    # line info: the PTX's `.loc` lines (the kernel's Python lines) kept in the machine code's line table, for
    # Nsight Compute's source view and compute-sanitizer's reports; the instructions are the same without it
    opts = [cu.CUjit_option.CU_JIT_ERROR_LOG_BUFFER, cu.CUjit_option.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            cu.CUjit_option.CU_JIT_INFO_LOG_BUFFER, cu.CUjit_option.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            cu.CUjit_option.CU_JIT_GENERATE_LINE_INFO]
    err, module = cu.cuModuleLoadDataEx(ptx.encode() + b"\0", len(opts), opts,
                                        [error_log, log_size, info_log, log_size, 1])
    if err:
        log = error_log.split(b"\0", 1)[0].decode(errors="replace").strip()
        raise TkcRuntimeError(f"the driver's JIT rejected the PTX of `{name}` ({_name(cu, err)}):\n{log}"
                              f"{_quote_ptx_line(log, ptx)}")
    _warn_performance_notes(info_log.split(b"\0", 1)[0].decode(errors="replace"), name)
    function = check(cu.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")
    if shared_bytes > 48 * 1024:
        err, *_ = cu.cuFuncSetAttribute(function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        shared_bytes)
        if err:  # most likely a GPU with less shared memory a block than the target's (an sm_86 / sm_89 card)
            limit = _shared_bytes_limit(cu)
            if limit is not None and shared_bytes > limit:
                raise TkcRuntimeError(f"`{name}` needs {shared_bytes} bytes of shared memory a block; this GPU allows "
                                      f"{limit} (its constants ask for more than the card has: smaller tiles or fewer "
                                      "pipeline stages)")
            check(err, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
    if cluster > PORTABLE_CLUSTER:  # 9-16 blocks: an H100 / H200 places them in a GPC of 16 free multiprocessors
        check(cu.cuFuncSetAttribute(function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                                    1), "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)")
    return LoadedKernel(module, function, threads, shared_bytes, dependent_launch, cluster=cluster, name=name)


def _shared_bytes_limit(cu: Any) -> int | None:
    """The current context's device's largest dynamic shared memory a block (opt-in), or None if it cannot say."""
    err, dev = cu.cuCtxGetDevice()
    if err:
        return None
    err, limit = cu.cuDeviceGetAttribute(
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev)
    return None if err else int(limit)


_SWIZZLES = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}


def tensor_map_2d(address: int, rows: int, cols: int, row_bytes: int, box_rows: int, box_cols: int, swizzle: int,
                  element: str = "bf16", outer: Sequence[tuple[int, int]] = ()) -> bytes:
    """The 128-byte TMA descriptor (`cuTensorMapEncodeTiled`) of a row-major rows × cols matrix at global
    `address` whose rows are `row_bytes` apart, copied in boxes of box_rows × box_cols with the given swizzle
    (0, 32, 64 or 128 bytes; a swizzled box row is at most that wide). Out-of-bounds elements of a box read zeros.
    With `outer` ((size, bytes apart) per further dimension, innermost first), a map of up to 5 dimensions whose
    boxes are one matrix deep: a box stops at its matrix's last row (e.g. at the end of one head of a (B, H, N, D)
    tensor), whatever the strides of the outer dimensions."""
    cu = driver()
    dtypes = {"bf16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
              "f16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
              "f32": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
              "u8": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8}  # fp8: TMA moves bytes
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t
    dims, strides, box = [u64(cols), u64(rows)], [u64(row_bytes)], [u32(box_cols), u32(box_rows)]
    for size, stride in outer:
        dims, strides, box = dims + [u64(size)], strides + [u64(stride)], box + [u32(1)]
    tmap = check(cu.cuTensorMapEncodeTiled(
        dtypes[element], len(dims), address, dims, strides, box,
        [u32(1)] * len(dims), cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(cu.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{_SWIZZLES[swizzle]}"),
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
    return ctypes.string_at(tmap.getPtr(), 128)


def blocks_per_multiprocessor(kernel: LoadedKernel) -> int:
    """How many blocks of the kernel fit on one multiprocessor at once (registers, shared memory, threads)."""
    cu = driver()
    return check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(kernel.function, kernel.threads, kernel.shared_bytes),
                 "cuOccupancyMaxActiveBlocksPerMultiprocessor")


def resident_blocks(kernel: LoadedKernel, multiprocessors: int) -> int:
    """How many blocks of the kernel the GPU holds at once: multiprocessors × blocks per multiprocessor, or for a
    kernel of clusters, the clusters the GPU places at once × their blocks (a cluster's blocks share one GPC, so
    some multiprocessors may stay idle; clusters of more than 8 blocks: 0 where the GPU places none)."""
    if kernel.cluster == 1:
        return multiprocessors * max(1, blocks_per_multiprocessor(kernel))
    cu = driver()
    config = _launch_config(cu, kernel, dependent=False)
    config.gridDimX, config.gridDimY, config.gridDimZ = kernel.cluster, 1, 1
    err, clusters = cu.cuOccupancyMaxActiveClusters(kernel.function, config)
    if kernel.cluster > PORTABLE_CLUSTER:  # a GPU that cannot place one (or refuses the size) holds none
        return 0 if err else clusters * kernel.cluster
    check((err, clusters), "cuOccupancyMaxActiveClusters")
    return max(1, clusters) * kernel.cluster


# Programmatic dependent launch for the kernels that wait for their predecessors themselves (sm_90 code:
# backend/lowering.py): for those declared @tkc.kernel(dependent_launch=True) (None: each kernel's choice), or for every
# one with TKC_DEPENDENT_LAUNCH=1 (True), or for none with TKC_DEPENDENT_LAUNCH=0 (False). No shipped kernel asks:
# on the H200 it hid layernorm's launch gap back to back (35.9 vs 37.1 µs a call) but cost a GEMM → layernorm
# pair 3 µs (95.1 vs 92.2; RESULTS "dependent launch probe — 2026-12-04 08:00"), and for every kernel it cost the
# 2048³ GEMM 7-17% and gained nothing measurable for attention (RESULTS 2026-12-03 13:1x).
DEPENDENT_LAUNCH: bool | None = {"1": True, "0": False}.get(os.environ.get("TKC_DEPENDENT_LAUNCH", ""))
_configs = threading.local()  # per thread: LoadedKernel id → its reusable CUlaunchConfig


def launch(kernel: LoadedKernel, grid: tuple[int, int, int], stream: int, params: int) -> None:
    """Launch with `params` the address of the kernel parameters' pointer table (`void**`)."""
    cu = driver()
    handle = _streams.get(stream)
    if handle is None:
        handle = _streams[stream] = cu.CUstream(stream)
    dependent = kernel.dependent_launch and (kernel.prefers_dependent_launch if DEPENDENT_LAUNCH is None
                                             else DEPENDENT_LAUNCH)
    if dependent or kernel.cluster > 1:
        if kernel.cluster > 1:
            check_cluster_grid(grid, kernel.cluster, kernel.name)
        config = _launch_config(cu, kernel, dependent)
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.hStream = handle
        err, = cu.cuLaunchKernelEx(config, kernel.function, params, 0)
        if err:
            raise TkcRuntimeError(f"cuLaunchKernelEx failed: {_name(cu, err)}")
        return
    err, = cu.cuLaunchKernel(kernel.function, *grid, kernel.threads, 1, 1, kernel.shared_bytes, handle, params, 0)
    if err:  # CUDA_SUCCESS is 0
        raise TkcRuntimeError(f"cuLaunchKernel failed: {_name(cu, err)}")


def _launch_config(cu: Any, kernel: LoadedKernel, dependent: bool) -> Any:
    """The kernel's launch configuration for cuLaunchKernelEx: programmatic stream serialization allowed where
    `dependent`, its cluster shape where it has one. Made once per thread (a launch then only sets the grid and
    the stream)."""
    configs = _configs.__dict__
    config = configs.get((id(kernel), dependent))
    if config is None:
        attributes = []
        if dependent:
            attribute = cu.CUlaunchAttribute()
            attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attribute.value.programmaticStreamSerializationAllowed = 1
            attributes.append(attribute)
        if kernel.cluster > 1:
            attribute = cu.CUlaunchAttribute()
            attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = kernel.cluster, 1, 1
            attributes.append(attribute)
        config = cu.CUlaunchConfig()
        config.blockDimX, config.blockDimY, config.blockDimZ = kernel.threads, 1, 1
        config.sharedMemBytes = kernel.shared_bytes
        config.attrs = attributes
        config.numAttrs = len(attributes)
        configs[(id(kernel), dependent)] = config
    return config


_streams: dict[int, Any] = {}  # a stream's handle object, made once (a training loop launches on few streams)
