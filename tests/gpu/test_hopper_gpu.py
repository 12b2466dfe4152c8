"""The sm_90a instruction layer on a Hopper GPU: the hand-built TMA + mbarrier + wgmma kernel (tests/hopper_kernels.py)
computes A·Bᵀ, which checks the tensor maps, the swizzle shared by TMA and our descriptors, the mbarrier phase
wait, the wgmma text and the accumulator fragment at once. Run with: pytest -m gpu tests/gpu."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hopper_kernels import SHARED_BYTES, tma_wgmma_kernel  # noqa: E402

from tkc.backend import wgmma  # noqa: E402
from tkc.backend.ptx_printer import emit_ptx  # noqa: E402

pytestmark = pytest.mark.gpu


def test_tma_mbarrier_wgmma_compute_a_times_b_transposed() -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from tkc.runtime.driver import device, launch, load_ptx, make_current
    from tkc.runtime.launch import ParamBuffer

    a = torch.randn(64, 64, device="cuda").to(torch.bfloat16)
    b = torch.randn(64, 64, device="cuda").to(torch.bfloat16)
    out = torch.full((128, 32), float("nan"), device="cuda")
    make_current(device(torch.cuda.current_device()))
    kernel = load_ptx(emit_ptx(tma_wgmma_kernel(), "sm_90a"), "tma_wgmma", 128, SHARED_BYTES)
    from tkc.runtime.tensor_maps import tensor_map

    maps = [tensor_map(t, 64, 64, 128) for t in (a, b)]  # the launcher's path: shape, strides and cache from torch
    params = ParamBuffer([("tA", "tensormap"), ("tB", "tensormap"), ("out", "u64")])
    launch(kernel, (1, 1, 1), torch.cuda.current_stream().cuda_stream, params.address(params.pack([*maps, out.data_ptr()])))
    torch.cuda.synchronize()
    rows, cols = wgmma.accumulator_fragment(64)
    d = torch.empty(64, 64, device="cuda")
    d[torch.as_tensor(rows.copy(), device="cuda"), torch.as_tensor(cols.copy(), device="cuda")] = out
    ref = a.float() @ b.float().t()
    assert ((d - ref).norm() / ref.norm()).item() < 1e-5


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("m, n, k, bn", [(64, 64, 64, 64), (256, 512, 1024, 256), (1000, 1000, 1000, 128), (192, 80, 72, 16),
                                         (1000, 520, 1000, 128)])
def test_dsl_wgmma_gemm(trans_a: int, trans_b: int, m: int, n: int, k: int, bn: int) -> None:
    """The DSL's mma_AB / mma_ABt on shared tiles, lowered to wgmma with descriptors, on the H200; with trans_a,
    mma_AtB / mma_AtBt (A given K×M, read transposed by the wgmma: imm-trans-a)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from hopper_kernels import warpgroup_gemm

    a = torch.randn(k, m, device="cuda").to(torch.bfloat16).t() if trans_a else torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda").to(torch.bfloat16) if trans_b else torch.randn(k, n, device="cuda").to(torch.bfloat16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    warpgroup_gemm[(-(-m // 64), -(-n // bn))](a.t() if trans_a else a, b, c, TRANS_A=trans_a, TRANS_B=trans_b, BN=bn,
                                               BK=16 if bn == 16 else 64, target="sm_90a")
    ref = a.double() @ (b.double().t() if trans_b else b.double())
    assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("m, n, k, warps, stages", [(1000, 1000, 1000, 8, 4), (4096, 4096, 16, 8, 4),
                                                    (256, 768, 2048, 8, 2), (320, 520, 264, 4, 3), (1, 8, 8, 8, 4)])
