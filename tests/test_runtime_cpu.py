"""The runtime on a machine without a GPU: compiling works, launching says clearly why it cannot."""

from __future__ import annotations

import importlib
import warnings

import pytest

from tkc.errors import TkcError
from tkc.runtime import cache
from tkc.runtime.launch import normalize_grid


def test_no_driver_is_one_clear_error() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from tkc.runtime.driver import TkcRuntimeError, driver

    driver.cache_clear()
    with pytest.raises(TkcRuntimeError, match="no NVIDIA driver|cuInit failed|cuda-python is not installed"):
        driver()


@pytest.mark.parametrize("limit, message", [(101376, "`k` needs 131072 bytes of shared memory a block; this GPU "
                                                     "allows 101376"),
                                            (232448, "cuFuncSetAttribute\\(MAX_DYNAMIC_SHARED_SIZE_BYTES\\) failed")])
def test_shared_memory_beyond_the_gpu_is_one_clear_error(monkeypatch, limit: int, message: str) -> None:
    """Loading a kernel that asks for more shared memory a block than the GPU has (an sm_80 build on an sm_89 card:
    99 KB) says so, with both numbers; a refusal for another reason stays the driver's error (stand-in driver)."""
    import types

    from tkc.runtime import driver
    from tkc.runtime.driver import TkcRuntimeError

    enum = types.SimpleNamespace
    cu = enum(CUjit_option=enum(CU_JIT_ERROR_LOG_BUFFER=0, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES=1,
                                CU_JIT_INFO_LOG_BUFFER=2, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES=3,
                                CU_JIT_GENERATE_LINE_INFO=13),
              CUresult=enum(CUDA_SUCCESS=0), CUfunction_attribute=enum(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8),
              CUdevice_attribute=enum(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN=97),
              cuModuleLoadDataEx=lambda *args: (0, "module"), cuModuleGetFunction=lambda module, name: (0, "function"),
              cuFuncSetAttribute=lambda function, attribute, value: (1,), cuCtxGetDevice=lambda: (0, 0),
              cuDeviceGetAttribute=lambda attribute, dev: (0, limit), cuGetErrorName=lambda err: (0, b"CUDA_ERROR_INVALID_VALUE"))
    monkeypatch.setattr(driver, "driver", lambda: cu)
    with pytest.raises(TkcRuntimeError, match=message):
        driver.load_ptx("// ptx", "k", 128, 131072)



@pytest.mark.parametrize("cluster", [1, 8, 16])
def test_clusters_above_eight_blocks_opt_in(monkeypatch, cluster: int) -> None:
    """A kernel launched in clusters of more than 8 blocks (the portable size) is loaded with the driver's
    NON_PORTABLE_CLUSTER_SIZE_ALLOWED; where the GPU cannot place such a cluster (the occupancy query fails or
    answers 0) it holds no blocks of it: resident_blocks 0, so that a launch plan takes another path (stand-in
    driver)."""
    import types

    from tkc.runtime import driver

    enum = types.SimpleNamespace
    attributes: list[tuple[int, int]] = []
    answers = iter([(0, 7), (0, 0), (1, 0)])  # 7 clusters; none; CUDA_ERROR_INVALID_VALUE
    cu = enum(CUjit_option=enum(CU_JIT_ERROR_LOG_BUFFER=0, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES=1,
                                CU_JIT_INFO_LOG_BUFFER=2, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES=3,
                                CU_JIT_GENERATE_LINE_INFO=13),
              CUresult=enum(CUDA_SUCCESS=0),
              CUfunction_attribute=enum(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8,
                                        CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED=14),
              CUlaunchAttributeID=enum(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION=4),
              CUlaunchAttribute=lambda: enum(id=None, value=enum(clusterDim=enum(x=0, y=0, z=0))),
              CUlaunchConfig=lambda: enum(), cuOccupancyMaxActiveClusters=lambda function, config: next(answers),
              cuModuleLoadDataEx=lambda *args: (0, "module"), cuModuleGetFunction=lambda module, name: (0, "function"),
              cuFuncSetAttribute=lambda function, attribute, value: attributes.append((attribute, value)) or (0,),
              cuGetErrorName=lambda err: (0, b"CUDA_ERROR_INVALID_VALUE"))
    monkeypatch.setattr(driver, "driver", lambda: cu)
    loaded = driver.load_ptx("// ptx", "k", 128, 1024, cluster=cluster)
    assert attributes == ([(14, 1)] if cluster > 8 else [])
    if cluster == 1:
        return
    held = [driver.resident_blocks(loaded, 132) for _ in range(3)] if cluster > 8 else [
        driver.resident_blocks(loaded, 132)]
    assert held == ([7 * 16, 0, 0] if cluster > 8 else [7 * 8])

def test_kernel_entry_points_refuse_cpu_tensors() -> None:
    torch = pytest.importorskip("torch")
    from tkc.kernels import attention, attention_backward, gemm, layernorm

    a = torch.ones(16, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="a is on cpu"):
        gemm(a, a)
    q = torch.ones(1, 1, 64, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="q is on cpu"):
        attention(q, q, q)
    with pytest.raises(ValueError, match="q is on cpu"):
        attention_backward(q, q, q, q, q, torch.zeros(1, 1, 64))
    with pytest.raises(ValueError, match="x is on cpu"):
        layernorm(a, a, a[0], a[0])


def test_layernorm_refuses_an_eps_that_is_not_a_number() -> None:
    torch = pytest.importorskip("torch")
    from tkc.kernels import layernorm

    x = torch.ones(4, 64, dtype=torch.bfloat16)
    for eps in ("1e-5", None, True):
        with pytest.raises(ValueError, match="eps: must be a number"):
            layernorm(x, x, x[0], x[0], eps=eps)


@pytest.mark.parametrize("scale", [-0.125, 0.0, float("nan"), float("inf"), "1"])
def test_attention_refuses_a_scale_that_is_not_positive(scale) -> None:
    """The kernels offset each row by its largest q·k (the largest scale·q·k only for scale > 0): a zero or
    negative scale would give NaN or wrong rows, so it is refused, naming the argument."""
    torch = pytest.importorskip("torch")
    from tkc.kernels import attention

    q = torch.ones(1, 1, 64, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="scale: must be a positive finite number"):
        attention(q, q, q, scale=scale)


def test_launch_refuses_cpu_tensors() -> None:
    torch = pytest.importorskip("torch")
    from tkc.kernels import gemm_kernel

    a = torch.ones(16, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="argument `A` is on cpu"):
        gemm_kernel[(1, 1)](a, a, a)
    with pytest.raises(ValueError, match="argument `A` is on cpu"):
        gemm_kernel.resident_blocks(a, a, a)


def test_common_launch_declines_what_it_does_not_read() -> None:
    """`kernel[grid].common(...)` launches only the common case and otherwise says so, without an error and
    without touching the driver: the entry points then run their own checks (layernorm() names `x`)."""
    torch = pytest.importorskip("torch")
    from tkc.kernels import gemm_kernel

    a = torch.ones(16, 16, dtype=torch.bfloat16)
    assert gemm_kernel[(1, 1)].common(a, a, a) is False  # CPU tensors
    assert gemm_kernel[(1, 1)].common(a, a) is False  # too few arguments


@pytest.mark.parametrize("grid, message", [((0,), "between 1 and"), ((1, 2, 3, 4), "1 to 3"), ((1.5,), "must be an int"),
                                           ((1, 70000), "between 1 and 65535"), ((4, 0, 1), "between 1 and"),
                                           ((2**31, 1, 1), "between 1 and")])
def test_bad_grids(grid, message) -> None:
    with pytest.raises(TkcError, match=message):
        normalize_grid(grid)


def test_cache_round_trip_and_corruption(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TKC_CACHE_DIR", str(tmp_path))
    key = cache.make_key({"kernel": "k", "n": 1})
    assert cache.get(key) is None
    cache.put(key, {"name": "k"}, {"kernel.ptx": b".version 8.0"})
    meta, files = cache.get(key)
    assert meta["name"] == "k" and files["kernel.ptx"] == b".version 8.0"
    (tmp_path / key / "kernel.ptx").write_bytes(b"garbage")  # a torn or tampered entry
    assert cache.get(key) is None and not (tmp_path / key).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary directories left behind"


def test_cache_key_depends_on_what_changes_the_code(tmp_path, monkeypatch) -> None:
    base = {"kernel": "k", "constants": {"D": "64"}, "target": "sm_80", "aligns": {"A": 16}}
    keys = {cache.make_key(base)}
    for change in ({"constants": {"D": "128"}}, {"target": "sm_90a"}, {"aligns": {"A": 2}}):
        keys.add(cache.make_key({**base, **change}))
    assert len(keys) == 4


def test_argument_reader_reads_what_the_full_check_reads() -> None:
    """The launch path's generated reader gives the parameter values and alignments the slow path computes, and
    declines (None: the full check and its error) whatever is not the common case."""
    torch = pytest.importorskip("torch")
    from tkc.kernels import layernorm_kernel
    from tkc.runtime import launch

    class OnGpu0(torch.Tensor):  # what the reader asks of a CUDA tensor, on the CPU
        def get_device(self) -> int:
            return 0

    def cuda(*shape: int, dtype=torch.bfloat16) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype).as_subclass(OnGpu0)

    x, w = cuda(6, 40), cuda(40)
    args = (x, x[1:], w, w, cuda(6, 40), cuda(12, 40)[::2], 1e-5)
    values: list = []
    read = launch.specialize(layernorm_kernel, {}).read
    key = read(args, values)
    assert values == launch._param_values(layernorm_kernel, args)
    assert key[-2] == 0 and key[-1] == tuple(launch.alignment(a) for a in args[:6])
    for bad in ((x,) + args[1:6] + ("1e-5",), args[:6], (x.float(),) + args[1:], (x[None],) + args[1:],
                (torch.empty(6, 40, dtype=torch.bfloat16),) + args[1:], (x.t(),) + args[1:]):
        assert read(bad, []) is None


def test_reader_takes_the_dtype_a_constant_gives() -> None:
    """gemm_kernel's tensors are gl["DT", 2]: specialized with DT=f16 its reader takes f16 tensors and refuses
    bf16 ones (which take the full check)."""
    torch = pytest.importorskip("torch")
    from tkc.kernels import gemm_kernel
    from tkc.lang import f16
    from tkc.runtime import launch

    class OnGpu0(torch.Tensor):
        def get_device(self) -> int:
            return 0

    def cuda(dtype) -> torch.Tensor:
        return torch.empty(64, 64, dtype=dtype).as_subclass(OnGpu0)

    spec = launch.specialize(gemm_kernel, {"DT": f16})
    assert spec.read((cuda(torch.float16),) * 3, []) is not None
    assert spec.read((cuda(torch.bfloat16),) * 3, []) is None
    with pytest.raises(ValueError, match=r"argument `A` is on cpu"):
        launch.check_arguments(gemm_kernel, (torch.empty(64, 64, dtype=torch.float16),) * 3, spec.values)


def _fake_launch_driver(monkeypatch: pytest.MonkeyPatch, calls: list) -> None:
    """A stand-in driver that records each launch call: (function name, its CUlaunchConfig's attributes or None)."""
    from types import SimpleNamespace

    from tkc.runtime import driver

    def attribute() -> SimpleNamespace:
        return SimpleNamespace(value=SimpleNamespace(clusterDim=SimpleNamespace()))

    fake = SimpleNamespace(
        CUstream=lambda handle: handle, CUlaunchAttribute=attribute, CUlaunchConfig=SimpleNamespace,
        CUlaunchAttributeID=SimpleNamespace(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION=6,
                                            CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION=4),
        cuLaunchKernel=lambda *args: calls.append(("cuLaunchKernel", None)) or (0,),
        cuLaunchKernelEx=lambda config, *args: calls.append(("cuLaunchKernelEx", config.attrs)) or (0,))
    monkeypatch.setattr(driver, "driver", lambda: fake)


