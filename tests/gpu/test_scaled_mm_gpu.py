"""scaled_mm (fp8 e4m3 GEMM with scales) on a Hopper GPU against a float64 reference and torch._scaled_mm: fresh
random inputs, outputs poisoned with NaN first, ragged and unaligned shapes, both kinds of scales; its argument
errors. Run with: pytest -m gpu tests/gpu (skipped without a GPU, and on GPUs other than sm_90)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from tkc.kernels import scaled_mm  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or
                                                  torch.cuda.get_device_capability() != (9, 0),
                                                  reason="fp8 wgmma needs an sm_90 GPU")]

SHAPES = [(128, 256, 128), (1000, 1000, 1024), (4096, 4096, 4096), (17, 4096, 4096), (1, 8192, 8192), (130, 70, 96),
          (1, 1, 16),
          (3000, 200, 704), (200, 3000, 80), (2048, 1024, 8192), (64, 8192, 256), (513, 257, 100)]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return math.inf
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def fp8(*shape: int) -> torch.Tensor:
    return (torch.randn(*shape, device="cuda") * 2).to(torch.float8_e4m3fn)


def scales(m: int, n: int, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    shape_a, shape_b = ((m, 1), (1, n)) if rowwise else ((), ())
    return (torch.rand(shape_a, device="cuda") + 0.5, torch.rand(shape_b, device="cuda") + 0.5)


@pytest.mark.parametrize("rowwise", [False, True])
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_scaled_mm(m: int, n: int, k: int, rowwise: bool) -> None:
    a, weight = fp8(m, k), fp8(n, k)
    scale_a, scale_b = scales(m, n, rowwise)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    scaled_mm(a, weight.t(), scale_a, scale_b, out=out)
    ref = (a.double() @ weight.double().t()) * scale_a.double() * scale_b.double()
    assert rel_err(out, ref) < 1e-2
    if k % 16 == 0 and n % 16 == 0:  # what torch._scaled_mm takes
        theirs = torch._scaled_mm(a, weight.t(), scale_a, scale_b, out_dtype=torch.bfloat16)
        assert rel_err(out, theirs.double()) < 1e-2


@pytest.mark.parametrize("cluster", [(4, 1), (4, 2)])
@pytest.mark.parametrize("m, n, k, grid", [(1000, 1000, 1024, None), (4200, 2000, 1024, 66), (320, 520, 384, 4)])
def test_scaled_mm_kernel_in_clusters_of_four(m: int, n: int, k: int, grid: int | None,
                                              cluster: tuple[int, int]) -> None:
    """scaled_mm_kernel in clusters of four stacked in M (B a quarter each) and of 2×2 tiles (CLUSTER_N=2: A to a
    row of tiles, B to a column), rowwise scales, on its own grid or the GPU's resident blocks (odd stacks past M's
    and N's ends): against float64."""
    from tkc.kernels.gemm import persistent_grid
    from tkc.kernels.scaled_mm import CONFIG, scaled_mm_kernel

    a, weight = fp8(m, k), fp8(n, k)
    scale_a, scale_b = scales(m, n, True)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    size, cluster_n = cluster
    spec = scaled_mm_kernel.specialize(target="sm_90a", **{**CONFIG, "ROWWISE": 1, "CLUSTER": size,
                                                           "CLUSTER_N": cluster_n})
    args = (a, weight, scale_a.reshape(-1), scale_b.reshape(-1), out.new_empty(1), out)
    resident = spec.resident_blocks(*args)
    blocks = persistent_grid(m, n, 128, 256, max(size, min(grid or resident, resident)), size, cluster_n)[0]
    spec[(blocks,)](*args)
    assert rel_err(out, (a.double() @ weight.double().t()) * scale_a.double() * scale_b.double()) < 1e-2


@pytest.mark.parametrize("switch", ["FEW_ROWS_IN_CLUSTERS", "FEW_ROWS_LAST_BLOCK"])
@pytest.mark.parametrize("rowwise", [False, True])
@pytest.mark.parametrize("m, n, k, bias, out_dtype", [(16, 4096, 4096, False, torch.bfloat16),
                                                      (1, 8192, 8192, True, torch.float32),
                                                      (27, 2000, 4608, True, torch.float16)])
