"""The runtime on a machine without a GPU: compiling works, launching says clearly why it cannot."""

from __future__ import annotations

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


def test_kernel_entry_points_refuse_cpu_tensors() -> None:
    torch = pytest.importorskip("torch")
    from tkc.kernels import attention, gemm, layernorm

    a = torch.ones(16, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="a is on cpu"):
        gemm(a, a)
    q = torch.ones(1, 1, 64, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="q is on cpu"):
        attention(q, q, q)
    with pytest.raises(ValueError, match="x is on cpu"):
        layernorm(a, a, a[0], a[0])


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
                                           ((1, 70000), "between 1 and 65535")])
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


def test_quick_key_reads_what_the_full_check_reads() -> None:
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
    key = launch._quick_key(layernorm_kernel, args, {"D": 40}, None, None, values)
    assert values == launch._param_values(layernorm_kernel, args)
    assert key[-2] == 0 and key[-1] == tuple(launch.alignment(a) for a in args[:6])
    for bad in ((x,) + args[1:6] + ("1e-5",), args[:6], (x.float(),) + args[1:], (x[None],) + args[1:],
                (torch.empty(6, 40, dtype=torch.bfloat16),) + args[1:], (x.t(),) + args[1:]):
        assert launch._quick_key(layernorm_kernel, bad, {"D": 40}, None, None, []) is None


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
    from types import SimpleNamespace

    from tkc.runtime import driver

    calls: list[str] = []
    fake = SimpleNamespace(
        CUstream=lambda handle: handle, CUlaunchAttribute=SimpleNamespace, CUlaunchConfig=SimpleNamespace,
        CUlaunchAttributeID=SimpleNamespace(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION=6),
        cuLaunchKernel=lambda *args: calls.append("cuLaunchKernel") or (0,),
        cuLaunchKernelEx=lambda *args: calls.append("cuLaunchKernelEx") or (0,))
    fake_attribute = SimpleNamespace(value=SimpleNamespace())
    fake.CUlaunchAttribute = lambda: fake_attribute
    monkeypatch.setattr(driver, "driver", lambda: fake)
    monkeypatch.setattr(driver, "DEPENDENT_LAUNCH", setting)
    kernel = driver.LoadedKernel(None, "f", 64, 0, dependent_launch=waits, prefers_dependent_launch=prefers)
    driver.launch(kernel, (4, 1, 1), 7, 0)
    assert calls == [expected]


def test_dependent_launch_option_must_be_a_bool() -> None:
    import tkc

    with pytest.raises(TkcError, match=r"dependent_launch=\.\.\.\) must be True or False, got 1"):
        @tkc.kernel(dependent_launch=1)
        def k() -> None:
            pass