@pytest.mark.parametrize("setting, prefers, waits, expected", [
    (None, True, True, "cuLaunchKernelEx"),    # the kernel's own choice (@tkc.kernel(dependent_launch=True))
    (None, False, True, "cuLaunchKernel"),
    (None, True, False, "cuLaunchKernel"),     # sm_80 code does not wait for its predecessor: never dependent
    (True, False, True, "cuLaunchKernelEx"),   # TKC_DEPENDENT_LAUNCH=1: every kernel that waits
    (True, True, False, "cuLaunchKernel"),
    (False, True, True, "cuLaunchKernel"),     # TKC_DEPENDENT_LAUNCH=0: none
])
def test_which_launches_are_dependent(setting, prefers, waits, expected, monkeypatch) -> None:
    """Programmatic dependent launch only for kernels that wait for their predecessors themselves, where the kernel
    asks for it or the environment turns it on for all (a stand-in driver records the call)."""
    from tkc.runtime import driver

    calls: list = []
    _fake_launch_driver(monkeypatch, calls)
    monkeypatch.setattr(driver, "DEPENDENT_LAUNCH", setting)
    kernel = driver.LoadedKernel(None, "f", 64, 0, dependent_launch=waits, prefers_dependent_launch=prefers)
    driver.launch(kernel, (4, 1, 1), 7, 0)
    assert [name for name, _ in calls] == [expected]


@pytest.mark.parametrize("dependent", [False, True])
def test_cluster_launch(dependent: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel of clusters launches through cuLaunchKernelEx with its cluster shape (and programmatic
    serialization where dependent); a grid of partial clusters is refused before the driver sees it."""
    from tkc.runtime import driver

    calls: list = []
    _fake_launch_driver(monkeypatch, calls)
    monkeypatch.setattr(driver, "DEPENDENT_LAUNCH", dependent)
    kernel = driver.LoadedKernel(None, "f", 64, 0, dependent_launch=True, cluster=2, name="k")
    driver.launch(kernel, (4, 1, 1), 7, 0)
    (name, attrs), = calls
    assert name == "cuLaunchKernelEx"
    assert [a.id for a in attrs] == [6, 4][1 - dependent:]
    assert (attrs[-1].value.clusterDim.x, attrs[-1].value.clusterDim.y, attrs[-1].value.clusterDim.z) == (2, 1, 1)
    with pytest.raises(ValueError, match=r"kernel `k` runs in clusters of 2 blocks along x: the grid's x \(5\)"):
        driver.launch(kernel, (5, 1, 1), 7, 0)
    assert len(calls) == 1


def test_dependent_launch_option_must_be_a_bool() -> None:
    import tkc

    with pytest.raises(TkcError, match=r"dependent_launch=\.\.\.\) must be True or False, got 1"):
        @tkc.kernel(dependent_launch=1)
        def k() -> None:
            pass


def _fake_gpu(monkeypatch):
    """CPU tensors the launch path takes for CUDA tensors on device 0, and a launch path that compiles for real but
    records its launches instead of calling the driver: (tensor maker, recorded launches)."""
    import ctypes
    import struct
    import types

    torch = pytest.importorskip("torch")
    from tkc.compiler import compile_for_launch
    from tkc.kernels import _checks as checks_module
    from tkc.runtime import launch

    class OnGpu0(torch.Tensor):
        is_cuda = True

        def get_device(self) -> int:
            return 0

    def prepare(kernel, args, constants, target=None, pipeline=None):
        aligns = {p.name: launch.alignment(v) for p, v in zip(kernel.runtime_params, args) if p.kind == "tensor"}
        compiled = compile_for_launch(kernel, target or "sm_80", kernel.resolve_constants(constants), aligns, pipeline)
        loaded = types.SimpleNamespace(params=[tuple(p) for p in compiled.meta()["params"]],
                                       cluster=compiled.meta().get("cluster", 1), kernel=kernel.name,
                                       constants=kernel.resolve_constants(constants), target=target,
                                       shared_bytes=compiled.shared_bytes)
        return loaded, None, types.SimpleNamespace(ordinal=0, multiprocessors=132)

    launches = []

    def record(loaded, grid, stream, params):  # the bytes the driver would read through the pointer table
        table = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        size = launch.ParamBuffer(loaded.params).struct.size
        launches.append((loaded, grid, ctypes.string_at(table[0], size)))

    def tensor_map(t, rows, cols, swizzle, label, stack=False):  # its argument's address and the box, as bytes
        return struct.pack("<QIIIi", t.data_ptr(), rows, cols, swizzle, stack).ljust(128, b"\0")

    monkeypatch.setattr(launch, "prepare", prepare)
    monkeypatch.setattr(launch, "tensor_map", tensor_map)
    monkeypatch.setattr(launch, "launch", record)
    monkeypatch.setattr(launch, "make_current", lambda dev: None)
    monkeypatch.setattr(launch, "current_stream_handle", lambda ordinal: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # (a test may capture)
    monkeypatch.setattr(checks_module, "STREAM_SCRATCH", {})
    monkeypatch.setattr(checks_module, "ARRIVAL_COUNTERS", {})
    monkeypatch.setattr(checks_module, "CAPTURED_COUNTERS", {})
    monkeypatch.setattr(launch._current, "ordinal", None, raising=False)

    def cuda(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape).to(dtype).as_subclass(OnGpu0)

    return cuda, launches


def test_specialized_launches_pack_each_parameter_set_once(monkeypatch) -> None:
    """A specialized kernel's launches reuse the packed parameters of values seen before and pack new ones
    exactly as the parameter list says."""
    from tkc.kernels import gemm_kernel
    from tkc.runtime import launch

    cuda, launches = _fake_gpu(monkeypatch)
    spec = gemm_kernel.specialize(TRANS_B=0, target="sm_80")
    assert spec is gemm_kernel.specialize(TRANS_B=0, target="sm_80")
    a, b, c, c2 = cuda(64, 32), cuda(32, 48), cuda(64, 48), cuda(64, 48)
    for out in (c, c, c2, c):
        spec[(3,)](a, b, out)
    (fast,) = spec.variants.values()
    assert len(fast.params.saved) == 2  # c and c2
    for (_, grid, packed), out in zip(launches, (c, c, c2, c)):
        assert grid == (3, 1, 1)
        assert packed == fast.params.struct.pack(*launch._param_values(gemm_kernel, (a, b, out)))
    with pytest.raises(TkcError, match="has no constant named NOPE"):
        gemm_kernel.specialize(NOPE=1)
    with pytest.raises(TypeError, match="constant `BM` must be a number or a bool, got list"):
        gemm_kernel[(1,)](a, b, c, BM=[128])


def test_gemm_common_call_launches_what_the_checked_call_did(monkeypatch) -> None:
    """gemm()'s common call (no checks of its own) launches the kernel, grid and arguments of the fully checked
    first call (also into a given out); what it cannot take (other dtypes, a column-major b or out) still meets the
    full checks."""
    import importlib

    torch = pytest.importorskip("torch")
    from tkc.kernels import gemm
    from tkc.runtime import launch

    gemm_module = importlib.import_module("tkc.kernels.gemm")
    cuda, launches = _fake_gpu(monkeypatch)
    monkeypatch.setattr(gemm_module, "_PLANS", {})
    monkeypatch.setitem(gemm_module.MULTIPROCESSORS, 0, 132)
    a, b = cuda(300, 40), cuda(40, 200)
    first = gemm(a, b, target="sm_80")
    assert first.shape == (300, 200) and launches[-1][1] == (3 * 2, 1, 1)
    checked, launch_check_tensor = [], gemm_module.check_tensor
    monkeypatch.setattr(gemm_module, "check_tensor", lambda *args: checked.append(args[0]))
    out = gemm(a, b, target="sm_80")
    assert not checked and len(launches) == 2 and launches[1][0] is launches[0][0] and launches[1][1] == (6, 1, 1)
    assert launches[1][2] == launch.ParamBuffer(launches[1][0].params).struct.pack(
        *launch._param_values(gemm_module.gemm_kernel, (a, b, out)))
    given = cuda(300, 200)
    assert gemm(a, b, target="sm_80", out=given) is given and not checked
    assert launches[-1][2] == launch.ParamBuffer(launches[1][0].params).struct.pack(
        *launch._param_values(gemm_module.gemm_kernel, (a, b, given)))
    gemm(a, cuda(200, 40).t(), target="sm_80")  # column-major b: the full path
    gemm(a, b, target="sm_80", out=cuda(300, 200).t().contiguous().t())  # a column-major out: the full path
    assert checked == ["a", "b", "a", "b", "out"]
    monkeypatch.setattr(gemm_module, "check_tensor", launch_check_tensor)
    with pytest.raises(ValueError, match="a must be torch.bfloat16"):
        gemm(cuda(300, 40, dtype=torch.float32), b, target="sm_80")


def test_gemm_few_rows_in_clusters_outside_captures(monkeypatch) -> None:
    """FEW_ROWS_IN_CLUSTERS "eager": a few rows and a long K launch the one-launch cluster kernel outside CUDA graph
    captures and the two kernels (the split product, then the sum of its runs) in a capture; scaled_mm() alike."""
    import importlib

    import torch

    from tkc.kernels import gemm
    from tkc.runtime import launch

    gemm_module = importlib.import_module("tkc.kernels.gemm")
    cuda, launches = _fake_gpu(monkeypatch)
    monkeypatch.setattr(gemm_module, "_PLANS", {})
    monkeypatch.setitem(gemm_module.MULTIPROCESSORS, 0, 132)
    monkeypatch.setattr(launch, "resident_blocks_on", lambda loaded, sms: 128)
    monkeypatch.setattr(gemm_module, "FEW_ROWS_IN_CLUSTERS", "eager")
    monkeypatch.setattr(gemm_module, "FEW_ROWS_LAST_BLOCK", False)  # (taken before the clusters)
    a, b = cuda(16, 4096), cuda(4096, 4096)
    for capturing in (False, False, True, True):  # the checked call and the common call, each way
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda capturing=capturing: capturing)
        gemm(a, b, target="sm_90a")
    assert [loaded.kernel for loaded, _, _ in launches] == (["gemm_few_rows_cluster_kernel"] * 2
                                                           + ["gemm_few_rows_kernel", "sum_splits_kernel"] * 2)


def test_arrival_counters_per_stream_and_per_captured_launch(monkeypatch) -> None:
    """arrival_counters: one set a stream, grown where a launch needs more; in a CUDA graph capture a slice of its
    own of counters made at zero outside captures (no memset in the graph), and where those run out, fresh ones."""
    import torch

    from tkc.kernels import _checks as checks_module
    from tkc.runtime import launch

    monkeypatch.setattr(launch, "current_stream_handle", lambda ordinal: 1)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(checks_module, "ARRIVAL_COUNTERS", {})
    monkeypatch.setattr(checks_module, "CAPTURED_COUNTERS", {})
    monkeypatch.setattr(checks_module, "CAPTURED_COUNTERS_MADE", 100)
    like, key = torch.empty(1), checks_module.current_stream_key
    stream_counters = checks_module.arrival_counters(torch, like, 32, key(torch, like))
    assert stream_counters.dtype == torch.int32 and stream_counters.numel() == 1024 and not stream_counters.any()
    assert checks_module.arrival_counters(torch, like, 64, key(torch, like)) is stream_counters
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    made = checks_module.CAPTURED_COUNTERS[-1][0]
    first, second = (checks_module.arrival_counters(torch, like, 40, key(torch, like)) for _ in range(2))
    assert first.numel() == second.numel() == 40 and first.data_ptr() == made.data_ptr()
    assert second.data_ptr() == made.data_ptr() + 40 * 4  # a slice of its own for each captured launch
    fresh = checks_module.arrival_counters(torch, like, 40, key(torch, like))  # 20 left of 100: counters the graph zeroes
    assert fresh.numel() == 40 and not fresh.any() and fresh.untyped_storage().data_ptr() != made.data_ptr()


def test_stream_scratch_is_one_workspace_a_stream_and_shape(monkeypatch) -> None:
    """stream_scratch: the same workspace for a stream and shape call after call (a stream's launches run one after
    another), another for another stream or shape, and a fresh one in a CUDA graph capture (the graph's own)."""
    import torch

    from tkc.kernels import _checks as checks_module
    from tkc.runtime import launch

    stream = [1]
    monkeypatch.setattr(launch, "current_stream_handle", lambda ordinal: stream[0])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(checks_module, "STREAM_SCRATCH", {})
    like, key = torch.empty(1), checks_module.current_stream_key
    first = checks_module.stream_scratch(torch, like, (4, 16, 128), torch.float32, key(torch, like))
    assert first.shape == (4, 16, 128) and first.dtype == torch.float32
    assert checks_module.stream_scratch(torch, like, (4, 16, 128), torch.float32, key(torch, like)) is first
    assert checks_module.stream_scratch(torch, like, (2, 16, 128), torch.float32, key(torch, like)) is not first
    stream[0] = 2
    assert checks_module.stream_scratch(torch, like, (4, 16, 128), torch.float32, key(torch, like)) is not first
    stream[0] = 1
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert checks_module.stream_scratch(torch, like, (4, 16, 128), torch.float32, key(torch, like)) is not first
    assert len(checks_module.STREAM_SCRATCH) == 3


@pytest.mark.parametrize("setting", ["eager", True])
def test_gemm_few_rows_last_block_launches(setting, monkeypatch) -> None:
    """FEW_ROWS_LAST_BLOCK: a few rows and a long K launch gemm_few_rows_last_kernel (one launch, the last run of a
    block column summing) outside CUDA graph captures, on the stream's int32 counters at zero; in a capture the two
    kernels ("eager") or the one launch on counters of the capture's own (True)."""
    import importlib

    import torch

    from tkc.kernels import gemm

    gemm_module = importlib.import_module("tkc.kernels.gemm")
    checks_module = importlib.import_module("tkc.kernels._checks")
    cuda, launches = _fake_gpu(monkeypatch)
    monkeypatch.setattr(gemm_module, "_PLANS", {})
    monkeypatch.setitem(gemm_module.MULTIPROCESSORS, 0, 132)
    monkeypatch.setattr(gemm_module, "FEW_ROWS_LAST_BLOCK", setting)
    monkeypatch.setattr(checks_module, "ARRIVAL_COUNTERS", {})
    a, b = cuda(16, 4096), cuda(4096, 4096)
    for capturing in (False, False, True, True):  # the checked call and the common call, each way
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda capturing=capturing: capturing)
        gemm(a, b, target="sm_90a")
    captured = ([("gemm_few_rows_last_kernel", (32, 4, 1))] if setting is True else
                [("gemm_few_rows_kernel", (32, 4, 1)), ("sum_splits_kernel", (16, 4, 1))])
    assert [(loaded.kernel, grid) for loaded, grid, _ in launches] == (
        [("gemm_few_rows_last_kernel", (32, 4, 1))] * 2 + captured * 2)
    (counters,) = checks_module.ARRIVAL_COUNTERS.values()
    assert list(checks_module.ARRIVAL_COUNTERS) == [(0, 0)] and counters.dtype == torch.int32 and not counters.any()


def test_scaled_mm_few_rows_last_block_launches(monkeypatch) -> None:
    """FEW_ROWS_LAST_BLOCK "eager": scaled_mm() of 16 rows over a long K launches scaled_mm_few_rows_last_kernel
    (one launch) outside CUDA graph captures, the two kernels in a capture."""
    import importlib

    import torch

    from tkc.kernels import scaled_mm

    module = importlib.import_module("tkc.kernels.scaled_mm")
    cuda, launches = _fake_gpu(monkeypatch)
    monkeypatch.setattr(importlib.import_module("tkc.kernels.gemm"), "FEW_ROWS_LAST_BLOCK", "eager")
    monkeypatch.setattr(importlib.import_module("tkc.kernels._checks"), "ARRIVAL_COUNTERS", {})
    monkeypatch.setattr(module, "_PLANS", {})
    monkeypatch.setitem(importlib.import_module("tkc.kernels._checks").MULTIPROCESSORS, 0, 132)
    fp8 = torch.float8_e4m3fn
    x, w = cuda(16, 4096, dtype=fp8), cuda(512, 4096, dtype=fp8)
    for capturing in (False, False, True, True):  # the checked call and the common call, each way
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda capturing=capturing: capturing)
        scaled_mm(x, w.t(), cuda(16, 1, dtype=torch.float32), cuda(1, 512, dtype=torch.float32), target="sm_90a")
    assert [(loaded.kernel, grid) for loaded, grid, _ in launches] == (
        [("scaled_mm_few_rows_last_kernel", (4, 4, 1))] * 2
        + [("gemm_few_rows_kernel", (4, 4, 1)), ("sum_scaled_splits_kernel", (1, 2, 1))] * 2)


