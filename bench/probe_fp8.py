"""scaled_mm_kernel configurations beside scaled_mm(), torch._scaled_mm (cuBLASLt) and bf16 cuBLAS: TFLOP/s and
the ratio to cuBLASLt, per-tensor scales, every output checked against cuBLASLt's first. Candidates differ in
the tile (rows: 16·WARPS, BN), the ring's depth, a producer warpgroup and the grouping of tiles; each runs on a
persistent grid of at most the blocks the GPU holds.

    python bench/probe_fp8.py [--sizes 4096 8192] [--few-rows 1 16 32] [--nk 4096 8192] [--only REGEX] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import check_outputs, compare, print_rates, with_settings  # noqa: E402

from tkc.kernels import scaled_mm  # noqa: E402
from tkc.kernels._checks import cdiv  # noqa: E402
from tkc.kernels.gemm import gemm_few_rows_kernel  # noqa: E402
from tkc.kernels.scaled_mm import SUM_SCALED, scaled_mm_kernel, sum_scaled_splits_kernel  # noqa: E402
from tkc.lang import fp8e4m3  # noqa: E402

CANDIDATES = {  # every one fits the 227 KB of shared memory and assembles without spills (CPU: test_scaled_mm.py)
    "W8 BN=256 3st (shipped)": {"WARPS": 8, "BN": 256, "STAGES": 3},
    "W8 BN=256 3st producer": {"WARPS": 8, "BN": 256, "STAGES": 3, "PRODUCER": 1},
    "W8 BN=256 2st": {"WARPS": 8, "BN": 256, "STAGES": 2},
    "W8 BN=256 3st G16": {"WARPS": 8, "BN": 256, "STAGES": 3, "GROUP_M": 16},
    "W8 BN=128 4st": {"WARPS": 8, "BN": 128, "STAGES": 4},
    "W8 BN=128 6st producer": {"WARPS": 8, "BN": 128, "STAGES": 6, "PRODUCER": 1},
    "W12 BN=256 3st no TMA store": {"WARPS": 12, "BN": 256, "STAGES": 3, "TMA_STORE": 0},
    "W4 BN=256 4st": {"WARPS": 4, "BN": 256, "STAGES": 4},
}

# scaled_mm()'s few-rows path (a few tokens times a weight): gemm_few_rows_kernel with fp8 operands over SPLITS runs
# of K, then sum_scaled_splits_kernel; each timed end to end (both launches), in a CUDA graph too
FEW_ROWS_CANDIDATES = {
    "FR W8 5st x2": {"WARPS": 8, "STAGES": 5, "SPLITS": 2},
    "FR W8 5st x4": {"WARPS": 8, "STAGES": 5, "SPLITS": 4},
    "FR W4 4st x2": {"WARPS": 4, "STAGES": 4, "SPLITS": 2},
    "FR W4 4st x4": {"WARPS": 4, "STAGES": 4, "SPLITS": 4},
    "FR W8 BK=256 3st x2": {"WARPS": 8, "STAGES": 3, "SPLITS": 2, "BK": 256},
}


def few_rows(m: int, nk: int, rounds: int, only: str) -> None:
    """M = m rows times an nk × nk weight: scaled_mm() and the few-rows candidates beside cuBLASLt (event-timed and
    from a CUDA graph: the GPU's time, these calls being short)."""
    from common import graph_time_ms

    a = (torch.randn(m, nk, device="cuda") * 2).to(torch.float8_e4m3fn)
    weight = (torch.randn(nk, nk, device="cuda") * 2).to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    out = torch.empty(m, nk, device="cuda", dtype=torch.bfloat16)
    impls = {"scaled_mm()": lambda: scaled_mm(a, weight.t(), one, one),
             "cuBLASLt": lambda: torch._scaled_mm(a, weight.t(), one, one, out_dtype=torch.bfloat16)}
    # scaled_mm() with its few rows in two kernels (gemm_few_rows_kernel, then sum_scaled_splits_kernel) eagerly too
    impls["scaled_mm(), two kernels"] = with_settings(importlib.import_module("tkc.kernels.gemm"),
                                                      {"FEW_ROWS_LAST_BLOCK": False}, impls["scaled_mm()"],
                                                      (importlib.import_module("tkc.kernels.scaled_mm"),))
    for name, cfg in FEW_ROWS_CANDIDATES.items():
        if only and not re.search(only, name):
            continue
        splits, cfg = cfg["SPLITS"], {"BK": 128, "ROTATE": 1, **{k: v for k, v in cfg.items() if k != "SPLITS"}}
        part = gemm_few_rows_kernel.specialize(target="sm_90a", TRANS_B=1, ROWS=16 if m <= 16 else 32,
                                               DT=fp8e4m3, **cfg)
        total = sum_scaled_splits_kernel.specialize(target="sm_90a", **SUM_SCALED)
        partial = torch.empty(splits, m, nk, device="cuda")

        def run(part=part, total=total, partial=partial, splits=splits, warps=cfg["WARPS"]):
            part[(cdiv(nk, 16 * warps), splits)](a, weight, partial)
            total[(cdiv(m, 16), cdiv(nk, SUM_SCALED["COLS"] * SUM_SCALED["WARPS"]))](partial, one.reshape(1),
                                                                                      one.reshape(1), out[0], out)
            return out
        impls[name] = run
    check_outputs(impls, impls["cuBLASLt"]().float(), where=f"M={m} N=K={nk}")
    times = compare(impls, rounds)
    flops = 2 * m * nk * nk
    print(f"M={m} N=K={nk}: µs event-timed (graph), cuBLASLt / this", flush=True)
    for name, ms in times.items():
        graph = graph_time_ms(impls[name])
        print(f"  {name:22s} {ms * 1e3:7.1f} ({graph * 1e3:7.1f})  {times['cuBLASLt'] / ms:.2f}  "
              f"{flops / ms / 1e9:6.0f} TFLOP/s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="*", default=[4096, 8192])
    parser.add_argument("--only", default="", help="a regex: only the candidates it finds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--few-rows", type=int, nargs="*", default=[1, 16, 32], help="rows of a for the few-rows probe")
    parser.add_argument("--nk", type=int, nargs="*", default=[4096, 8192], help="N = K for the few-rows probe")
    args = parser.parse_args()
    for m in args.few_rows:
        for nk in args.nk:
            few_rows(m, nk, args.rounds, args.only)
    for n in args.sizes:
        a = (torch.randn(n, n, device="cuda") * 2).to(torch.float8_e4m3fn)
        weight = (torch.randn(n, n, device="cuda") * 2).to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        a16, w16 = a.to(torch.bfloat16), weight.to(torch.bfloat16)
        out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        impls = {"scaled_mm()": lambda: scaled_mm(a, weight.t(), one, one),
                 "cuBLASLt": lambda: torch._scaled_mm(a, weight.t(), one, one, out_dtype=torch.bfloat16),
                 "bf16 cuBLAS": lambda: torch.matmul(a16, w16.t())}
        for name, cfg in CANDIDATES.items():
            if args.only and not re.search(args.only, name):
                continue
            cfg = {"BK": 128, "TMA_STORE": 1, **cfg}
            spec = scaled_mm_kernel.specialize(target="sm_90a", **cfg)
            call = (a, weight, one.reshape(1), one.reshape(1), out[0], out)  # (a row of out: the unread bias)
            grid = (min(cdiv(n, 16 * cfg["WARPS"]) * cdiv(n, cfg["BN"]), spec.resident_blocks(*call)),)
            impls[name] = lambda spec=spec, grid=grid, call=call: spec[grid](*call) or out
        check_outputs(impls, impls["cuBLASLt"]().float(), where=f"{n}³")
        print_rates(f"{n}³", compare(impls, args.rounds), 2 * n**3, peers=("cuBLASLt",))


if __name__ == "__main__":
    main()