def test_scaled_mm_few_rows_in_one_launch(m: int, n: int, k: int, bias: bool, out_dtype: torch.dtype, rowwise: bool,
                                          switch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to 32 rows with a one-launch path switched on: FEW_ROWS_IN_CLUSTERS (scaled_mm_few_rows_kernel, a block
    column's runs of K a cluster summing in distributed shared memory) or FEW_ROWS_LAST_BLOCK
    (scaled_mm_few_rows_last_kernel, the last run to arrive summing), then the scales and the bias."""
    import importlib

    monkeypatch.setattr(importlib.import_module("tkc.kernels.gemm"), "FEW_ROWS_LAST_BLOCK", False)
    monkeypatch.setattr(importlib.import_module("tkc.kernels.gemm"), switch, True)
    monkeypatch.setattr(importlib.import_module("tkc.kernels.scaled_mm"), "_PLANS", {})
    a, weight = fp8(m, k), fp8(n, k)
    scale_a, scale_b = scales(m, n, rowwise)
    bias_values = torch.randn(n, device="cuda").to(out_dtype) if bias else None
    ref = (a.double() @ weight.double().t()) * scale_a.double() * scale_b.double()
    if bias:
        ref = ref + bias_values.double()
    for _ in range(2):  # the checked call, then the common call's plan
        out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
        scaled_mm(a, weight.t(), scale_a, scale_b, bias=bias_values, out=out)
        assert rel_err(out, ref) < 1e-2
        assert rel_err(scaled_mm(a, weight.t(), scale_a, scale_b, bias=bias_values, out_dtype=out_dtype), ref) < 1e-2


@pytest.mark.parametrize("a_type, b_type", [("float8_e5m2", "float8_e4m3fn"), ("float8_e4m3fn", "float8_e5m2")])
def test_scaled_mm_mixed_formats(a_type: str, b_type: str) -> None:
    m, n, k = 1000, 520, 768
    a = (torch.randn(m, k, device="cuda") * 2).to(getattr(torch, a_type))
    weight = (torch.randn(n, k, device="cuda") * 2).to(getattr(torch, b_type))
    scale_a, scale_b = scales(m, n, True)
    out = scaled_mm(a, weight.t(), scale_a, scale_b)
    assert rel_err(out, (a.double() @ weight.double().t()) * scale_a.double() * scale_b.double()) < 1e-2


def test_quantize_rows_then_scaled_mm() -> None:
    """An fp8 linear layer: tests/kernels/quantize_fp8.py quantizes the activations and the weight rowwise (f32 tiles
    stored into fp8 tensors), scaled_mm multiplies them with those scales: close to the bf16 product (e4m3's
    precision), the scales exact, the bytes as torch's cast of x / scale (but at rounding ties)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kernels.quantize_fp8 import quantize_rows_fp8

    def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = torch.empty(x.shape, device="cuda", dtype=torch.float8_e4m3fn)
        scale = torch.full((x.shape[0],), float("nan"), device="cuda")
        quantize_rows_fp8[(-(-x.shape[0] // 64),)](x, q, scale)
        return q, scale

    m, n, k = 1000, 3000, 2048
    x, w = torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    (xq, xs), (wq, ws) = quantize(x), quantize(w)
    torch.testing.assert_close(xs, x.float().abs().amax(1) / 448, rtol=1e-6, atol=0)  # (its division may round)
    theirs = (x.float() / xs[:, None]).to(torch.float8_e4m3fn)
    assert (xq.view(torch.uint8) != theirs.view(torch.uint8)).float().mean() < 2e-3
    out = scaled_mm(xq, wq.t(), xs[:, None].contiguous(), ws[None, :].contiguous())
    assert rel_err(out, x.double() @ w.double().t()) < 6e-2


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("m, n, k", [(1000, 520, 768), (16, 4096, 4096)])
def test_scaled_mm_output_dtypes(out_dtype: torch.dtype, m: int, n: int, k: int) -> None:
    a, weight = fp8(m, k), fp8(n, k)
    scale_a, scale_b = scales(m, n, True)
    out = scaled_mm(a, weight.t(), scale_a, scale_b, out_dtype=out_dtype)
    assert out.dtype == out_dtype
    # the fp8 tensor cores' own accumulation (torch's use_fast_accum=True) is ~5e-4 off a float64 sum at K=4096
    # (the H200, 2026-12-05), also in f32
    ref = (a.double() @ weight.double().t()) * scale_a.double() * scale_b.double()
    assert rel_err(out, ref) < 2e-3
    if n % 16 == 0:  # what torch._scaled_mm takes
        theirs = torch._scaled_mm(a, weight.t(), scale_a, scale_b, out_dtype=out_dtype, use_fast_accum=True)
        assert rel_err(out, theirs.double()) < 2e-3


@pytest.mark.parametrize("rowwise", [False, True])
@pytest.mark.parametrize("m, n, k", [(1000, 520, 768), (16, 4096, 4096)])
def test_scaled_mm_bias(m: int, n: int, k: int, rowwise: bool) -> None:
    """bias added after the scales (tiles and few-rows paths), twice (the second call through the plan), as
    torch._scaled_mm's bias."""
    a, weight = fp8(m, k), fp8(n, k)
    scale_a, scale_b = scales(m, n, rowwise)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) * 10
    ref = (a.double() @ weight.double().t()) * scale_a.double() * scale_b.double() + bias.double()
    for _ in range(2):
        assert rel_err(scaled_mm(a, weight.t(), scale_a, scale_b, bias=bias), ref) < 1e-2
    assert rel_err(scaled_mm(a, weight.t(), scale_a, scale_b), ref - bias.double()) < 1e-2  # and without, after


def test_scaled_mm_unaligned_views() -> None:
    """Rows of a wider a (pitch above K), a weight slice, an out that is a slice of a wider tensor: the cp.async ring
    and plain stores where rows are not 16-byte aligned; nothing written past out's columns."""
    m, n, k = 300, 200, 520
    a = fp8(m, k + 8)[:, 4:4 + k]
    weight = fp8(n, k)
    wide = torch.full((m, n + 3), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = wide[:, :n]
    scale_a, scale_b = scales(m, n, True)
    scaled_mm(a, weight.t(), scale_a, scale_b, out=out)
    ref = (a.double() @ weight.double().t()) * scale_a.double() * scale_b.double()
    assert rel_err(out, ref) < 1e-2
    assert wide[:, n:].isnan().all()


@pytest.mark.parametrize("call, words", [
    (lambda: scaled_mm(fp8(64, 32).to(torch.bfloat16), fp8(32, 64), *scales(64, 64, False)), ["a must be torch.float8_e4m3fn"]),
    (lambda: scaled_mm(fp8(64, 32), fp8(48, 64), *scales(64, 64, False)), ["b: a is 64x32, so b must be 32xN"]),
    (lambda: scaled_mm(fp8(64, 32), fp8(32, 64), *scales(64, 64, False)), ["column-major"]),
    (lambda: scaled_mm(fp8(64, 32), fp8(64, 32).t(), torch.ones(64, device="cuda"), torch.ones(1, device="cuda")),
     ["scale_a and scale_b", "(64, 1) and (1, 64)"]),
    (lambda: scaled_mm(fp8(64, 32), fp8(64, 32).t(), torch.ones(1, device="cuda", dtype=torch.bfloat16),
                       torch.ones(1, device="cuda")), ["scale_a must be torch.float32"]),
    (lambda: scaled_mm(fp8(64, 32), fp8(64, 32).t(), *scales(64, 64, False), out_dtype=torch.int8),
     ["out_dtype", "torch.float32"]),
    (lambda: scaled_mm(fp8(64, 32), fp8(64, 32).t(), *scales(64, 64, False), bias=torch.ones(64, device="cuda")),
     ["bias must be torch.bfloat16"]),
    (lambda: scaled_mm(fp8(64, 32), fp8(64, 32).t(), *scales(64, 64, False),
                       bias=torch.ones(32, device="cuda", dtype=torch.bfloat16)), ["bias: expected shape (64,)"]),
])
def test_scaled_mm_bad_arguments(call, words) -> None:
    with pytest.raises(ValueError) as info:
        call()
    for word in words:
        assert word in str(info.value)
