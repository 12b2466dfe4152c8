"""scaled_mm_kernel (fp8 e4m3 GEMM with per-tensor or rowwise scales, sm_90a) on the CPU: the tile interpreter and
the per-thread simulation of its PTX agree with a float64 reference on ragged shapes, on the TMA ring and on the
cp.async ring of unaligned rows; ptxas takes both configurations without spills; the entry point's checks."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from backend.test_simulate import run_both
from hypothesis import Phase, given, settings
from hypothesis import strategies as st_
from reference import BF16, rel_err

import tkc
from tkc import lang
from tkc.backend import ptxas
from tkc.compiler import lower_kernel
from tkc.lang import block_idx, const, f32, fp8e4m3, gl, load, rt, store
from tkc.kernels.scaled_mm import CONFIG, CONFIG_UNALIGNED, SMALLER_TILES_FP8, scaled_mm_kernel

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
SMALL = {"BN": 64, "BK": 128, "WARPS": 4, "STAGES": 2}  # the shipped tiles' code on fewer, smaller tiles
NO_BIAS = np.zeros(1, dtype=BF16)  # the Bias argument of BIAS=0 launches (never read)


def _inputs(rng: np.random.Generator, m: int, n: int, k: int, rowwise: bool):
    a = (rng.standard_normal((m, k)) * 2).astype(E4M3)
    b = (rng.standard_normal((n, k)) * 2).astype(E4M3)
    scale_a = (rng.random(m if rowwise else 1) + 0.5).astype(np.float32)
    scale_b = (rng.random(n if rowwise else 1) + 0.5).astype(np.float32)
    return a, b, scale_a, scale_b


def _reference(a, b, scale_a, scale_b, rowwise: bool) -> np.ndarray:
    product = a.astype(np.float64) @ b.astype(np.float64).T
    if rowwise:
        return product * scale_a[:, None] * scale_b[None, :]
    return product * scale_a[0] * scale_b[0]


@pytest.mark.parametrize("rowwise", [0, 1])
@pytest.mark.parametrize("m, n, k, constants, order", [
    (130, 100, 256, SMALL, "shuffled"),                                     # ragged M and N
    (64, 64, 640, {**SMALL, "STAGES": 3}, "descending"),                    # 5 steps of K through a 3-stage ring
    (200, 130, 384, {**SMALL, "WARPS": 8, "BN": 128}, "ascending"),         # two warpgroups a block, 4 tiles, 3 blocks
    (64, 80, 100, {**SMALL, "TMA_STORE": 0}, "shuffled"),                   # rows of 100 bytes: cp.async, ragged K
])
def test_scaled_mm_matches_reference(rowwise: int, m: int, n: int, k: int, constants: dict, order: str) -> None:
    rng = np.random.default_rng(m * n + k + rowwise)
    a, b, scale_a, scale_b = _inputs(rng, m, n, k, bool(rowwise))
    c = np.full((m, n), np.nan, dtype=BF16)
    tiles = -(-m // (16 * constants["WARPS"])) * -(-n // constants["BN"])
    interp, sim = run_both(scaled_mm_kernel, [a, b, scale_a, scale_b, NO_BIAS, c], (max(1, tiles - 1),),
                           {**constants, "ROWWISE": rowwise}, target="sm_90a", order=order)
    ref = _reference(a, b, scale_a, scale_b, bool(rowwise))
    assert rel_err(interp[5], ref) < 1e-2  # bf16 output
    assert rel_err(sim[5], interp[5]) < 1e-3  # the same roundings of sums taken in another order


@pytest.mark.parametrize("rowwise, m, grid, producer, cluster", [(0, 200, 4, 0, (2, 1)), (1, 150, 2, 0, (2, 1)),
                                                                   (1, 200, 2, 1, (2, 1)), (1, 150, 4, 1, (4, 2)),
                                                                   (0, 200, 8, 0, (4, 2))])
def test_scaled_mm_in_clusters(rowwise: int, m: int, grid: int, producer: int, cluster: tuple[int, int]) -> None:
    """CLUSTER=2: two tiles stacked in M share B's slices by TMA multicast (a last stack with a block past M's end
    at m=150), also with a producer warpgroup; CLUSTER=4, CLUSTER_N=2: 2×2 tiles, A multicast to a row of them and
    B to a column; the blocks of a cluster are simulated together."""
    rng = np.random.default_rng(m + rowwise)
    n, k = 130, 384
    a, b, scale_a, scale_b = _inputs(rng, m, n, k, bool(rowwise))
    c = np.full((m, n), np.nan, dtype=BF16)
    interp, sim = run_both(scaled_mm_kernel, [a, b, scale_a, scale_b, NO_BIAS, c], (grid,),
                           {**SMALL, "STAGES": 3, "ROWWISE": rowwise, "CLUSTER": cluster[0], "CLUSTER_N": cluster[1],
                            "PRODUCER": producer},
                           target="sm_90a", order="sliced")
    assert rel_err(interp[5], _reference(a, b, scale_a, scale_b, bool(rowwise))) < 1e-2
    assert rel_err(sim[5], interp[5]) < 1e-3


@settings(max_examples=8, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate])
@given(m=st_.integers(1, 140), n=st_.integers(1, 140), k=st_.integers(1, 300), rowwise=st_.sampled_from([0, 1]),
       warps=st_.sampled_from([4, 8]), stages=st_.integers(1, 3), blocks=st_.integers(1, 3),
       seed=st_.integers(0, 2**16))
def test_scaled_mm_random_shapes(m: int, n: int, k: int, rowwise: int, warps: int, stages: int, blocks: int,
                                 seed: int) -> None:
    """Any M, N, K (rows of any alignment: TMA, cp.async or element copies), either kind of scales, ring depth and
    persistent grid: the simulated PTX matches the interpreter, which matches float64."""
    rng = np.random.default_rng(seed)
    a, b, scale_a, scale_b = _inputs(rng, m, n, k, bool(rowwise))
    c = np.full((m, n), np.nan, dtype=BF16)
    constants = {"BN": 64, "BK": 128, "WARPS": warps, "STAGES": stages, "ROWWISE": rowwise, "TMA_STORE": 0}
    interp, sim = run_both(scaled_mm_kernel, [a, b, scale_a, scale_b, NO_BIAS, c], (blocks,), constants, target="sm_90a",
                           order="shuffled")
    assert rel_err(interp[5], _reference(a, b, scale_a, scale_b, bool(rowwise))) < 1e-2
    assert rel_err(sim[5], interp[5]) < 2e-3


@pytest.mark.parametrize("a_type, b_type", [("fp8e5m2", "fp8e4m3"), ("fp8e4m3", "fp8e5m2"), ("fp8e5m2", "fp8e5m2")])
def test_scaled_mm_mixed_formats(a_type: str, b_type: str) -> None:
    """e5m2 operands (a gradient's range) with e4m3 or e5m2 ones: the kernel's AT / BT constants, k32 wgmmas of
    those types."""
    from tkc import lang

    numpy_types = {"fp8e4m3": ml_dtypes.float8_e4m3fn, "fp8e5m2": ml_dtypes.float8_e5m2}
    rng = np.random.default_rng(len(a_type + b_type))
    m, n, k = 100, 80, 256
    a = (rng.standard_normal((m, k)) * 2).astype(numpy_types[a_type])
    b = (rng.standard_normal((n, k)) * 2).astype(numpy_types[b_type])
    scale_a, scale_b = np.float32([0.75]), np.float32([1.5])
    c = np.full((m, n), np.nan, dtype=BF16)
    constants = {**SMALL, "AT": getattr(lang, a_type), "BT": getattr(lang, b_type)}
    interp, sim = run_both(scaled_mm_kernel, [a, b, scale_a, scale_b, NO_BIAS, c], (3,), constants, target="sm_90a")
    assert rel_err(interp[5], _reference(a, b, scale_a, scale_b, False)) < 1e-2
    assert rel_err(sim[5], interp[5]) < 1e-3
    ptx = lower_kernel(scaled_mm_kernel, "sm_90a", constants)
    from tkc.backend.ptx_printer import emit_ptx

    assert f"k32.f32.{a_type[3:]}.{b_type[3:]}" in emit_ptx(ptx, "sm_90a")


def test_scaled_mm_scale_mutation_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulation sees a lowering that drops the row scales (mul_row lowered as the identity)."""
    from tkc.backend import lower_compute, lowering  # noqa: F401 - lower_compute registers the handlers
    from tkc.ir import ops as t

    def mutate(cls: type, handler):
        if cls is not t.BroadcastBinaryOp:
            return handler
        return lambda lw, op: [lw.value(op.tile)] if op.name == "tile.mul_row" else handler(lw, op)

    monkeypatch.setattr(lowering, "_BASE_HANDLERS", [(cls, mutate(cls, h)) for cls, h in lowering._BASE_HANDLERS])
    monkeypatch.setattr(lowering, "_HANDLERS", {k: v for k, v in lowering._HANDLERS.items()
                                                if not issubclass(k, t.BroadcastBinaryOp)})
    rng = np.random.default_rng(9)
    a, b, scale_a, scale_b = _inputs(rng, 64, 64, 128, True)
    c = np.full((64, 64), np.nan, dtype=BF16)
    interp, sim = run_both(scaled_mm_kernel, [a, b, scale_a, scale_b, NO_BIAS, c], (1,), {**SMALL, "ROWWISE": 1},
                           target="sm_90a")
    assert rel_err(sim[5], interp[5]) > 0.05


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("rowwise", [0, 1])
@pytest.mark.parametrize("config, align", [(CONFIG, 16), (CONFIG_UNALIGNED, 8), (CONFIG_UNALIGNED, 2),
                                           *((tiles, 16) for tiles in SMALLER_TILES_FP8)])
def test_scaled_mm_configurations_assemble(config: dict, align: int, rowwise: int) -> None:
    """What scaled_mm() launches, for 16-byte aligned rows (TMA ring and stores) and others (cp.async ring): no
    spills, wgmma unserialized, k32 e4m3 wgmmas."""
    from tkc.backend.ptx_printer import emit_ptx

    module = lower_kernel(scaled_mm_kernel, "sm_90a", {**config, "ROWWISE": rowwise},
                          aligns={"A": align, "B": align, "ScaleA": 4, "ScaleB": 4, "C": min(align, 16)})
    ptx = emit_ptx(module, "sm_90a")
    assert f"m64n{config['BN']}k32.f32.e4m3.e4m3" in ptx
    assert ("cp.async.bulk.tensor.2d.shared" in ptx) == (align == 16)  # a TMA ring
    (report,) = ptxas.assemble(ptx, "sm_90a").values()
    assert report.spill_stores == 0 and report.stack_bytes == 0 and not report.notes, report.log


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("rows, rowwise, bias", [(16, 0, 0), (32, 1, 1)])
def test_scaled_mm_few_rows_last_block_assembles(rows: int, rowwise: int, bias: int) -> None:
    """scaled_mm_few_rows_last_kernel as scaled_mm() launches it (FEW_ROWS_LAST_BLOCK): no spills, no stack, wgmma
    unserialized; the arrival one thread's atom.acq_rel.gpu."""
    from tkc.backend.ptx_printer import emit_ptx
    from tkc.kernels.gemm import FEW_ROWS
    from tkc.kernels.scaled_mm import scaled_mm_few_rows_last_kernel

    module = lower_kernel(scaled_mm_few_rows_last_kernel, "sm_90a",
                          {**FEW_ROWS, "ROWS": rows, "ROWWISE": rowwise, "BIAS": bias},
                          aligns={"A": 16, "B": 16, "ScaleA": 4, "ScaleB": 4, "Bias": 2, "Partial": 16, "C": 16,
                                  "Counter": 16})
    ptx = emit_ptx(module, "sm_90a")
    assert "atom.acq_rel.gpu.global.add.u32" in ptx
    (report,) = ptxas.assemble(ptx, "sm_90a").values()
    assert report.spill_stores == 0 and report.stack_bytes == 0 and not report.notes, report.log


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("rows, cluster, rowwise, bias", [(16, 4, 0, 0), (32, 2, 1, 1), (32, 3, 0, 1)])
def test_scaled_mm_few_rows_configurations_assemble(rows: int, cluster: int, rowwise: int, bias: int) -> None:
    """scaled_mm_few_rows_kernel as scaled_mm() launches it: no spills, no stack, wgmma unserialized; its reads of
    the peers' partial sums are ld.shared::cluster through mapa."""
    from tkc.backend.ptx_printer import emit_ptx
    from tkc.kernels.gemm import FEW_ROWS
    from tkc.kernels.scaled_mm import scaled_mm_few_rows_kernel

    module = lower_kernel(scaled_mm_few_rows_kernel, "sm_90a",
                          {**FEW_ROWS, "ROWS": rows, "CLUSTER": cluster, "ROWWISE": rowwise, "BIAS": bias},
                          aligns={"A": 16, "B": 16, "ScaleA": 4, "ScaleB": 4, "Bias": 2, "C": 16})
    ptx = emit_ptx(module, "sm_90a")
    assert f".reqnctapercluster {cluster}, 1, 1" in ptx
    assert "mapa.shared::cluster.u32" in ptx and "ld.shared::cluster.v2.b32" in ptx
    (report,) = ptxas.assemble(ptx, "sm_90a").values()
    assert report.spill_stores == 0 and report.stack_bytes == 0 and not report.notes, report.log


def test_scaled_mm_checks_its_arguments() -> None:
    """Without a GPU, the first check refuses (the rest: tests/gpu/test_kernels_gpu.py)."""
    torch = pytest.importorskip("torch")
    from tkc.errors import KernelArgumentError
    from tkc.kernels import scaled_mm

    a = torch.zeros(16, 32, dtype=torch.float8_e4m3fn)
    with pytest.raises(KernelArgumentError, match="a is on cpu"):
        scaled_mm(a, a.t(), torch.ones(1), torch.ones(1))


def test_interpreter_takes_torch_fp8_tensors() -> None:
    """`kernel.interpret` on CPU torch tensors of float8_e4m3fn (read through their bytes) and a bf16 output."""
    torch = pytest.importorskip("torch")
    a, b = (torch.randn(64, 128).to(torch.float8_e4m3fn) for _ in range(2))
    c = torch.full((64, 64), float("nan"), dtype=torch.bfloat16)
    scaled_mm_kernel.interpret(a, b, torch.tensor([0.5]), torch.tensor([2.0]), c[0], c, grid=(1,), **SMALL)
    assert rel_err(c.float().numpy(), (a.double() @ b.double().t()).numpy()) < 1e-2


def test_quantize_rows_fp8() -> None:
    """tests/kernels/quantize_fp8.py (an f32 tile stored into an fp8 tensor converts: cvt.rn.satfinite.e4m3x2):
    the scales are the rows' largest magnitudes / 448; the bytes agree with the interpreter's but where x / scale
    lies on a rounding tie (the lowering divides by a reciprocal); Q · scale is x to e4m3's precision."""
    from kernels.quantize_fp8 import quantize_rows_fp8

    rng = np.random.default_rng(0)
    m, n = 100, 300
    x = (rng.standard_normal((m, n)) * 3).astype(BF16)
    x[7] = 0  # an all-zero row
    q, scale = np.zeros((m, n), E4M3), np.full(m, np.nan, np.float32)
    interp, sim = run_both(quantize_rows_fp8, [x, q, scale], (2,), {}, target="sm_90a", order="shuffled")
    xf = x.astype(np.float64)
    np.testing.assert_allclose(sim[2], np.maximum(np.abs(xf).max(1), 1e-12) / 448, rtol=1e-6)
    assert (interp[1].view(np.uint8) != sim[1].view(np.uint8)).mean() < 2e-3
    assert rel_err(sim[1].astype(np.float64) * sim[2][:, None], xf) < 4e-2
    assert np.abs(sim[1].astype(np.float32)).max() <= 448


@pytest.mark.parametrize("dtype", ["fp8e4m3", "fp8e5m2"])
def test_fp8_tiles_load_into_f32_registers(dtype: str) -> None:
    """load(fp8 tensor, ..., rt[f32, ...]) converts exactly (cvt.rn.f16x2.e4m3x2, then f16 → f32), at any row
    alignment (bytes one by one where rows are odd), and stores convert back: a round trip keeps every byte."""
    @tkc.kernel(warps=1, min_target="sm_90a")
    def round_trip(A: gl["DT", 2], B: gl[f32, 2], C: gl["DT", 2], DT: const = fp8e4m3):
        a = load(A, (block_idx()[0], 0), rt[f32, 16, 64])
        store(B, a, (block_idx()[0], 0))
        store(C, a, (block_idx()[0], 0))

    numpy_type = {"fp8e4m3": ml_dtypes.float8_e4m3fn, "fp8e5m2": ml_dtypes.float8_e5m2}[dtype]
    for cols in (64, 61):
        rng = np.random.default_rng(cols)
        a = (rng.standard_normal((40, cols)) * 8).astype(numpy_type)
        b, c = np.full((40, cols), np.nan, np.float32), np.zeros((40, cols), numpy_type)
        _, sim = run_both(round_trip, [a, b, c], (3,), {"DT": getattr(lang, dtype)}, target="sm_90a")
        np.testing.assert_array_equal(sim[1], a.astype(np.float32))
        np.testing.assert_array_equal(sim[2].view(np.uint8), a.view(np.uint8))


def test_fp8_conversions_need_sm90a() -> None:
    """sm_80 has no fp8 conversions: one error that says so (sm_89's cvt is the first)."""
    from tkc.compiler import compile_kernels
    from tkc.errors import TkcError

    @tkc.kernel(warps=1, min_target="sm_80")
    def to_fp8(A: gl[f32, 2], B: gl[fp8e4m3, 2]):
        store(B, load(A, (0, 0), rt[f32, 16, 16]), (0, 0))

    with pytest.raises(TkcError, match="needs sm_89 or newer: compile for sm_90a"):
        compile_kernels([to_fp8], "sm_80", {})
    compile_kernels([to_fp8], "sm_90a", {})


@pytest.mark.parametrize("rows, rowwise", [(16, 1), (24, 0)])
def test_scaled_mm_few_rows_path(rows: int, rowwise: int) -> None:
    """What scaled_mm() runs for up to 32 rows of a: gemm_few_rows_kernel on fp8 (the weight's rows the k32 wgmma's
    64, a's rows its N of 16 or 32) over runs of K, then sum_scaled_splits_kernel's scaled sum; against float64."""
    from tkc.kernels.gemm import gemm_few_rows_kernel
    from tkc.kernels.scaled_mm import sum_scaled_splits_kernel

    rng = np.random.default_rng(rows)
    m, n, k, runs = rows, 200, 512, 2
    a, b, scale_a, scale_b = _inputs(rng, m, n, k, bool(rowwise))
    partial = np.full((runs, m, n), np.nan, np.float32)
    constants = {"TRANS_B": 1, "ROWS": 16 if m <= 16 else 32, "BK": 128, "WARPS": 4, "STAGES": 2, "DT": fp8e4m3}
    interp, sim = run_both(gemm_few_rows_kernel, [a, b, partial], (-(-n // 64), runs), constants, target="sm_90a",
                           order="shuffled")
    assert rel_err(sim[2], interp[2]) < 1e-6
    c = np.full((m, n), np.nan, dtype=BF16)
    _, sim = run_both(sum_scaled_splits_kernel, [sim[2], scale_a, scale_b, NO_BIAS, c], (-(-m // 16), -(-n // 256)),
                      {"ROWWISE": rowwise}, target="sm_90a")
    assert rel_err(sim[4], _reference(a, b, scale_a, scale_b, bool(rowwise))) < 1e-2


@pytest.mark.parametrize("rows, m, runs, rowwise, bias, out_type", [
    (16, 16, 2, 1, 0, "bf16"), (32, 24, 3, 0, 1, "f32"), (32, 32, 4, 1, 1, "f16"), (16, 1, 2, 0, 0, "bf16")])
def test_scaled_mm_few_rows_in_clusters(rows: int, m: int, runs: int, rowwise: int, bias: int, out_type: str) -> None:
    """scaled_mm_few_rows_kernel (what scaled_mm() launches for up to 32 rows where the GPU holds all the
    clusters): each block column's runs of K a cluster summing in distributed shared memory, then the scales and
    the bias; the blocks of a cluster simulated together; against float64."""
    from tkc.kernels.scaled_mm import scaled_mm_few_rows_kernel

    numpy_type = {"bf16": BF16, "f16": np.float16, "f32": np.float32}[out_type]
    rng = np.random.default_rng(rows + runs)
    n, k = 200, 128 * 2 * runs + 128
    a, b, scale_a, scale_b = _inputs(rng, m, n, k, bool(rowwise))
    bias_values = (rng.standard_normal(n if bias else 1) * 10).astype(numpy_type)
    c = np.full((m, n), np.nan, dtype=numpy_type)
    constants = {"ROWS": rows, "BK": 128, "WARPS": 4, "STAGES": 2, "CLUSTER": runs, "ROWWISE": rowwise,
                 "BIAS": bias, "CT": getattr(lang, out_type)}
    interp, sim = run_both(scaled_mm_few_rows_kernel, [a, b, scale_a, scale_b, bias_values, c], (-(-n // 64) * runs,),
                           constants, target="sm_90a", order="ahead" if runs % 2 else "shuffled")
    ref = _reference(a, b, scale_a, scale_b, bool(rowwise)) + (bias_values.astype(np.float64)[None, :] if bias else 0)
    assert rel_err(interp[5], ref) < 1e-2
    assert rel_err(sim[5], interp[5]) < 1e-3


@pytest.mark.parametrize("rows, m, runs, rowwise, bias, out_type", [
    (16, 16, 2, 1, 0, "bf16"), (32, 24, 3, 0, 1, "f32"), (32, 32, 4, 1, 1, "f16"), (16, 1, 2, 0, 0, "bf16")])
def test_scaled_mm_few_rows_last_block(rows: int, m: int, runs: int, rowwise: int, bias: int, out_type: str) -> None:
    """scaled_mm_few_rows_last_kernel (scaled_mm() with FEW_ROWS_LAST_BLOCK): each block leaves its run's partial
    sum, the last of a block column's runs to arrive at its counter sums them, then the scales and the bias;
    simulated and interpreted against float64, the counters left at zero."""
    from tkc.kernels.scaled_mm import scaled_mm_few_rows_last_kernel

    numpy_type = {"bf16": BF16, "f16": np.float16, "f32": np.float32}[out_type]
    rng = np.random.default_rng(rows + runs + 1)
    n, k = 200, 128 * 2 * runs + 128
    a, b, scale_a, scale_b = _inputs(rng, m, n, k, bool(rowwise))
    bias_values = (rng.standard_normal(n if bias else 1) * 10).astype(numpy_type)
    partial = np.full((runs, m, n), np.nan, dtype=np.float32)
    c = np.full((m, n), np.nan, dtype=numpy_type)
    counter = np.zeros(8, dtype=np.int32)
    constants = {"ROWS": rows, "BK": 128, "WARPS": 4, "STAGES": 2, "ROWWISE": rowwise, "BIAS": bias, "RUNS": runs,
                 "CT": getattr(lang, out_type)}
    interp, sim = run_both(scaled_mm_few_rows_last_kernel, [a, b, scale_a, scale_b, bias_values, partial, c, counter],
                           (-(-n // 64), runs), constants, target="sm_90a", order="ahead" if runs % 2 else "shuffled")
    ref = _reference(a, b, scale_a, scale_b, bool(rowwise)) + (bias_values.astype(np.float64)[None, :] if bias else 0)
    assert rel_err(interp[6], ref) < 1e-2
    assert rel_err(sim[6], interp[6]) < 1e-3
    assert not sim[7].any() and not interp[7].any()


@pytest.mark.parametrize("out_type, tma_store", [("f16", 1), ("f32", 0)])
def test_scaled_mm_output_dtypes(out_type: str, tma_store: int) -> None:
    """C in f16 (through the TMA store, as bf16) or f32 (stored from registers: an f32 staging tile a warp would
    not fit beside the ring): the kernel's CT constant; the few-rows path's sum likewise."""
    from tkc.kernels.scaled_mm import sum_scaled_splits_kernel

    numpy_type = {"f16": np.float16, "f32": np.float32}[out_type]
    rng = np.random.default_rng(2)
    m, n, k = 130, 100, 256
    a, b, scale_a, scale_b = _inputs(rng, m, n, k, True)
    c = np.full((m, n), np.nan, dtype=numpy_type)
    constants = {**SMALL, "ROWWISE": 1, "CT": getattr(lang, out_type), "TMA_STORE": tma_store}
    interp, sim = run_both(scaled_mm_kernel, [a, b, scale_a, scale_b, NO_BIAS.astype(numpy_type), c], (3,), constants,
                           target="sm_90a")
    ref = _reference(a, b, scale_a, scale_b, True)
    assert sim[5].dtype == numpy_type and rel_err(sim[5], ref) < (1e-3 if out_type == "f16" else 1e-6)
    partial = (rng.standard_normal((2, m, n))).astype(np.float32)
    _, sim = run_both(sum_scaled_splits_kernel,
                      [partial, scale_a, scale_b, NO_BIAS.astype(numpy_type), np.full((m, n), np.nan, numpy_type)],
                      (-(-m // 16), 1), {"ROWWISE": 1, "CT": getattr(lang, out_type)}, target="sm_90a")
    summed = partial.astype(np.float64).sum(0) * scale_a[:, None] * scale_b[None, :]
    assert rel_err(sim[4], summed) < (1e-3 if out_type == "f16" else 1e-6)
    if ptxas.find_ptxas() is not None:
        from tkc.backend.ptx_printer import emit_ptx

        module = lower_kernel(scaled_mm_kernel, "sm_90a", {**CONFIG, "ROWWISE": 1, "CT": getattr(lang, out_type),
                                                           "TMA_STORE": tma_store},
                              aligns={"A": 16, "B": 16, "ScaleA": 4, "ScaleB": 4, "C": 16})
        (report,) = ptxas.assemble(emit_ptx(module, "sm_90a"), "sm_90a").values()
        assert report.spill_stores == 0 and not report.notes, report.log


@pytest.mark.parametrize("rowwise", [0, 1])
def test_scaled_mm_bias(rowwise: int) -> None:
    """BIAS=1: Bias[j] added to column j after the scales, in both kernels scaled_mm() launches."""
    from tkc.kernels.scaled_mm import sum_scaled_splits_kernel

    rng = np.random.default_rng(5 + rowwise)
    m, n, k = 100, 150, 256
    a, b, scale_a, scale_b = _inputs(rng, m, n, k, bool(rowwise))
    bias = (rng.standard_normal(n) * 10).astype(BF16)
    ref = _reference(a, b, scale_a, scale_b, bool(rowwise)) + bias.astype(np.float64)[None, :]
    c = np.full((m, n), np.nan, dtype=BF16)
    interp, sim = run_both(scaled_mm_kernel, [a, b, scale_a, scale_b, bias, c], (2,),
                           {**SMALL, "ROWWISE": rowwise, "BIAS": 1}, target="sm_90a", order="shuffled")
    assert rel_err(interp[5], ref) < 1e-2 and rel_err(sim[5], interp[5]) < 1e-3
    partial = (a.astype(np.float32) @ b.astype(np.float32).T)[None] / 2 * np.ones((2, 1, 1), np.float32)
    _, sim = run_both(sum_scaled_splits_kernel, [partial, scale_a, scale_b, bias, np.full((m, n), np.nan, BF16)],
                      (-(-m // 16), 1), {"ROWWISE": rowwise, "BIAS": 1}, target="sm_90a")
    assert rel_err(sim[4], ref) < 1e-2