def test_gemm_split_along_k_launches_one_cluster_kernel(monkeypatch) -> None:
    """A few rows and a long K: gemm() launches the swapped product with each block column's runs of K as a
    cluster (grid: column blocks × runs), the checked call and the common call alike; where the GPU would not hold
    all the clusters at once, the split product on (column blocks, runs of K) and then the sum of the runs."""
    import importlib

    from tkc.kernels import gemm
    from tkc.runtime import launch

    gemm_module = importlib.import_module("tkc.kernels.gemm")
    cuda, launches = _fake_gpu(monkeypatch)
    monkeypatch.setattr(gemm_module, "_PLANS", {})
    monkeypatch.setitem(gemm_module.MULTIPROCESSORS, 0, 132)
    monkeypatch.setattr(launch, "resident_blocks_on", lambda loaded, sms: 128)  # 32 clusters of 4, 64 of 2
    monkeypatch.setattr(gemm_module, "FEW_ROWS_IN_CLUSTERS", True)
    monkeypatch.setattr(gemm_module, "FEW_ROWS_LAST_BLOCK", False)  # (taken before the clusters)
    a, b = cuda(16, 4096), cuda(4096, 4096)
    checked, check_tensor = [], gemm_module.check_tensor
    monkeypatch.setattr(gemm_module, "check_tensor", lambda *args: checked.append(args[0]) or check_tensor(*args))
    for _ in range(2):
        out = gemm(a, b, target="sm_90a")
        assert out.shape == (16, 4096)
    assert checked == ["a", "b"]  # the second call: the common call's plan
    assert [grid for _, grid, _ in launches] == [(128, 1, 1)] * 2  # 128 columns of C a cluster of 4 runs
    assert launches[1][0] is launches[0][0]
    gemm(a, cuda(8192, 4096), trans_b=True, target="sm_90a")  # the weight N×K: 64 column blocks × 2 runs
    assert [grid for _, grid, _ in launches[2:]] == [(128, 1, 1)] and launches[2][0] is not launches[0][0]
    gemm(cuda(32, 4096), cuda(8192, 4096), trans_b=True, target="sm_90a")  # 32 rows: another variant, its own plan
    assert [grid for _, grid, _ in launches[3:]] == [(128, 1, 1)] and launches[3][0] is not launches[2][0]
    # rows of a wider a, a column-major b (read as trans_b), out a slice of a wider tensor: the same path
    wide_out = cuda(16, 1024)
    gemm(cuda(16, 4160)[:, :4096], cuda(1000, 4096).t(), target="sm_90a", out=wide_out[:, :1000])
    assert [grid for _, grid, _ in launches[4:]] == [(32, 1, 1)]
    # more clusters than the GPU holds at once: the two kernels
    monkeypatch.setattr(gemm_module, "_PLANS", {})
    monkeypatch.setattr(launch, "resident_blocks_on", lambda loaded, sms: 64)
    monkeypatch.setattr(launch, "_specialized", {})  # the resident count is asked once per variant
    gemm(a, b, target="sm_90a")
    assert [grid for _, grid, _ in launches[5:]] == [(32, 4, 1), (16, 4, 1)]


def _fake_gpu_for_attention(monkeypatch):
    """_fake_gpu for attention(): a GPU of 132 multiprocessors (227 KB of shared memory a block) that holds one block
    of each on each, no plans made yet, no CUDA graph being captured; (the module tkc.kernels.attention, tensor maker,
    recorded launches)."""
    import importlib

    import torch

    from tkc.kernels import _checks
    from tkc.runtime import launch

    attention_module = importlib.import_module("tkc.kernels.attention")
    cuda, launches = _fake_gpu(monkeypatch)
    monkeypatch.setattr(launch, "resident_blocks_on", lambda loaded, sms: sms)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(attention_module, "_PLANS", {})
    monkeypatch.setattr(attention_module, "_KVCACHE", {})
    monkeypatch.setattr(importlib.import_module("tkc.kernels.attention_decode"), "_PLANS", {})
    monkeypatch.setitem(attention_module.MULTIPROCESSORS, 0, 132)
    monkeypatch.setitem(_checks.SHARED_MEMORY_LIMITS, 0, 232448)
    return attention_module, cuda, launches


def test_attention_common_call_launches_what_the_checked_call_did(monkeypatch) -> None:
    """attention()'s common call launches the kernel, grid and arguments of the fully checked first call (here a
    persistent configuration: the grid is the GPU's resident blocks); misaligned strides, out= and return_lse
    still meet the full checks."""
    from tkc.kernels import attention
    from tkc.runtime import launch

    attention_module, cuda, launches = _fake_gpu_for_attention(monkeypatch)
    q, k, v = cuda(2, 3, 200, 64), cuda(2, 3, 300, 64), cuda(2, 3, 300, 64)
    attention(q, k, v, target="sm_90a")
    assert launches[-1][1] == (min(2 * 3 * 2, 132), 1, 1)  # 2·3 heads × 2 query blocks of 128 rows
    checked, check_tensor, check_like = [], attention_module.check_tensor, attention_module.check_like
    monkeypatch.setattr(attention_module, "check_tensor", lambda *args: checked.append(args[0]))
    monkeypatch.setattr(attention_module, "check_like", lambda *args: checked.append(args[0]))
    out = attention(q, k, v, target="sm_90a", scale=0.25)
    assert not checked and len(launches) == 2 and launches[1][:2] == launches[0][:2]
    args = (q, k, v, out, attention_module.UNREAD_LSE[0], 0.25)
    (fast,) = [f for spec in launch._specialized.values() for f in spec.variants.values() if f.loaded is launches[1][0]]
    maps = [launch.tensor_map(args[i], rows, cols, swizzle, label, stack)
            for i, label, rows, cols, swizzle, stack in fast.tensor_maps]
    assert len(maps) == 3 and launches[1][2] == fast.params.struct.pack(
        *launch._param_values(attention_module.attention_sm90, args), *maps)
    attention(q, k, v, target="sm_90a", return_lse=True)
    attention(q, k, v, target="sm_90a", out=cuda(2, 3, 200, 64))
    assert checked == ["q", "k", "v"] + ["q", "k", "v", "out"]
    monkeypatch.setattr(attention_module, "check_tensor", check_tensor)
    monkeypatch.setattr(attention_module, "check_like", check_like)
    with pytest.raises(ValueError, match="k: the Hopper kernel reads and writes through TMA"):
        attention(q, cuda(2, 3, 300, 68)[..., :64], v, target="sm_90a")


