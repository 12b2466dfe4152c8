"""Clusters of two blocks sharing B's slices by TMA multicast (gemm_sm90_kernel's and scaled_mm_kernel's CLUSTER=2)
beside what gemm() / scaled_mm() launch and cuBLAS / cuBLASLt, interleaved: TFLOP/s and the ratio to cuBLAS. Each
candidate runs on a persistent grid of the blocks the GPU holds (for clusters: the clusters it places at once, two
blocks each), every output checked first. The question it answers: do the blocks contend for L2 → shared memory
bandwidth (docs/hopper-pipeline.md, "Measured": 4.85 TFLOP/s a block on 132 blocks, 6.08 on 33), so that halving
B's copies pays?

    python bench/probe_cluster.py [--sizes 4096 8192] [--shapes 8192x8192x1024 4096x14336x4096] [--rounds 3]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import check_outputs, compare, print_rates  # noqa: E402

from tkc.kernels import gemm, scaled_mm  # noqa: E402
from tkc.kernels.gemm import CONFIG_SM90, gemm_sm90_kernel, persistent_grid  # noqa: E402
from tkc.kernels.scaled_mm import CONFIG as FP8_CONFIG  # noqa: E402
from tkc.kernels.scaled_mm import scaled_mm_kernel  # noqa: E402

BF16_CANDIDATES = {  # on top of CONFIG_SM90 (128×256 tiles, BK=64, 3 stages, TMA stores); CLUSTER=1 ones: controls
    "cluster2": {"CLUSTER": 2},
    "cluster2 G4": {"CLUSTER": 2, "GROUP_M": 4},
    "cluster2 producer": {"CLUSTER": 2, "PRODUCER": 1},
    "cluster1": {},  # CONFIG_SM90 launched directly (the control)
    "cluster1 no producer": {"PRODUCER": 0},  # gemm()'s configuration before the producer (one-wave products)
    "cluster1 producer": {"PRODUCER": 1},  # the short-K shapes: fp8 gained 13 % from a producer alone (2026-12-05 03:00)
    "cluster1 producer G16": {"PRODUCER": 1, "GROUP_M": 16},
    "cluster2 producer G16": {"CLUSTER": 2, "PRODUCER": 1, "GROUP_M": 16},
    "cluster1 G16": {"GROUP_M": 16},
    "cluster1 4st direct": {"STAGES": 4, "TMA_STORE": 0},
    "cluster2 4st direct": {"CLUSTER": 2, "STAGES": 4, "TMA_STORE": 0},
    "cluster2 4st direct producer": {"CLUSTER": 2, "STAGES": 4, "TMA_STORE": 0, "PRODUCER": 1},
    "cluster1 BK32 6st": {"BK": 32, "STAGES": 6},
    "cluster2 BK32 6st": {"CLUSTER": 2, "BK": 32, "STAGES": 6},
    "cluster4 producer": {"CLUSTER": 4, "PRODUCER": 1},  # B's 256-row slices a quarter each (simulated, 2026-12-05)
    "cluster4 BK32 6st": {"CLUSTER": 4, "BK": 32, "STAGES": 6},
    "cluster2x2 producer": {"CLUSTER": 4, "CLUSTER_N": 2, "PRODUCER": 1},  # A to a row of tiles, B to a column
}
FP8_CANDIDATES = {  # on top of scaled_mm's CONFIG (128×256 tiles, BK=128, 3 stages, clusters of 2, a producer)
    "fp8 neither (was shipped)": {"CLUSTER": 1, "PRODUCER": 0},
    "fp8 producer": {"CLUSTER": 1, "PRODUCER": 1},
    "fp8 cluster2": {"CLUSTER": 2},
    "fp8 cluster2 producer": {"CLUSTER": 2, "PRODUCER": 1},
    "fp8 cluster2 producer G16": {"CLUSTER": 2, "PRODUCER": 1, "GROUP_M": 16},
    "fp8 cluster2 producer 4st direct": {"CLUSTER": 2, "PRODUCER": 1, "STAGES": 4, "TMA_STORE": 0},
    "fp8 cluster4 producer": {"CLUSTER": 4, "PRODUCER": 1},
    "fp8 cluster2x2 producer": {"CLUSTER": 4, "CLUSTER_N": 2, "PRODUCER": 1},
}


def grid_of(spec, call, m: int, n: int, cfg: dict) -> tuple[int, int, int]:
    """What gemm() / scaled_mm() launch: at most the blocks the GPU holds, whole clusters of stacked tiles."""
    return persistent_grid(m, n, 16 * cfg["WARPS"], cfg["BN"], spec.resident_blocks(*call), cfg.get("CLUSTER", 1),
                           cfg.get("CLUSTER_N", 1))


def bf16_case(m: int, n: int, k: int, trans_b: bool, rounds: int, only: str) -> None:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) if trans_b else torch.randn(k, n, device="cuda",
                                                                                             dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    impls = {"gemm()": lambda: gemm(a, b, trans_b=trans_b),
             "cuBLAS": lambda: torch.matmul(a, b.t() if trans_b else b)}
    for name, extra in BF16_CANDIDATES.items():
        if only and not re.search(only, name):
            continue
        cfg = {**CONFIG_SM90[int(trans_b)], "TRANS_B": int(trans_b), **extra}
        spec = gemm_sm90_kernel.specialize(target="sm_90a", **cfg)
        grid = grid_of(spec, (a, b, out), m, n, cfg)
        impls[name] = lambda spec=spec, grid=grid: spec[grid](a, b, out) or out
    check_outputs(impls, impls["cuBLAS"]().float(), where=f"{m}x{n}x{k}")
    print_rates(f"bf16 {m}x{n}x{k} trans_b={int(trans_b)}", compare(impls, rounds), 2 * m * n * k, peers=("cuBLAS",))


def fp8_impls(m: int, n: int, k: int, candidates: dict[str, dict]) -> dict:
    """scaled_mm(), cuBLASLt and scaled_mm_kernel with each candidate's constants (on top of CONFIG) on fresh e4m3
    operands, per-tensor scales, bf16 out."""
    a = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    weight = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    impls = {"scaled_mm()": lambda: scaled_mm(a, weight.t(), one, one),
             "cuBLASLt": lambda: torch._scaled_mm(a, weight.t(), one, one, out_dtype=torch.bfloat16)}
    for name, extra in candidates.items():
        cfg = {**FP8_CONFIG, **extra}
        spec = scaled_mm_kernel.specialize(target="sm_90a", **cfg)
        call = (a, weight, one.reshape(1), one.reshape(1), out[0], out)  # (a row of out: the unread bias)
        grid = grid_of(spec, call, m, n, cfg)
        impls[name] = lambda spec=spec, grid=grid, call=call: spec[grid](*call) or out
    return impls


def fp8_case(m: int, n: int, k: int, rounds: int, only: str) -> None:
    impls = fp8_impls(m, n, k, {name: cfg for name, cfg in FP8_CANDIDATES.items() if not only or re.search(only, name)})
    check_outputs(impls, impls["cuBLASLt"]().float(), where=f"fp8 {m}x{n}x{k}")
    print_rates(f"fp8 {m}x{n}x{k}", compare(impls, rounds), 2 * m * n * k, peers=("cuBLASLt",))


def small_calls() -> None:
    """Where a short fp8 call's time goes: each way event-timed back to back (host included) and from a CUDA graph
    (the GPU alone), scaled_mm() and its kernel with and without clusters (a cluster launch may cost more)."""
    from common import graph_time_ms, time_ms

    for m, n, k in ((2048, 2048, 2048), (4096, 4096, 4096), (16, 8192, 8192)):
        kernels = {"kernel, cluster2 producer": {}, "kernel, neither": {"CLUSTER": 1, "PRODUCER": 0}}
        impls = fp8_impls(m, n, k, kernels if m > 32 else {})
        for name, fn in impls.items():
            print(f"fp8 {m}x{n}x{k} {name:28s} {time_ms(fn) * 1e3:7.1f} µs back to back, "
                  f"{graph_time_ms(fn) * 1e3:7.1f} µs in a graph", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="*", default=[4096, 8192])
    parser.add_argument("--shapes", nargs="*", default=["8192x8192x1024", "4096x14336x4096"], help="MxNxK")
    parser.add_argument("--only", default="", help="a regex: only the candidates it finds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-fp8", action="store_true")
    parser.add_argument("--no-bf16", action="store_true")
    parser.add_argument("--small", action="store_true", help="only where short fp8 calls spend their time")
    args = parser.parse_args()
    if args.small:
        small_calls()
        return
    shapes = [(s, s, s) for s in args.sizes] + [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    for m, n, k in shapes:
        for trans_b in () if args.no_bf16 else (False, True):
            bf16_case(m, n, k, trans_b, args.rounds, args.only)
        if not args.no_fp8:
            fp8_case(m, n, k, args.rounds, args.only)


if __name__ == "__main__":
    main()