def test_gemm_producer_warpgroup(trans_b: int, m: int, n: int, k: int, warps: int, stages: int) -> None:
    """gemm_sm90_kernel with a producer warpgroup (specialize-warps): TMA ring, setmaxnreg, on the H200."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from tkc.kernels import gemm_sm90_kernel

    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda").to(torch.bfloat16) if trans_b else torch.randn(k, n, device="cuda").to(torch.bfloat16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    bn = 256
    gemm_sm90_kernel[(-(-m // (16 * warps)) * -(-n // bn),)](a, b, c, TRANS_B=trans_b, BN=bn, BK=64, WARPS=warps,
                                                             STAGES=stages, PRODUCER=1, target="sm_90a")
    ref = a.double() @ (b.double().t() if trans_b else b.double())
    assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("m, n, k, cluster, rows", [(16, 4096, 4096, 4, 16), (1, 8192, 8192, 2, 16),
                                                    (27, 2000, 4608, 3, 32), (32, 520, 1000, 2, 32)])
def test_few_rows_in_clusters(trans_b: int, m: int, n: int, k: int, cluster: int, rows: int,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """gemm_few_rows_cluster_kernel: a block column's runs of K a cluster adding up its partial sums in distributed
    shared memory, launched directly (a cluster a block column), and through gemm() with the one-launch path
    switched on (FEW_ROWS_IN_CLUSTERS)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    import importlib

    from tkc.kernels import gemm
    from tkc.kernels.gemm import FEW_ROWS, gemm_few_rows_cluster_kernel

    gemm_module = importlib.import_module("tkc.kernels.gemm")
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda").to(torch.bfloat16) if trans_b else torch.randn(k, n, device="cuda").to(torch.bfloat16)
    ref = a.double() @ (b.double().t() if trans_b else b.double())
    spec = gemm_few_rows_cluster_kernel.specialize(target="sm_90a", **{**FEW_ROWS, "TRANS_B": trans_b, "ROWS": rows,
                                                                      "CLUSTER": cluster})
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    resident = spec.resident_blocks(a, b, c)  # whole clusters (a grid past it runs in more than one wave)
    assert resident % cluster == 0 and resident > 0, resident
    spec[(-(-n // (16 * FEW_ROWS["WARPS"])) * cluster,)](a, b, c)
    assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-2
    monkeypatch.setattr(gemm_module, "FEW_ROWS_IN_CLUSTERS", True)
    monkeypatch.setattr(gemm_module, "FEW_ROWS_LAST_BLOCK", False)  # (taken before the clusters)
    monkeypatch.setattr(gemm_module, "_PLANS", {})
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    for _ in range(2):  # the checked call, then the common call's plan
        gemm(a, b, trans_b=bool(trans_b), out=c)
        assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-2
        c.fill_(float("nan"))


@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (16, 4104, 8192), (27, 1000, 6000), (32, 8192, 2048)])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_few_rows_last_block(m: int, n: int, k: int, trans_b: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """FEW_ROWS_LAST_BLOCK: gemm() of up to 32 rows over a long K in one launch, the last of each block column's
    runs of K to arrive summing them (gemm_few_rows_last_kernel), three calls on fresh inputs into a poisoned out;
    the stream's counters left at zero."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    import importlib

    from tkc.kernels import gemm

    gemm_module = importlib.import_module("tkc.kernels.gemm")
    monkeypatch.setattr(gemm_module, "FEW_ROWS_LAST_BLOCK", True)
    monkeypatch.setattr(gemm_module, "_PLANS", {})
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        b = torch.randn(*((n, k) if trans_b else (k, n)), device="cuda").to(torch.bfloat16)
        ref = a.double() @ (b.double().t() if trans_b else b.double())
        gemm(a, b, trans_b=bool(trans_b), out=c)
        assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-2
        c.fill_(float("nan"))
    counters = importlib.import_module("tkc.kernels._checks").ARRIVAL_COUNTERS.values()
    assert counters and not any(count.any().item() for count in counters)


@pytest.mark.parametrize("switch, setting", [("FEW_ROWS_IN_CLUSTERS", "eager"), ("FEW_ROWS_LAST_BLOCK", "eager"),
                                             ("FEW_ROWS_LAST_BLOCK", True)])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_few_rows_one_launch_eager_and_captured(trans_b: int, switch: str, setting: object,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """FEW_ROWS_IN_CLUSTERS "eager" and FEW_ROWS_LAST_BLOCK: gemm() of 16 rows over a long K in one launch called
    eagerly, then captured in a CUDA graph (the two kernels, or with FEW_ROWS_LAST_BLOCK True the one launch on
    counters of the graph's own) and replayed on new inputs: right every way."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    import importlib

    from tkc.kernels import gemm

    gemm_module = importlib.import_module("tkc.kernels.gemm")
    monkeypatch.setattr(gemm_module, "FEW_ROWS_LAST_BLOCK", False)  # (taken before the clusters)
    monkeypatch.setattr(gemm_module, switch, setting)
    monkeypatch.setattr(gemm_module, "_PLANS", {})
    a = torch.randn(16, 4096, device="cuda").to(torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda").to(torch.bfloat16)

    def rel_err(c: torch.Tensor) -> float:
        ref = a.double() @ (b.double().t() if trans_b else b.double())
        return ((c.double() - ref).norm() / ref.norm()).item()

    for _ in range(2):  # the checked call, then the common call's plan
        assert rel_err(gemm(a, b, trans_b=bool(trans_b))) < 1e-2
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = gemm(a, b, trans_b=bool(trans_b))
    for _ in range(2):
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        c.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(c) < 1e-2


@pytest.mark.parametrize("cluster", [(2, 1), (4, 1), (4, 2)])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("m, n, k, producer, grid", [(1000, 1000, 1000, 0, None), (4096, 4096, 512, 0, 132),
                                                     (4200, 2000, 1000, 1, 66), (320, 520, 264, 0, 2)])
def test_gemm_in_clusters(trans_b: int, m: int, n: int, k: int, producer: int, grid: int | None,
                          cluster: tuple[int, int]) -> None:
    """gemm_sm90_kernel with CLUSTER=2 or 4 (B's slices multicast to the blocks stacked in M), or 2×2 tiles
    (CLUSTER=4, CLUSTER_N=2: A multicast to a row of them, B to a column), one block a tile or a persistent grid
    (odd stacks at m=4200 and n=2000: blocks past M's or N's end), also the grid the GPU holds (resident_blocks)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from tkc.kernels import gemm_sm90_kernel
    from tkc.kernels.gemm import CONFIG_SM90, persistent_grid

    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda").to(torch.bfloat16) if trans_b else torch.randn(k, n, device="cuda").to(torch.bfloat16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    size, cluster_n = cluster
    spec = gemm_sm90_kernel.specialize(target="sm_90a", **{**CONFIG_SM90[trans_b], "TRANS_B": trans_b,
                                                           "CLUSTER": size, "CLUSTER_N": cluster_n,
                                                           "PRODUCER": producer})
    resident = spec.resident_blocks(a, b, c)
    assert resident % size == 0 and 64 <= resident <= 132
    blocks = persistent_grid(m, n, 128, 256, max(size, min(grid or resident, resident)), size, cluster_n)[0]
    spec[(blocks,)](a, b, c)
    ref = a.double() @ (b.double().t() if trans_b else b.double())
    assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("via_shared", [0, 1])
def test_dsl_wgmma_register_a(trans_b: int, via_shared: int) -> None:
    """wgmma with A in registers (each warp's mma.sync A fragment), on the H200."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from hopper_kernels import register_a_gemm

    m, n, k = 320, 192, 200
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda").to(torch.bfloat16) if trans_b else torch.randn(k, n, device="cuda").to(torch.bfloat16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    register_a_gemm[(-(-m // 64), -(-n // 64))](a, b, c, TRANS_B=trans_b, VIA_SHARED=via_shared, target="sm_90a")
    ref = a.double() @ (b.double().t() if trans_b else b.double())
    assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("b, h, n, d, warps", [(2, 3, 256, 64, 4), (1, 4, 1024, 128, 8), (2, 2, 384, 128, 8),
                                              (2, 2, 384, 96, 8)])
def test_hopper_attention(b: int, h: int, n: int, d: int, warps: int, causal: int) -> None:
    """attention_sm90 on the H200 against torch's float32 attention."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from tkc.kernels import attention_sm90
    from tkc.kernels.attention import sm90_blocks

    q, k, v = (torch.randn(b, h, n, d, device="cuda").to(torch.bfloat16) for _ in range(3))
    o = torch.full_like(q, float("nan"))
    lse = torch.empty(1, 1, 1, device="cuda")
    attention_sm90[(sm90_blocks(b, h, n, warps),)](q, k, v, o, lse, d**-0.5, D=d, CAUSAL=causal, WARPS=warps, target="sm_90a")
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=bool(causal))
    assert ((o.double() - ref.double()).norm() / ref.double().norm()).item() < 1e-2


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("b, h, nq, nk, d", [(1, 2, 1, 1, 64), (2, 3, 17, 17, 128), (1, 2, 113, 1000, 64),
                                             (2, 2, 1000, 113, 128), (1, 4, 4097, 4097, 128)])
def test_hopper_attention_any_length(b: int, h: int, nq: int, nk: int, d: int, causal: int) -> None:
    """attention_sm90 at lengths that are not multiples of its tiles, Nq ≠ Nk (torch's causal convention)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from tkc.kernels import attention_sm90
    from tkc.kernels.attention import sm90_blocks

    q = torch.randn(b, h, nq, d, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(b, h, nk, d, device="cuda").to(torch.bfloat16) for _ in range(2))
    o = torch.full_like(q, float("nan"))
    lse = torch.empty(1, 1, 1, device="cuda")
    attention_sm90[(sm90_blocks(b, h, nq, 8),)](q, k, v, o, lse, d**-0.5, D=d, CAUSAL=causal, WARPS=8, target="sm_90a")
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=bool(causal))
    assert not o.isnan().any()
    assert ((o.double() - ref.double()).norm() / ref.double().norm()).item() < 1e-2


# (B, H, Nq, Nk, D): lengths of one row, of no whole tile, Nq ≠ Nk both ways, B·H above the SM count, each of
# attention()'s configurations (D=64 causal 2048 ≤ Nk < 4096: four query blocks a block)
ATTENTION_SHAPES = [(1, 1, 1, 1, 64), (2, 3, 17, 17, 128), (1, 2, 113, 113, 64), (1, 2, 113, 1000, 128),
                    (2, 2, 1000, 113, 64), (1, 4, 1000, 1000, 128), (1, 2, 4097, 4097, 64), (1, 2, 4097, 4097, 128),
                    (2, 16, 512, 512, 128), (1, 1, 64, 4096, 128), (3, 5, 200, 300, 64), (160, 1, 128, 128, 64),
                    (1, 8, 2048, 1024, 128), (2, 3, 2100, 2100, 64), (1, 2, 1000, 3000, 64), (1, 1, 1, 1, 96),
                    (2, 3, 17, 100, 96), (1, 4, 1000, 1000, 96), (1, 2, 4097, 4097, 96), (2, 16, 512, 512, 96),
                    (1, 1, 1, 1, 256), (2, 3, 17, 100, 256), (1, 4, 1000, 1000, 256), (1, 2, 4097, 4097, 256),
                    (2, 16, 512, 512, 256), (140, 1, 128, 128, 256), (1, 2, 1000, 3000, 256)]


def _lse_ref(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril().logical_not(), -torch.inf)
    return torch.logsumexp(s, dim=-1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, h, nq, nk, d", ATTENTION_SHAPES)
def test_attention_entry_point_on_hopper(b: int, h: int, nq: int, nk: int, d: int, causal: bool) -> None:
    """tkc.kernels.attention on the H200 (attention_sm90) against torch's float32 SDPA, with the log-sum-exp:
    fresh inputs, outputs poisoned first (a NaN fails), torch's causal convention for Nq ≠ Nk."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from tkc.kernels import attention

    q = torch.randn(b, h, nq, d, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(b, h, nk, d, device="cuda").to(torch.bfloat16) for _ in range(2))
    out = torch.full_like(q, float("nan"))
    got, lse = attention(q, k, v, causal=causal, out=out, return_lse=True)
    assert got is out and lse.shape == (b, h, nq) and lse.dtype == torch.float32
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    assert not out.isnan().any() and not lse.isnan().any()
    assert ((out.double() - ref.double()).norm() / ref.double().norm()).item() < 1e-2
    ref_lse = _lse_ref(q, k, d**-0.5, causal)
    assert ((lse.double() - ref_lse.double()).norm() / ref_lse.double().norm()).item() < 1e-4


def test_attention_entry_point_strided_heads() -> None:
    """q, k, v as (B, N, H, D) tensors seen as (B, H, N, D) (a transpose, no copy): the TMA maps take the strides."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from tkc.kernels import attention

    q, k, v = (torch.randn(2, 300, 4, 128, device="cuda").to(torch.bfloat16).transpose(1, 2) for _ in range(3))
    out = attention(q, k, v, causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert ((out.double() - ref.double()).norm() / ref.double().norm()).item() < 1e-2


@pytest.mark.parametrize("config", [{"D": 128, "KEYS": 128, "PINGPONG": 1}, {"D": 64, "KEYS": 64, "PINGPONG": 1},
                                    {"D": 128, "KEYS": 64, "OVERLAP": 1, "STAGES": 2},
                                    {"D": 64, "KEYS": 64, "OVERLAP": 1},
                                    {"D": 128, "KEYS": 64, "OVERLAP": 1, "PINGPONG": 1},
                                    {"D": 128, "KEYS": 128, "DEFER": 1, "PRODUCER": 1}, {"D": 64, "KEYS": 64, "DEFER": 1},
                                    {"D": 128, "KEYS": 128, "DEFER": 1, "PINGPONG": 1},
                                    {"D": 128, "KEYS": 128, "DEFER": 1, "PRODUCER": 1, "PINGPONG": 1, "Q_REGS": 1},
                                    {"D": 64, "KEYS": 128, "WARPS": 12, "DEFER": 1, "PRODUCER": 1},
                                    {"D": 128, "KEYS": 128, "DEFER": 1, "PRODUCER": 1, "Q_REGS": 1, "TILES": 2},
                                    {"D": 64, "KEYS": 64, "TILES": 3},
                                    {"D": 128, "KEYS": 128, "DEFER": 1, "PRODUCER": 1, "Q_REGS": 1, "PINGPONG": 1,
                                     "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 128, "WARPS": 12, "DEFER": 1, "PRODUCER": 1, "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 64, "PERSISTENT": 1},
                                    {"D": 128, "KEYS": 128, "DEFER": 2, "PRODUCER": 1, "Q_REGS": 1, "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 128, "WARPS": 12, "DEFER": 2, "PRODUCER": 1, "TILES": 2},
                                    {"D": 64, "KEYS": 128, "DEFER": 2, "PRODUCER": 1, "Q_REGS": 1, "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 128, "DEFER": 2, "PRODUCER": 1, "Q_REGS": 1, "TILES": 3},
                                    {"D": 128, "KEYS": 128, "DEFER": 3, "PRODUCER": 1, "Q_REGS": 1, "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 128, "DEFER": 3, "PRODUCER": 1, "Q_REGS": 1, "TILES": 3},
                                    {"D": 128, "KEYS": 128, "DEFER": 4, "PRODUCER": 1, "Q_REGS": 1, "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 128, "DEFER": 4, "PRODUCER": 1, "Q_REGS": 1, "TILES": 3},
                                    {"D": 64, "KEYS": 128, "DEFER": 2, "PRODUCER": 1, "Q_REGS": 1, "PINGPONG": 1,
                                     "PERSISTENT": 1},
                                    {"D": 128, "KEYS": 128, "DEFER": 3, "PRODUCER": 1, "Q_REGS": 1, "PINGPONG": 1,
                                     "TILES": 2},
                                    {"D": 64, "KEYS": 128, "DEFER": 2, "PRODUCER": 1, "Q_REGS": 1, "EXP2_POLY": 4,
                                     "TILES": 3},
                                    {"D": 64, "KEYS": 64, "DEFER": 1, "OVERLAP": 1, "PRODUCER": 1, "Q_REGS": 1,
                                     "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 64, "DEFER": 1, "OVERLAP": 1, "PRODUCER": 1, "Q_REGS": 1,
                                     "TILES": 3},
                                    {"D": 128, "KEYS": 64, "DEFER": 1, "OVERLAP": 1, "PRODUCER": 1, "Q_REGS": 1,
                                     "TILES": 2},
                                    {"D": 64, "KEYS": 128, "DEFER": 2, "PRODUCER": 1, "Q_REGS": 1, "TMA_STORE": 1,
                                     "PERSISTENT": 1},
                                    {"D": 128, "KEYS": 64, "DEFER": 1, "OVERLAP": 1, "PRODUCER": 1, "Q_REGS": 1,
                                     "TMA_STORE": 1, "TILES": 2},
                                    {"D": 64, "KEYS": 128, "DEFER": 2, "PRODUCER": 1, "Q_REGS": 1, "SKIP_RESCALE": 1,
                                     "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 64, "DEFER": 1, "OVERLAP": 1, "PRODUCER": 1, "Q_REGS": 1,
                                     "SKIP_RESCALE": 1, "TILES": 2},
                                    {"D": 64, "KEYS": 128, "DEFER": 1, "OVERLAP": 1, "PRODUCER": 2, "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 128, "DEFER": 1, "OVERLAP": 1, "PRODUCER": 2, "TMA_STORE": 1,
                                     "TILES": 2},
                                    {"D": 128, "KEYS": 128, "DEFER": 3, "PRODUCER": 2, "Q_REGS": 1, "PINGPONG": 1,
                                     "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 128, "DEFER": 2, "PRODUCER": 1, "Q_REGS": 1, "ROWSUM_MMA": 1,
                                     "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 128, "DEFER": 1, "PRODUCER": 1, "Q_REGS": 1, "ROWSUM_MMA": 1,
                                     "TILES": 2},
                                    {"D": 64, "KEYS": 128, "WARPS": 4, "DEFER": 2, "PRODUCER": 2, "Q_REGS": 1,
                                     "BLOCKS": 2, "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 128, "WARPS": 4, "DEFER": 3, "PRODUCER": 2, "Q_REGS": 1,
                                     "BLOCKS": 2, "TILES": 2},
                                    {"D": 64, "KEYS": 128, "DEFER": 2, "PRODUCER": 2, "Q_REGS": 1, "LATE_SUMS": 1,
                                     "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 128, "DEFER": 2, "PRODUCER": 2, "Q_REGS": 1, "STAGGER": 2,
                                     "STAGES": 4, "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 128, "DEFER": 3, "PRODUCER": 1, "Q_REGS": 1, "STAGGER": 1,
                                     "LATE_SUMS": 1, "TILES": 2},
                                    {"D": 128, "KEYS": 128, "DEFER": 3, "PRODUCER": 1, "Q_REGS": 1, "LATE_SUMS": 1,
                                     "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 128, "DEFER": 2, "PRODUCER": 1, "Q_REGS": 1, "LATE_SUMS": 1,
                                     "LATE_PV": 1, "PERSISTENT": 1},
                                    {"D": 64, "KEYS": 128, "WARPS": 12, "DEFER": 1, "PRODUCER": 1, "LATE_SUMS": 1,
                                     "LATE_PV": 1, "PERSISTENT": 1}])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("nq, nk", [(1000, 1000), (257, 4097), (4096, 4096)])
def test_hopper_attention_scheduling_variants(config: dict, causal: int, nq: int, nk: int) -> None:
    """attention_sm90 with ping-pong warpgroups, the early Q·Kᵀ (overlap) or P·V deferred (with a producer
    warpgroup), several query blocks per block or a persistent grid on the H200: same answers."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from tkc.kernels.attention import launch_sm90

    d = config["D"]
    q = torch.randn(2, 3, nq, d, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(2, 3, nk, d, device="cuda").to(torch.bfloat16) for _ in range(2))
    o, lse = torch.full_like(q, float("nan")), torch.full((2, 3, nq), float("nan"), device="cuda")
    launch_sm90(q, k, v, o, lse, d**-0.5, {"WARPS": 8, **config}, causal=bool(causal), return_lse=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=bool(causal))
    assert not o.isnan().any() and not lse.isnan().any()
    assert ((o.double() - ref.double()).norm() / ref.double().norm()).item() < 1e-2
    ref_lse = _lse_ref(q, k, d**-0.5, bool(causal))
    assert ((lse.double() - ref_lse.double()).norm() / ref_lse.double().norm()).item() < 1e-4