def test_attention_head_dims_32_and_96_on_hopper(monkeypatch) -> None:
    """On a Hopper GPU, D = 32: attention() and attention_backward() launch the sm_80 kernels built for sm_80 (no
    wgmma kernel takes it), a few queries too (no decoding kernel either: the lengths must then be multiples of 64),
    and target="sm_90a" is one error naming the head dims it takes. D = 96: the wgmma kernels (forward, dK/dV, dQ),
    a few queries too (attention_sm90: no decoding kernel at D = 96)."""
    torch = pytest.importorskip("torch")
    from tkc.kernels import _checks, attention, attention_backward

    attention_module, cuda, launches = _fake_gpu_for_attention(monkeypatch)
    monkeypatch.setitem(_checks._HOPPER, 0, True)
    monkeypatch.setattr(attention_module, "_DECODING", {(0, None)})  # a decoding launch came before
    for d in (32, 96):
        q, k, v = cuda(2, 4, 128, d), cuda(2, 4, 128, d), cuda(2, 4, 128, d)
        out = attention(q, k, v, causal=True)
        fwd = launches[-1]
        hopper = d == 96
        assert fwd[0].kernel == ("attention_sm90" if hopper else "attention_fwd") and fwd[0].constants["D"] == d
        assert fwd[0].target == ("sm_90a" if hopper else "sm_80")
        attention_backward(q, k, v, out, cuda(2, 4, 128, d), cuda(2, 4, 128, dtype=torch.float32), causal=True)
        suffix = "_sm90" if hopper else ""
        assert [launch[0].kernel for launch in launches[-3:]] == ["attention_bwd_delta", f"attention_bwd_dkdv{suffix}",
                                                                  f"attention_bwd_dq{suffix}"]
        assert [launch[0].target for launch in launches[-2:]] == ["sm_90a" if hopper else "sm_80"] * 2
        if hopper:
            attention(cuda(1, 4, 1, d), cuda(1, 4, 100, d), cuda(1, 4, 100, d))  # a few queries, any length
            assert launches[-1][0].kernel == "attention_sm90"
            attention(cuda(1, 4, 1, d), cuda(1, 4, 100, d), cuda(1, 4, 100, d))  # the common call: no decoding plan
            assert launches[-1][0].kernel == "attention_sm90"
            continue
        with pytest.raises(ValueError, match="sequence lengths must be multiples of 64"):
            attention(cuda(1, 4, 1, d), cuda(1, 4, 100, d), cuda(1, 4, 100, d))  # no decoding kernel at this D
        with pytest.raises(ValueError, match=f"target sm_90a's kernels take head dims 64, 96, 128 and 256, got {d}"):
            attention(q, k, v, target="sm_90a")
    with pytest.raises(ValueError, match="q: head dim must be 32, 64, 96, 128 or 256, got 80"):
        attention(*(cuda(1, 1, 64, 80) for _ in range(3)))


def test_attention_head_dim_256(monkeypatch) -> None:
    """D = 256 on Hopper: attention_sm90 in its configuration (two stages, a producer; persistent with 80-key steps
    not causal, two query blocks a block with 64-key steps causal), a few queries by the decoding kernels; the
    backward's wgmma kernels, dK and dV in halves of 128 columns (HALVES: a block of two warpgroups each 64 keys).
    With target="sm_80": attention_fwd (16 rows a warp, 32-key steps, Q in shared memory) and the mma.sync
    backward, dK, dV and dQ in halves (two blocks a key block)."""
    torch = pytest.importorskip("torch")
    from tkc.kernels import _checks, attention, attention_backward

    attention_module, cuda, launches = _fake_gpu_for_attention(monkeypatch)
    monkeypatch.setitem(_checks._HOPPER, 0, True)
    q, k, v = cuda(2, 4, 128, 256), cuda(2, 4, 128, 256), cuda(2, 4, 128, 256)
    lse = cuda(2, 4, 128, dtype=torch.float32)
    for causal in (False, True):
        attention(q, k, v, causal=causal)
        launch = launches[-1][0]
        assert launch.kernel == "attention_sm90" and launch.target == "sm_90a"
        assert {key: launch.constants[key] for key in ("D", "KEYS", "WARPS", "STAGES", "PRODUCER")} == \
            {"D": 256, "KEYS": 64 if causal else 80, "WARPS": 8, "STAGES": 2, "PRODUCER": 1 if causal else 2}
        attention_backward(q, k, v, q, q, lse, causal=causal)
        (_, _, _), (dkdv, dkdv_grid, _), (dq, dq_grid, _) = launches[-3:]
        assert (dkdv.kernel, dkdv.constants["HALVES"], dkdv_grid) == ("attention_bwd_dkdv_sm90", 2, (2, 4, 2))
        assert (dq.kernel, dq.constants["WARPS"], dq_grid) == ("attention_bwd_dq_sm90", 4, (2, 4, 2))
        attention_backward(q, k, v, q, q, lse, causal=causal, target="sm_80")
        (_, _, _), (dkdv, dkdv_grid, _), (dq, dq_grid, _) = launches[-3:]
        assert (dkdv.kernel, dkdv.constants["COLS"], dkdv_grid) == ("attention_bwd_dkdv", 128, (2 * 2, 4, 2))
        assert (dq.kernel, dq.constants["COLS"], dq_grid) == ("attention_bwd_dq", 128, (2 * 2, 4, 2))
    for _ in range(2):  # a few queries: the decoding kernels (Hopper's configuration), then from the common call
        attention(cuda(1, 4, 1, 256), cuda(1, 4, 100, 256), cuda(1, 4, 100, 256), target="sm_90a")
        assert launches[-1][0].kernel == "attention_decode_cluster"  # 2 steps of 64 keys: one part, one launch
        assert launches[-1][0].constants["KEYS"] == 16 and launches[-1][0].constants["CLUSTER"] == 1
    with pytest.raises(ValueError, match="sequence lengths must be multiples of 64"):  # none on the sm_80 path
        attention(cuda(1, 4, 1, 256), cuda(1, 4, 100, 256), cuda(1, 4, 100, 256), target="sm_80")
    attention(q, k, v, causal=True, target="sm_80")
    launch = launches[-1][0]
    assert launch.kernel == "attention_fwd" and launch.target == "sm_80"
    assert (launch.constants["ROWS"], launch.constants["KEYS"], launch.constants["Q_IN_SHARED"]) == (16, 32, 1)
    assert launch.constants["STAGES"] == 3 and launch.shared_bytes > 101376  # more than a 99 KB card has


def test_attention_head_dim_256_on_a_card_of_99_kb(monkeypatch) -> None:
    """D = 256 on an sm_86 / sm_89 card (99 KB of shared memory a block): attention() and attention_backward() take
    the sm_80 kernels with two stages instead of three, and each kernel fits the card's shared memory."""
    torch = pytest.importorskip("torch")
    from tkc.kernels import _checks, attention, attention_backward

    _, cuda, launches = _fake_gpu_for_attention(monkeypatch)
    monkeypatch.setitem(_checks._HOPPER, 0, False)
    monkeypatch.setitem(_checks.SHARED_MEMORY_LIMITS, 0, 101376)
    q, k, v = cuda(1, 2, 128, 256), cuda(1, 2, 128, 256), cuda(1, 2, 128, 256)
    out = attention(q, k, v, causal=True)
    attention_backward(q, k, v, out, q, cuda(1, 2, 128, dtype=torch.float32), causal=True)
    fwd, delta, dkdv, dq = (launch[0] for launch in launches[-4:])
    assert [fwd.kernel, dkdv.kernel, dq.kernel] == ["attention_fwd", "attention_bwd_dkdv", "attention_bwd_dq"]
    assert fwd.constants["STAGES"] == dkdv.constants["STAGES"] == 2
    assert all(launch.shared_bytes <= 101376 for launch in (fwd, delta, dkdv, dq))


def test_grouped_query_attention_launches(monkeypatch) -> None:
    """K and V of fewer heads than q: attention() launches its kernel with GROUP = H / H_kv over q's heads (the
    common call from a plan of its own, not multi-head attention's), attention_backward() dK and dV a block per K/V
    head's keys (with K and V in shared memory on the mma.sync path; a grid short of the multiprocessors splits the
    query heads into parts, then sums their partial dK and dV; on the wgmma path D = 64's at three blocks a
    multiprocessor); heads that do not divide are one error."""
    torch = pytest.importorskip("torch")
    from tkc.kernels import attention, attention_backward

    _, cuda, launches = _fake_gpu_for_attention(monkeypatch)
    q, k, v = cuda(2, 8, 128, 64), cuda(2, 2, 192, 64), cuda(2, 2, 192, 64)
    for _ in range(2):  # the checked call, then the common call
        attention(q, k, v, target="sm_90a")
    assert launches[0][0].constants["GROUP"] == 4 and launches[1][0] is launches[0][0]
    attention(q, *(cuda(2, 8, 192, 64) for _ in range(2)), target="sm_90a")
    assert launches[2][0].constants["GROUP"] == 1
    out = attention(q, k, v, causal=False, target="sm_80")
    (fwd,) = launches[3:]
    assert fwd[0].constants["GROUP"] == 4 and fwd[1] == (1, 8, 2)  # a block per 128 queries of each query head
    attention_backward(q, k, v, out, cuda(2, 8, 128, 64), cuda(2, 8, 128, dtype=torch.float32), target="sm_80")
    delta, dkdv, dk_sum, dv_sum, dq = launches[4:]
    # 3 key blocks × 2 K/V heads × 2: 12 blocks for 132 multiprocessors, so each K/V head's 4 query heads split
    # into 4 parts (a block each), whose partial dK and dV are then summed (rows = 2·2·192 = 768: 12 blocks)
    assert (delta[1], dkdv[1], dk_sum[1], dv_sum[1], dq[1]) == ((2, 8, 2), (3, 8, 2), (12, 1, 1), (12, 1, 1),
                                                                 (2, 8, 2))
    assert dkdv[0].constants["GROUP"] == dq[0].constants["GROUP"] == 4 and dkdv[0].constants["KV_IN_SHARED"] == 1
    assert dkdv[0].constants["SPLIT"] == 4 and dk_sum[0].kernel == "attention_bwd_sum_parts"
    # the wgmma path: D = 64's dK/dV kernel at three blocks a multiprocessor (CONFIG_SM90)
    qk = cuda(2, 8, 192, 64)
    attention_backward(qk, k, v, qk, qk, cuda(2, 8, 192, dtype=torch.float32), causal=True, target="sm_90a")
    dkdv = next(launch for launch in launches[9:] if launch[0].kernel == "attention_bwd_dkdv_sm90")
    assert dkdv[0].constants["BLOCKS"] == 3 and dkdv[0].constants["GROUP"] == 4 and dkdv[0].target == "sm_90a"
    for heads in (3, 0):
        with pytest.raises(ValueError, match=r"k: expected shape \(2, H_kv, Nk, 64\) with H_kv dividing q's 8 heads"):
            attention(q, cuda(2, heads, 192, 64), cuda(2, heads, 192, 64), target="sm_90a")
    with pytest.raises(ValueError, match="v: expected the shape of k"):
        attention(q, k, cuda(2, 4, 192, 64), target="sm_90a")


@pytest.mark.parametrize("d", [64, 128, 256])
def test_decoding_after_a_prefill_takes_the_decoding_kernels(monkeypatch, d: int) -> None:
    """A prefill (many queries) and then decoding steps (one query a head) at one head dim: attention_sm90's plan
    from the prefill (its key holds no lengths) does not serve the steps; they launch the decoding kernel (here
    attention_decode_cluster), the first from the checked call, the next from the common call."""
    from tkc.kernels import _checks, attention

    attention_module, cuda, launches = _fake_gpu_for_attention(monkeypatch)
    monkeypatch.setitem(_checks._HOPPER, 0, True)
    monkeypatch.setattr(attention_module, "_DECODING", set())
    k, v = cuda(1, 2, 300, d), cuda(1, 2, 300, d)
    attention(cuda(1, 8, 300, d), k, v, target="sm_90a")
    attention(cuda(1, 8, 300, d), k, v, target="sm_90a")  # the common call, from the plan
    assert [launch[0].kernel for launch in launches] == ["attention_sm90"] * 2
    for _ in range(2):
        attention(cuda(1, 8, 1, d), k, v, target="sm_90a")
    assert [launch[0].kernel for launch in launches[2:]] == ["attention_decode_cluster"] * 2


def test_attention_kvcache_launches(monkeypatch) -> None:
    """attention_kvcache: the decoding kernels built with LENGTHS, cache_seqlens their Lengths argument (after k and
    v), on Hopper in clusters and on the sm_80 path the two kernels; what it cannot take refused, naming the
    argument."""
    torch = pytest.importorskip("torch")
    from tkc.errors import TkcError
    from tkc.kernels import attention as tkc_attention
    from tkc.kernels import attention_kvcache

    _, cuda, launches = _fake_gpu_for_attention(monkeypatch)
    monkeypatch.setattr(importlib.import_module("tkc.kernels.attention_decode"), "DECODE_LAST_BLOCK_SM80", False)
    monkeypatch.setitem(importlib.import_module("tkc.kernels._checks")._HOPPER, 0, True)
    q, k, v = cuda(2, 8, 1, 128), cuda(2, 2, 3000, 128), cuda(2, 2, 3000, 128)
    seqlens = cuda(2, dtype=torch.int32)
    out, lse = attention_kvcache(q, k, v, seqlens, return_lse=True, target="sm_90a")
    assert out.shape == q.shape and lse.shape == (2, 8, 1)
    (clustered, grid, _), = launches
    assert (clustered.kernel, grid, clustered.constants["LENGTHS"]) == ("attention_decode_cluster", (6, 2, 2), 1)
    attention_kvcache(q, k, v, seqlens, target="sm_80")
    assert [(launch[0].kernel, launch[0].constants.get("LENGTHS")) for launch in launches[1:]] == [
        ("attention_decode", 1), ("attention_decode_combine", None)]
    tkc_attention(q, k, v, target="sm_90a")  # attention()'s decoding: all the keys, LENGTHS off
    assert launches[-1][0].constants["LENGTHS"] == 0
    # clusters the GPU does not hold all at once (24 blocks in clusters of 4, 20 held): fewer parts in clusters of 3,
    # or with FEWER_PARTS_WITH_LENGTHS off the two kernels over the wave's split
    decode_module = importlib.import_module("tkc.kernels.attention_decode")
    monkeypatch.setattr(importlib.import_module("tkc.runtime.launch"), "resident_blocks_on",
                        lambda loaded, sms: 20 if loaded.cluster > 1 else sms)
    q3, k3, seqlens3 = cuda(3, 8, 1, 128), cuda(3, 2, 2000, 128), cuda(3, dtype=torch.int32)
    del launches[:]
    attention_kvcache(q3, k3, k3, seqlens3, target="sm_90a")
    monkeypatch.setattr(decode_module, "FEWER_PARTS_WITH_LENGTHS", False)
    attention_kvcache(q3, k3, k3, seqlens3, target="sm_90a")
    assert [(launch[0].kernel, launch[1]) for launch in launches] == [
        ("attention_decode_cluster", (3, 2, 3)), ("attention_decode", (4, 2, 3)),
        ("attention_decode_combine", (2, 4, 1))]
    for call, message in [
        (lambda: attention_kvcache(q, k, v, cuda(2)), "cache_seqlens must be torch.int32"),
        (lambda: attention_kvcache(q, k, v, cuda(3, dtype=torch.int32)), r"cache_seqlens: one length a batch"),
        (lambda: attention_kvcache(q, k[:1], v[:1], seqlens), "k_cache: expected shape"),
        (lambda: attention_kvcache(cuda(2, 8, 17, 128), k, v, seqlens), "at most 64 query rows a K/V head"),
        (lambda: attention_kvcache(cuda(2, 8, 2, 128)[:, :, :1], k, v, seqlens), "q: must be contiguous"),
        (lambda: attention_kvcache(cuda(2, 8, 1, 96), cuda(2, 2, 30, 96), cuda(2, 2, 30, 96), seqlens),
         "takes head dims 64, 128, 256 here, got 96"),
        (lambda: attention_kvcache(q, cuda(2, 2, 0, 128), cuda(2, 2, 0, 128), seqlens), "at least one key"),
        (lambda: attention_kvcache(q.clone().requires_grad_(), k, v, seqlens), "has no backward"),
    ]:
        with pytest.raises(TkcError, match=message):
            call()


def _fake_workspaces(monkeypatch) -> None:
    """The decoding kernels' workspaces (stream_scratch, arrival_counters) on the fake GPU too, so that a common call's
    launch reader takes them."""
    checks, decode_module = (importlib.import_module(f"tkc.kernels.{name}") for name in ("_checks", "attention_decode"))
    for name in ("stream_scratch", "arrival_counters"):
        made = getattr(checks, name)
        monkeypatch.setattr(decode_module, name, lambda torch, like, *a, made=made: made(torch, like, *a).as_subclass(
            type(like)))


def test_attention_kvcache_paged_launches(monkeypatch) -> None:
    """attention_kvcache with block_table: the decoding kernels built with LENGTHS and PAGED, the page table their
    Pages argument (after the lengths), the split sized by the pages a batch times the page size (as a contiguous
    cache of that N_max), on Hopper in clusters and on the sm_80 path the two kernels; the common call after the
    checked one launches the same; what it cannot take refused, naming the argument."""
    torch = pytest.importorskip("torch")
    from tkc.errors import TkcError
    from tkc.kernels import attention_kvcache

    attention_module, cuda, launches = _fake_gpu_for_attention(monkeypatch)
    _fake_workspaces(monkeypatch)
    monkeypatch.setattr(importlib.import_module("tkc.kernels.attention_decode"), "DECODE_LAST_BLOCK_SM80", False)
    monkeypatch.setitem(importlib.import_module("tkc.kernels._checks")._HOPPER, 0, True)
    q, k_pages = cuda(2, 8, 1, 128), cuda(30, 2, 256, 128)
    seqlens, table = cuda(2, dtype=torch.int32), cuda(2, 12, dtype=torch.int32)  # 12 pages of 256: N_max 3072
    out, lse = attention_kvcache(q, k_pages, k_pages, seqlens, block_table=table, return_lse=True, target="sm_90a")
    assert out.shape == q.shape and lse.shape == (2, 8, 1)
    contiguous = [(launch[0].kernel, launch[1]) for launch in launches]
    assert [launch[0].constants["PAGED"] for launch in launches] == [1] * len(launches)
    del launches[:]
    attention_kvcache(q, cuda(2, 2, 3072, 128), cuda(2, 2, 3072, 128), seqlens, return_lse=True, target="sm_90a")
    assert [(launch[0].kernel, launch[1]) for launch in launches] == contiguous  # the split of N_max = 3072
    assert launches[0][0].constants["PAGED"] == 0
    del launches[:]
    attention_kvcache(q, k_pages, k_pages, seqlens, block_table=table, target="sm_80")
    assert [(launch[0].kernel, launch[0].constants.get("PAGED")) for launch in launches] == [
        ("attention_decode", 1), ("attention_decode_combine", None)]
    full_checks = []
    real_check = attention_module._check_paged_cache
    monkeypatch.setattr(attention_module, "_check_paged_cache", lambda *a: full_checks.append(1) or real_check(*a))
    del launches[:]
    attention_kvcache(q, k_pages, k_pages, seqlens, block_table=table, target="sm_80")  # the common call
    assert [launch[0].kernel for launch in launches] == ["attention_decode", "attention_decode_combine"]
    assert not full_checks
    for call, message in [
        (lambda: attention_kvcache(q, k_pages, k_pages, seqlens, block_table=cuda(2, 12)),
         "block_table must be torch.int32"),
        (lambda: attention_kvcache(q, k_pages, k_pages, seqlens, block_table=cuda(3, 12, dtype=torch.int32)),
         r"block_table: one row of pages a batch, expected shape \(2, pages a batch ≥ 1\)"),
        (lambda: attention_kvcache(q, cuda(30, 2, 96, 128), cuda(30, 2, 96, 128), seqlens, block_table=table,
                                   target="sm_90a"), "pages of 96 keys, .* a multiple of 128 here"),
        (lambda: attention_kvcache(q, cuda(30, 3, 256, 128), cuda(30, 3, 256, 128), seqlens, block_table=table),
         r"k_cache: with block_table, expected shape \(pages, H_kv, page size, 128\)"),
        (lambda: attention_kvcache(q, k_pages, cuda(29, 2, 256, 128), seqlens, block_table=table),
         "v_cache: expected the shape of k_cache"),
    ]:
        with pytest.raises(TkcError, match=message):
            call()


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_attention_kvcache_common_call_launches_what_the_checked_call_did(monkeypatch, target) -> None:
    """attention_kvcache's common call (after a checked call on the device and target; no out= or return_lse) skips
    the full checks and launches the kernels and grids of the checked call; what the launch's reader
    refuses (cache_seqlens of another dtype), or what the common call does not take (q not contiguous, inputs
    requiring grad, out=), gets the checked call's named error or path."""
    torch = pytest.importorskip("torch")
    from tkc.errors import TkcError
    from tkc.kernels import attention_kvcache

    attention_module, cuda, launches = _fake_gpu_for_attention(monkeypatch)
    _fake_workspaces(monkeypatch)
    monkeypatch.setitem(importlib.import_module("tkc.kernels._checks")._HOPPER, 0, True)
    q, k, v = cuda(2, 8, 1, 128), cuda(2, 2, 3000, 128), cuda(2, 2, 3000, 128)
    seqlens = cuda(2, dtype=torch.int32)
    attention_kvcache(q, k, v, seqlens, target=target)
    checked = [(launch[0].kernel, launch[1]) for launch in launches]
    full_checks = []
    real_check = attention_module.check_qkv
    monkeypatch.setattr(attention_module, "check_qkv", lambda *a: full_checks.append(1) or real_check(*a))
    del launches[:]
    out = attention_kvcache(q, k, v, seqlens, target=target)
    assert out.shape == q.shape and not full_checks
    assert [(launch[0].kernel, launch[1]) for launch in launches] == checked
    with pytest.raises(TkcError, match="cache_seqlens must be torch.int32"):
        attention_kvcache(q, k, v, cuda(2), target=target)
    with pytest.raises(TkcError, match="q: must be contiguous"):
        attention_kvcache(cuda(2, 8, 2, 128)[:, :, :1], k, v, seqlens, target=target)
    assert len(full_checks) == 2
    with pytest.raises(TkcError, match="has no backward"):
        attention_kvcache(q.clone().requires_grad_(), k, v, seqlens, target=target)
    with pytest.raises(TkcError, match="k_cache must have 4 dimensions"):
        attention_kvcache(q, cuda(7, dtype=torch.bfloat16), v, seqlens, target=target)


def test_decode_attention_launches(monkeypatch) -> None:
    """A few queries a head (GROUP·Nq ≤ MAX_ROWS, not causal): attention() on the sm_80 path, where attention_fwd
    refuses the lengths, and on Hopper with DECODE_ON_HOPPER, launches attention_decode over q viewed (B, H_kv,
    GROUP·Nq, D), its keys split into parts (CONFIG's blocks a multiprocessor, ≥ MIN_STEPS steps a part, none
    empty), then attention_decode_combine over the flat rows; on Hopper, parts few enough for a cluster that the GPU
    holds with all the others, attention_decode_cluster alone; causal, or a non-contiguous q, keeps the other kernels."""
    torch = pytest.importorskip("torch")
    from tkc.kernels import attention
    from tkc.kernels.attention_decode import decode_parts
    from tkc.runtime import launch as launch_module

    attention_module, cuda, launches = _fake_gpu_for_attention(monkeypatch)
    # the two kernels (the sm_80 path's one launch eagerly: test_decode_attention_last_block_launches)
    monkeypatch.setattr(importlib.import_module("tkc.kernels.attention_decode"), "DECODE_LAST_BLOCK_SM80", False)
    q, k, v = cuda(2, 8, 1, 128), cuda(2, 2, 3000, 128), cuda(2, 2, 3000, 128)
    out, lse = attention(q, k, v, target="sm_80", return_lse=True)
    decode, combine = launches
    assert decode[0].kernel == "attention_decode" and combine[0].kernel == "attention_decode_combine"
    # 2·2 K/V heads of one 16-row tile (4 rows used); 3000 keys = 47 steps of 64 (CONFIG_SM80): 264 / 4 blocks
    # wanted, at most 47 // 4 = 11 parts: 5 steps a part, which takes 10 (the last of 2 steps)
    assert decode_parts(4, 47, 264) == (10, 5) and decode[1] == (10, 2, 2) and decode[0].constants["KEYS"] == 16
    assert combine[1] == (1, 4, 1) and combine[0].constants["LSE"] == 1  # 16 rows, 4 × 32 columns
    assert out.shape == q.shape
    assert lse.shape == (2, 8, 1) and decode[0].constants["D"] == 128
    assert decode_parts(300, 1, 132) == (1, 1) and decode_parts(1, 10**4, 264) == (264, 38)
    assert decode_parts(8, 1024, 132) == (16, 64)  # one wave: 128 blocks for 132 multiprocessors, not 136
    monkeypatch.setattr(attention_module, "DECODE_ON_HOPPER", False)
    attention(q, k, v, target="sm_90a")
    assert launches[2][0].kernel == "attention_sm90"
    monkeypatch.setattr(attention_module, "DECODE_ON_HOPPER", True)
    monkeypatch.setattr(attention_module, "_PLANS", {})  # (the common call's plans are made under the flag)
    monkeypatch.setattr(attention_module, "_DECODING", set())
    attention(q, k, v, target="sm_90a")
    # CONFIG: 24 steps of 128 keys in 6 parts, a cluster of 6 blocks a K/V head: one launch
    (clustered,) = launches[3:]
    assert clustered[0].kernel == "attention_decode_cluster" and clustered[1] == (6, 2, 2)
    assert clustered[0].cluster == 6 and clustered[0].constants["KEYS"] == 32
    checked, check_tensor = [], attention_module.check_tensor  # the common call: no checks but the launch's
    monkeypatch.setattr(attention_module, "check_tensor", lambda *args: checked.append(args[0]))
    attention(q, k, v, target="sm_90a")
    assert not checked and [launch[:2] for launch in launches[4:]] == [clustered[:2]]
    monkeypatch.setattr(attention_module, "check_tensor", check_tensor)
    del launches[4:]
    attention(q, k, v, target="sm_90a", causal=True)
    attention(cuda(2, 1, 8, 128).transpose(1, 2), k, v, target="sm_90a")  # (B, H, 1, D) from (B, 1, H, D): contiguous
    attention(cuda(2, 8, 2, 128)[:, :, :1], k, v, target="sm_90a")  # every other row: not contiguous
    assert [launch[0].kernel for launch in launches[4:]] == ["attention_sm90", "attention_decode_cluster",
                                                              "attention_sm90"]
    del launches[4:]
    # B = 1, 8 K/V heads, 8192 keys: 64 steps in 16 parts, clusters of 16 (a GPU holding 132 blocks: all 8); with
    # CLUSTER_PARTS = 12, 11 parts of 6 steps
    decode_module = importlib.import_module("tkc.kernels.attention_decode")
    q1, k1 = cuda(1, 32, 1, 128), cuda(1, 8, 8192, 128)
    attention(q1, k1, k1, target="sm_90a")
    monkeypatch.setattr(decode_module, "CLUSTER_PARTS", 12)
    monkeypatch.setattr(decode_module, "_PLANS", {})
    attention(q1, k1, k1, target="sm_90a")
    assert [(launch[0].kernel, launch[1], launch[0].cluster) for launch in launches[4:]] == [
        ("attention_decode_cluster", (16, 8, 1), 16), ("attention_decode_cluster", (11, 8, 1), 11)]
    monkeypatch.setattr(decode_module, "CLUSTER_PARTS", 0)
    del launches[4:]
    # more parts than a cluster holds (one K/V head, 313 steps: 63 parts of 5): the two kernels; clusters the GPU
    # does not hold all at once (24 blocks in clusters of 4, 20 held): fewer parts, 3 of 6 steps in 18 blocks, in
    # clusters of 3, but in a CUDA graph capture the two kernels
    attention(cuda(1, 8, 1, 128), cuda(1, 1, 40000, 128), cuda(1, 1, 40000, 128), target="sm_90a")
    monkeypatch.setattr(launch_module, "resident_blocks_on", lambda loaded, sms: 20 if loaded.cluster > 1 else sms)
    q3, k3 = cuda(3, 8, 1, 128), cuda(3, 2, 2000, 128)
    attention(q3, k3, k3, target="sm_90a")
    attention(q3, k3, k3, target="sm_90a")  # the common call
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    attention(q3, k3, k3, target="sm_90a")
    assert [(launch[0].kernel, launch[1], launch[0].cluster) for launch in launches[4:]] == [
        ("attention_decode", (63, 1, 1), 1), ("attention_decode_combine", (1, 4, 1), 1),
        ("attention_decode_cluster", (3, 2, 3), 3), ("attention_decode_cluster", (3, 2, 3), 3),
        ("attention_decode", (4, 2, 3), 1), ("attention_decode_combine", (2, 4, 1), 1)]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    with pytest.raises(ValueError, match="multiples of 64"):
        attention(q, k, v, target="sm_80", causal=True)


@pytest.mark.parametrize("setting", ["shipped", "eager", True])
def test_decode_attention_last_block_launches(setting, monkeypatch) -> None:
    """DECODE_LAST_BLOCK (Hopper) and DECODE_LAST_BLOCK_SM80: outside CUDA graph captures decoding launches
    attention_decode_last on the wave's split (one launch; the counters made once per device and stream, one a row
    tile), unless the wave's clusters are all held; in a capture the two kernels ("eager") or the one launch (True);
    "eager" only up to LAST_BLOCK_BYTES of K and V. As shipped: "eager" on the sm_80 path (Hopper's clusters are
    held here)."""

    import torch

    from tkc.kernels import attention

    decode_module = importlib.import_module("tkc.kernels.attention_decode")
    checks_module = importlib.import_module("tkc.kernels._checks")
    attention_module, cuda, launches = _fake_gpu_for_attention(monkeypatch)
    if setting != "shipped":
        monkeypatch.setattr(decode_module, "DECODE_LAST_BLOCK", setting)
        monkeypatch.setattr(decode_module, "DECODE_LAST_BLOCK_SM80", setting)
    monkeypatch.setattr(checks_module, "ARRIVAL_COUNTERS", {})
    q, k = cuda(2, 8, 1, 128), cuda(2, 2, 3000, 128)
    attention(q, k, k, target="sm_80")                        # 10 parts of 5 steps (CONFIG_SM80), 4 row tiles
    attention(cuda(1, 32, 1, 128), cuda(1, 8, 8192, 128), cuda(1, 8, 8192, 128), target="sm_90a")  # 16 parts
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    attention(q, k, k, target="sm_80")
    assert [(launch[0].kernel, launch[1]) for launch in launches] == [
        ("attention_decode_last", (10, 2, 2)), ("attention_decode_cluster", (16, 8, 1))] + (
        [("attention_decode_last", (10, 2, 2))] if setting is True else
        [("attention_decode", (10, 2, 2)), ("attention_decode_combine", (1, 4, 1))])
    (counters,) = checks_module.ARRIVAL_COUNTERS.values()
    assert list(checks_module.ARRIVAL_COUNTERS) == [(0, 0)] and counters.dtype == torch.int32 and not counters.any()
    # "eager" keeps the two kernels for K and V of more than LAST_BLOCK_BYTES (here 6 MB against 1 MB); True does not
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(decode_module, "LAST_BLOCK_BYTES", 1 << 20)
    monkeypatch.setattr(decode_module, "_PLANS", {})
    del launches[:]
    attention(q, k, k, target="sm_80")
    assert [launch[0].kernel for launch in launches] == (
        ["attention_decode_last"] if setting is True else ["attention_decode", "attention_decode_combine"])


def test_layernorm_backward_launches(monkeypatch) -> None:
    """layernorm_backward(): layernorm_bwd_kernel on the blocks the GPU holds at once (fewer where the rows run
    out) in backward_layout(D) (a row a warp up to 1024 columns, wider rows over a block's warps), then
    column_sums_kernel over the blocks' partial sums, dweight's and dbias's columns side by side (RMSNorm:
    dweight's alone), in one launch; the new residual's gradient read only when given (DS_IN)."""
    pytest.importorskip("torch")
    from tkc.kernels import layernorm_bwd
    from tkc.diagnostics import TkcWarning
    from tkc.kernels.layernorm_bwd import backward_layout, layernorm_backward
    from tkc.runtime import launch

    cuda, launches = _fake_gpu(monkeypatch)
    monkeypatch.setattr(launch, "resident_blocks_on", lambda loaded, sms: 2 * sms)
    monkeypatch.setattr(layernorm_bwd, "_PLANS", {})
    s, dy, w = cuda(3000, 4096), cuda(3000, 4096), cuda(4096)
    ds, dw, db = layernorm_backward(s, dy, dy, w, 1e-5)
    bwd, sums = launches
    assert bwd[0].kernel == "layernorm_bwd_kernel" and bwd[1] == (2 * 132, 1, 1)
    assert (bwd[0].constants["WARPS"], bwd[0].constants["SPLIT"]) == backward_layout(4096) == (4, 4)
    assert bwd[0].constants["DS_IN"] == 1
    # the 264 blocks' partial rows of 2 · 4096 columns (dweight's, then dbias's), 32 columns a block
    assert sums[0].kernel == "column_sums_kernel" and sums[1] == (256, 1, 1)
    assert ds.shape == s.shape and dw.shape == db.shape == w.shape
    # block_parts's 2-way conflicting store is known and filtered: compiling the backward warns the user of nothing
    with warnings.catch_warnings(record=True) as caught:
        ds, dw, db = layernorm_backward(cuda(50, 768), cuda(50, 768), None, cuda(768), 1e-6, rms=True)
    assert not [w for w in caught if issubclass(w.category, TkcWarning)]
    bwd, sums = launches[2:]
    assert (bwd[0].constants["WARPS"], bwd[0].constants["SPLIT"]) == backward_layout(768) == (8, 1)
    assert bwd[1] == (7, 1, 1)  # a row a warp: 50 rows for 7 blocks of 8 warps
    assert bwd[0].constants["RMS"] == 1 and bwd[0].constants["DS_IN"] == 0 and db is None
    assert sums[1] == (24, 1, 1) and dw.shape == (768,)


def test_norms_without_a_residual_and_rms(monkeypatch) -> None:
    """layernorm() without a residual and rmsnorm() launch layernorm_kernel with RESIDUAL=0 / RMS=1 (x, weight and
    out in the places of what the kernel does not touch) and return x as the new residual; the checked call (3-D)
    and the common call (2-D) alike; a residual_out without a residual is an error naming it."""
    torch = pytest.importorskip("torch")
    from tkc.kernels import layernorm, rmsnorm

    cuda, launches = _fake_gpu(monkeypatch)
    x, r, w, b = cuda(2, 8, 64), cuda(2, 8, 64), cuda(64), cuda(64)
    for rows in (x, x.view(16, 64)):
        y, s = layernorm(rows, None, w, b)
        assert s is rows and y.shape == rows.shape
        y, s = rmsnorm(rows, None, w)
        assert s is rows
        y, s = rmsnorm(rows, r.view(rows.shape), w, eps=1e-6)
        assert s is not rows and s.shape == rows.shape
    constants = [(c.get("RESIDUAL", 1), c.get("RMS", 0)) for c in (loaded.constants for loaded, _, _ in launches)]
    assert constants == [(0, 0), (0, 1), (1, 1)] * 2
    with pytest.raises(ValueError, match="residual_out: given without a residual"):
        layernorm(x, None, w, b, residual_out=torch.empty_like(x))
    with pytest.raises(ValueError, match=r"bias: expected shape \(64,\)"):
        layernorm(x, r, w, cuda(32))


def test_rotary_launches(monkeypatch) -> None:
    """rotary() launches rotary_kernel on (position tiles, B, head pairs; single heads where R < D), R from cos's
    width, any strides of x (a (B, N, H, D) tensor seen transposed), (H, N, D) as one batch, cos in f32, bf16 or
    f16; in place the unrotated columns are not copied; each bad argument is one error naming it."""
    torch = pytest.importorskip("torch")
    import importlib

    from tkc.kernels import rotary

    module = importlib.import_module("tkc.kernels.rotary")
    monkeypatch.setattr(module, "_SPECIALIZED", {})
    cuda, launches = _fake_gpu(monkeypatch)
    x = cuda(2, 100, 6, 128).transpose(1, 2)
    cos, sin = cuda(300, 32, dtype=torch.float32), cuda(300, 32, dtype=torch.float32)
    out = rotary(x, cos, sin, offset=200, target="sm_80")
    assert out.shape == x.shape and out.stride() == x.stride()  # empty_like: x's own layout
    loaded, grid, _ = launches[-1]
    assert grid == (-(-100 // 64), 2, 6) and (loaded.constants["R"], loaded.constants["D"]) == (64, 128)
    assert loaded.constants["COPY_REST"] == 1 and loaded.constants["CONJUGATE"] == 0
    rotary(x, cos, sin, out=x, conjugate=True, target="sm_80")
    assert launches[-1][0].constants["COPY_REST"] == 0 and launches[-1][0].constants["CONJUGATE"] == 1
    rotary(x, cos, sin, interleaved=True, target="sm_80")
    assert launches[-1][0].constants["INTERLEAVED"] == 1 and launches[-1][0].constants["CONJUGATE"] == 0
    rotary(cuda(6, 100, 64), cuda(100, 32), cuda(100, 32), target="sm_80")
    assert launches[-1][1] == (2, 1, 3) and str(launches[-1][0].constants["CT"]) == "bf16"
    bad = [((cuda(6, 100, 128), cos[:, :8], sin[:, :8]), {}, "R = 16 rotated columns, which must be a multiple of 32"),
           ((cuda(6, 100, 32), cos, sin), {}, r"at most x's last dimension \(32\)"),
           ((x, cos, sin), {"offset": 250}, "300 positions; x's 100 from offset 250 need 350"),
           ((x, cos, sin), {"offset": -1}, "offset must be a non-negative int"),
           ((x, cos, sin[:, :16]), {}, "sin must match cos"),
           ((x, cos.double(), sin.double()), {}, "cos must be torch.float32, torch.bfloat16 or torch.float16"),
           ((x, cos, torch.ones(300, 32)), {}, "sin is on cpu"),
           ((x[0, 0], cos, sin), {}, r"x must be a tensor of shape \(B, H, N, D\) or \(H, N, D\)"),
           ((x.float(), cos, sin), {}, "x must be torch.bfloat16"),
           ((x, cos, sin), {"out": cuda(2, 6, 100, 64)}, r"out: expected shape \(2, 6, 100, 128\)")]
    for args, options, message in bad:
        with pytest.raises(ValueError, match=message):
            rotary(*args, **options)
    # the common call (4-D x, no out=) checks only shapes and launches what the checked call (3-D x) launches
    checked, check_tensor = [], module.check_tensor
    monkeypatch.setattr(module, "check_tensor", lambda *args: checked.append(args[0]) or check_tensor(*args))
    x3, cos3, sin3 = cuda(6, 100, 128), cuda(120, 64), cuda(120, 64)
    before = len(launches)
    rotary(x3, cos3, sin3, offset=20, target="sm_80")
    rotary(x3[None], cos3, sin3, offset=20, target="sm_80")
    assert checked == ["x", "cos", "sin"] and len(launches) == before + 2 and launches[-1][:2] == launches[-2][:2]


def test_rotary_positions_launches(monkeypatch) -> None:
    """rotary(..., positions=p): p (N,) goes in as it is (the common call), p (B, N) as a flat view with its batch
    stride (its rows may lie apart), int32 or int64 (the kernel's PT); x's rows need not fit the tables (the
    positions say which rows they take); each bad positions is one error naming it."""
    torch = pytest.importorskip("torch")
    import importlib

    from tkc.kernels import rotary, rotary_qk

    module = importlib.import_module("tkc.kernels.rotary")
    monkeypatch.setattr(module, "_SPECIALIZED", {})
    cuda, launches = _fake_gpu(monkeypatch)
    x, cos, sin = cuda(2, 6, 100, 128), cuda(50, 64, dtype=torch.float32), cuda(50, 64, dtype=torch.float32)
    rotary(x, cos, sin, positions=cuda(100, dtype=torch.int64), target="sm_80")
    loaded, grid, _ = launches[-1]
    assert loaded.constants["POSITIONS"] == 1 and str(loaded.constants["PT"]) == "i64" and grid == (2, 2, 3)
    wide = cuda(2, 128, dtype=torch.int32)
    rotary(x, cos, sin, positions=wide[:, :100], target="sm_80")
    assert str(launches[-1][0].constants["PT"]) == "i32"
    rotary(x[:, :, :40], cos, sin, offset=7, target="sm_80")
    assert launches[-1][0].constants["POSITIONS"] == 0
    assert len(rotary_qk(x, x[:, :2], cos, sin, positions=cuda(2, 100, dtype=torch.int64), target="sm_80")) == 2
    assert launches[-1][0].constants["PAIR"] == 1 and launches[-1][0].constants["POSITIONS"] == 1
    p = cuda(100, dtype=torch.int64)
    bad = [({"positions": cuda(100, dtype=torch.float32)}, "positions must be a torch.int32 or torch.int64 tensor"),
           ({"positions": cuda(99, dtype=torch.int64)}, r"positions: expected shape \(100,\) or \(2, 100\)"),
           ({"positions": cuda(3, 100, dtype=torch.int64)}, r"expected shape \(100,\) or \(2, 100\)"),
           ({"positions": torch.zeros(100, dtype=torch.int64)}, "positions is on cpu"),
           ({"positions": p, "offset": 3}, "offset .3. and positions go apart"),
           ({"positions": cuda(100, 2, dtype=torch.int64).t()}, "positions: its last dimension must be contiguous")]
    for options, message in bad:
        with pytest.raises(ValueError, match=message):
            rotary(x, cos, sin, **options)

def test_rotary_qk_launches_once(monkeypatch) -> None:
    """rotary_qk(q, k, ...) is one launch of rotary_kernel with PAIR=1 over q's head pairs and then k's (k of fewer
    heads); in place it copies no unrotated columns; a k of other positions or dtype is an error naming k."""
    torch = pytest.importorskip("torch")
    import importlib

    from tkc.kernels import rotary_qk

    module = importlib.import_module("tkc.kernels.rotary")
    monkeypatch.setattr(module, "_SPECIALIZED", {})
    cuda, launches = _fake_gpu(monkeypatch)
    q, k = cuda(2, 100, 8, 128).transpose(1, 2), cuda(2, 100, 3, 128).transpose(1, 2)
    cos, sin = cuda(200, 64, dtype=torch.float32), cuda(200, 64, dtype=torch.float32)
    q_out, k_out = rotary_qk(q, k, cos, sin, offset=7, target="sm_80")
    assert len(launches) == 1 and q_out.shape == q.shape and k_out.shape == k.shape
    loaded, grid, _ = launches[0]
    assert grid == (2, 2, 4 + 2) and loaded.constants["PAIR"] == 1
    assert rotary_qk(q, k, cos, sin, inplace=True, interleaved=True, target="sm_80") == (q, k)
    assert launches[-1][0].constants["INTERLEAVED"] == 1 and len(launches) == 2
    for bad_k, message in ((cuda(2, 3, 90, 128), "k: expected q's batch, positions and head dim"),
                           (k.float(), "k must be torch.bfloat16"), (torch.ones(2, 3, 100, 128), "k is on cpu")):
        with pytest.raises(ValueError, match=message):
            rotary_qk(q, bad_k, cos, sin)


def test_entry_points_answer_odd_arguments_with_their_own_errors(monkeypatch) -> None:
    """600 seeded calls of gemm(), attention(), attention_varlen(), layernorm(), rmsnorm() and rotary() with odd arguments (other
    dtypes, CPU tensors, ranks, sizes, strides, non-tensors, empty tensors, out=, targets, scales, eps) on a fake
    GPU: each launches or raises a TkcError (a ValueError / TypeError naming the argument), never another exception."""
    import random

    torch = pytest.importorskip("torch")
    from tkc.kernels import _checks, attention, attention_varlen, gemm, layernorm, rmsnorm, rotary, rotary_qk
    from tkc.runtime import launch

    cuda, _ = _fake_gpu(monkeypatch)
    monkeypatch.setattr(launch, "resident_blocks_on", lambda loaded, sms: sms)
    monkeypatch.setitem(_checks.MULTIPROCESSORS, 0, 132)
    monkeypatch.setitem(_checks._HOPPER, 0, True)
    rng = random.Random(0)

    def odd(*shape: int):
        pick = rng.randrange(10)
        if pick == 0:
            return cuda(*shape, dtype=torch.float32)
        if pick == 1:
            return torch.ones(*shape, dtype=torch.bfloat16)  # on the CPU
        if pick == 2:
            return cuda(*shape[:-1]) if len(shape) > 1 else cuda(3, 3)
        if pick == 3:
            return cuda(*shape, 1)
        if pick == 4:
            return cuda(*[s + rng.choice([-1, 1, 7]) if s > 1 else s for s in shape])
        if pick == 5:
            return cuda(*shape[::-1]).transpose(0, -1) if len(shape) > 1 else cuda(*shape)
        if pick == 6:
            return rng.choice([None, 3, 2.5, "x", [1, 2]])
        if pick == 7:
            return cuda(0, *shape[1:])
        if pick == 8:
            return cuda(*shape)[..., ::2] if shape[-1] > 2 else cuda(*shape)
        return cuda(*shape)

    for _ in range(600):
        which = rng.choice(["gemm", "attention", "varlen", "layernorm", "rotary"])
        try:
            if which == "gemm":
                m, n, k = rng.choice([1, 16, 100]), rng.choice([1, 16, 100]), rng.choice([0, 16, 40])
                trans_b = rng.choice([False, True])
                extra = {"out": odd(m, n)} if rng.random() < 0.3 else {}
                gemm(odd(m, k), odd(n, k) if trans_b else odd(k, n), trans_b=trans_b,
                     target=rng.choice(["sm_80", "sm_90a", "sm_99", None]), **extra)
            elif which == "attention":
                shape = (rng.choice([1, 2]), rng.choice([1, 3]), rng.choice([64, 100]), rng.choice([64, 96]))
                extra = {"scale": rng.choice([0.1, -1.0, 0, float("nan"), "s", 2])} if rng.random() < 0.3 else {}
                attention(odd(*shape), odd(*shape), odd(*shape), causal=rng.choice([False, True]),
                          target=rng.choice(["sm_90a", "sm_80"]), return_lse=rng.random() < 0.2, **extra)
            elif which == "varlen":
                rows, heads, d = rng.choice([0, 50, 300]), rng.choice([1, 4]), rng.choice([64, 96, 32])
                seqs = odd(rng.choice([1, 3])) if rng.random() < 0.3 else cuda(3, dtype=torch.int32)
                extra = {"cu_seqlens_k": odd(3)} if rng.random() < 0.2 else {}
                attention_varlen(odd(rows, heads, d), odd(rows, heads, d), odd(rows, heads, d), seqs,
                                 causal=rng.choice([False, True]), target=rng.choice(["sm_90a", "sm_80", None]),
                                 scale=rng.choice([None, 0.1, -1.0, "s"]), return_lse=rng.random() < 0.2, **extra)
            elif which == "rotary":
                shape = (rng.choice([1, 2]), rng.choice([1, 3]), rng.choice([1, 40]), rng.choice([64, 96]))
                half = rng.choice([16, 32, 8])
                if rng.random() < 0.3:  # q and k in one launch: k of other heads, or odd
                    rotary_qk(odd(*shape), odd(shape[0], rng.choice([1, 2]), *shape[2:]), odd(50, half),
                              odd(50, half), offset=rng.choice([0, 5, -1]), inplace=rng.random() < 0.3)
                rotary(odd(*shape), odd(50, half), odd(50, half), offset=rng.choice([0, 5, 20, -1]),
                       interleaved=rng.random() < 0.3,
                       target=rng.choice([None, "sm_80"]), **({"out": odd(*shape)} if rng.random() < 0.3 else {}))
            else:
                rows, d = rng.choice([1, 7]), rng.choice([16, 40, 64])
                rows_in = (odd(rows, d), odd(rows, d) if rng.random() < 0.8 else None, odd(d))
                options = {"eps": rng.choice([1e-5, 0.0, "e"]), "target": rng.choice([None, "sm_80"])}
                if rng.random() < 0.3:
                    options["residual_out"] = odd(rows, d)
                if rng.random() < 0.5:
                    layernorm(*rows_in, odd(d), **options)
                else:
                    rmsnorm(*rows_in, **options)
        except TkcError:
            pass


def test_attention_varlen_launches_over_the_packed_rows(monkeypatch) -> None:
    """attention_varlen() launches attention_varlen_sm90 on (1, H, total, D) views of the packed tensors with
    cu_seqlens[1:] (its sequences' ends), a block for each query block a sequence can have, times the heads
    (attention_varlen_fwd with target="sm_80"); and refuses what it cannot run, naming the argument."""
    torch = pytest.importorskip("torch")
    from tkc.errors import TkcError
    from tkc.kernels import _checks, attention_varlen

    cuda, launches = _fake_gpu(monkeypatch)
    monkeypatch.setitem(_checks._HOPPER, 0, True)
    monkeypatch.setitem(_checks.SHARED_MEMORY_LIMITS, 0, 227 * 1024)
    q, k = cuda(300, 8, 128), cuda(300, 2, 128)
    cu = cuda(4, dtype=torch.int32)
    out = attention_varlen(q, k, k, cu, causal=True)
    assert out.shape == q.shape
    (loaded, grid, _), = launches
    assert loaded.kernel == "attention_varlen_sm90" and grid == ((-(-300 // 128) + 3) * 8, 1, 1)
    assert loaded.constants["CAUSAL"] == 1 and loaded.constants["GROUP"] == 4 and loaded.constants["LSE"] == 0
    out, lse = attention_varlen(q, k, k, cu, return_lse=True)
    assert lse.shape == (8, 300) and lse.dtype == torch.float32 and launches[-1][0].constants["LSE"] == 1
    del launches[1:]
    for call, message in [
        (lambda: attention_varlen(q, k, k, cuda(4)), "cu_seqlens must be torch.int32"),
        (lambda: attention_varlen(cuda(300, 8, 48), cuda(300, 8, 48), cuda(300, 8, 48), cu),
         "head dim must be 32, 64, 96, 128 or 256"),
        (lambda: attention_varlen(q, cuda(300, 3, 128), cuda(300, 3, 128), cu), "H_kv dividing"),
        (lambda: attention_varlen(q, cuda(200, 2, 128), cuda(200, 2, 128), cu), "give cu_seqlens_k"),
        (lambda: attention_varlen(q, k, k, cu, cu_seqlens_k=cuda(3, dtype=torch.int32)), "cu_seqlens_k: one offset"),
        (lambda: attention_varlen(q, k, k, cu, scale=0.0), "scale: must be a positive"),
        (lambda: attention_varlen(cuda(300, 8, 256)[..., ::2], k, k, cu), "strides"),
    ]:
        with pytest.raises(TkcError, match=message):
            call()
    assert len(launches) == 1
    attention_varlen(cuda(300, 8, 96), cuda(300, 8, 96), cuda(300, 8, 96), cu, target="sm_80")  # attention_fwd's tiles
    loaded, grid, _ = launches[1]
    assert loaded.kernel == "attention_varlen_fwd" and grid == (-(-300 // 128) + 3, 8, 1)
    assert (loaded.constants["ROWS"], loaded.constants["KEYS"], loaded.constants["Q_IN_SHARED"]) == (32, 64, 1)
    big = cuda(300, 2, 256)
    attention_varlen(big, big, big, cu)  # D = 256 on Hopper: the sm_80 build of attention_varlen_fwd
    loaded, grid, _ = launches[2]
    assert (loaded.kernel, loaded.target, grid) == ("attention_varlen_fwd", "sm_80", (-(-300 // 64) + 3, 2, 1))
    with pytest.raises(TkcError, match="target sm_90a's varlen kernel takes head dims 64, 96 and 128, got 32"):
        attention_varlen(cuda(300, 2, 32), cuda(300, 2, 32), cuda(300, 2, 32), cu, target="sm_90a")
    with pytest.raises(TkcError, match="attention_varlen's backward takes head dims 32, 64, 96 and 128, got 256"):
        attention_varlen(big.requires_grad_(), big, big, cu)


def test_attention_varlen_backward_launches_its_three_kernels(monkeypatch) -> None:
    """attention_varlen_backward: Δ on the packed views, then on Hopper the wgmma dK/dV kernel, a block per 128 keys a
    sequence can have times the K/V heads (GROUP), and dQ a block per 128 queries times the heads; with
    target="sm_80" the mma.sync kernels (K and V in shared memory, blocks of 64); then zeros into the rows past the
    last sequence (attention_varlen_zero_tail, once for the three); a wrong lse is refused, naming it."""
    torch = pytest.importorskip("torch")
    from tkc.errors import TkcError
    from tkc.kernels import _checks, attention_varlen_backward

    cuda, launches = _fake_gpu(monkeypatch)
    monkeypatch.setitem(_checks._HOPPER, 0, True)
    q, k = cuda(300, 8, 128), cuda(300, 2, 128)
    cu = cuda(4, dtype=torch.int32)
    lse = cuda(8, 300, dtype=torch.float32)
    # then zeros into dq's, dk's and dv's rows past the last sequence's, one launch
    tails = [("attention_varlen_zero_tail", (5, 8, 1), "sm_80")]
    dq, dk, dv = attention_varlen_backward(q, k, k, q, q, lse, cu, causal=True)
    assert dq.shape == q.shape and dk.shape == dv.shape == k.shape
    assert [(loaded.kernel, grid, loaded.target) for loaded, grid, _ in launches] == [
        ("attention_bwd_delta", (5, 8, 1), "sm_80"), ("attention_varlen_bwd_dkdv_sm90", (3 + 3, 2, 1), "sm_90a"),
        ("attention_varlen_bwd_dq_sm90", (3 + 3, 8, 1), "sm_90a"), *tails]
    assert (launches[1][0].constants["GROUP"], launches[1][0].constants["CAUSAL"]) == (4, 1)
    del launches[:]
    attention_varlen_backward(q, k, k, q, q, lse, cu, causal=True, target="sm_80")
    assert [(loaded.kernel, grid, loaded.target) for loaded, grid, _ in launches] == [
        ("attention_bwd_delta", (5, 8, 1), "sm_80"), ("attention_varlen_bwd_dkdv", (5 + 3, 2, 1), "sm_80"),
        ("attention_varlen_bwd_dq", (5 + 3, 8, 1), "sm_80"), *tails]
    dkdv = launches[1][0].constants
    assert (dkdv["QUERIES"], dkdv["KV_IN_SHARED"], dkdv["GROUP"], dkdv["CAUSAL"]) == (16, 1, 4, 1)
    with pytest.raises(TkcError, match=r"lse: expected shape \(8, 300\) \(H, total\)"):
        attention_varlen_backward(q, k, k, q, q, cuda(300, 8, dtype=torch.float32), cu)


def test_scaled_mm_common_call_launches_what_the_checked_call_did(monkeypatch) -> None:
    """scaled_mm()'s common call (shapes only) launches the kernel and grid of the fully checked first call; other
    kinds of scales or dtypes are plans of their own."""
    import importlib

    torch = pytest.importorskip("torch")
    from tkc.kernels import scaled_mm
    from tkc.runtime import launch

    module = importlib.import_module("tkc.kernels.scaled_mm")
    cuda, launches = _fake_gpu(monkeypatch)
    monkeypatch.setattr(launch, "resident_blocks_on", lambda loaded, sms: sms)
    monkeypatch.setattr(importlib.import_module("tkc.kernels.gemm"), "FEW_ROWS_IN_CLUSTERS", True)
    monkeypatch.setattr(importlib.import_module("tkc.kernels.gemm"), "FEW_ROWS_LAST_BLOCK", False)  # (taken before the clusters)
    monkeypatch.setattr(module, "_PLANS", {})
    monkeypatch.setitem(importlib.import_module("tkc.kernels._checks").MULTIPROCESSORS, 0, 132)
    checked, check_tensor = [], module.check_tensor
    monkeypatch.setattr(module, "check_tensor", lambda *args: checked.append(args[0]) or check_tensor(*args))
    fp8 = torch.float8_e4m3fn
    a, w = cuda(300, 256, dtype=fp8), cuda(520, 256, dtype=fp8)
    rows, cols, one = cuda(300, 1, dtype=torch.float32), cuda(1, 520, dtype=torch.float32), cuda(1, dtype=torch.float32)
    for _ in range(2):
        c = scaled_mm(a, w.t(), rows, cols, target="sm_90a")
        assert c.shape == (300, 520) and c.dtype == torch.bfloat16
    assert checked == ["a", "b"]  # the second call: the plan
    # 9 of CONFIG's tiles would leave most SMs idle: the smallest of the smaller tiles, 64×64 (5 × 9)
    assert module.launch_kind(300, 520, 256, 132, True, True) == ("tiles", 4)
    assert launches[1][0] is launches[0][0] and launches[0][1] == launches[1][1] == (5 * 9, 1, 1)
    scaled_mm(a, w.t(), one, one, target="sm_90a")  # per-tensor scales: another variant
    assert checked == ["a", "b"] * 2 and launches[2][0] is not launches[0][0]
    # 16 rows, a long K: the few-rows kernel over 4 runs of K (512 columns of the weight: 4 blocks of 128), each
    # block column's runs a cluster of 4 that sums them
    x, w = cuda(16, 4096, dtype=fp8), cuda(512, 4096, dtype=fp8)
    for _ in range(2):
        assert scaled_mm(x, w.t(), cuda(16, 1, dtype=torch.float32), cuda(1, 512, dtype=torch.float32),
                         target="sm_90a").shape == (16, 512)
    assert [grid for _, grid, _ in launches[3:]] == [(16, 1, 1)] * 2
    assert checked == ["a", "b"] * 3
    # 24 rows: the kernel for 32 rows, a plan of its own (not the 16-row one above)
    scaled_mm(cuda(24, 4096, dtype=fp8), w.t(), cuda(24, 1, dtype=torch.float32), cuda(1, 512, dtype=torch.float32),
              target="sm_90a")
    assert checked == ["a", "b"] * 4 and launches[5][0] is not launches[3][0]
    # where the GPU would not hold all the clusters at once: the partial sums over (4 blocks, 4 runs), then their
    # scaled sum (one row tile, two column chunks of 256)
    monkeypatch.setattr(module, "_PLANS", {})
    monkeypatch.setattr(launch, "_specialized", {})  # the resident count is asked once per variant
    monkeypatch.setattr(launch, "resident_blocks_on", lambda loaded, sms: 8)
    scaled_mm(x, w.t(), cuda(16, 1, dtype=torch.float32), cuda(1, 512, dtype=torch.float32), target="sm_90a")
    assert [grid for _, grid, _ in launches[6:]] == [(4, 4, 1), (1, 2, 1)]
