"""gemm() on skinny products (inference: M = a few rows of tokens, N = K = the model width) beside gemm_sm90_kernel
configurations with smaller tiles (more blocks for the SMs), split along K (gemm_split_k_kernel, then
sum_splits_kernel), with the operands' roles swapped (gemm_few_rows_kernel), and cuBLAS. µs a call (event-timed back to back, and in a CUDA graph) and the ratio to cuBLAS,
median of 30 launches; every output checked against a float32 reference first.
    python bench/probe_skinny.py [--m 16 64 128 256 512] [--nk 4096 8192] [--trans-b 1] [--only REGEX]"""
import argparse
import importlib
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import graph_time_ms, rel_err, time_ms, with_settings  # noqa: E402

from tkc.kernels import gemm, gemm_sm90_kernel  # noqa: E402
from tkc.kernels.gemm import GRID_LIMIT, persistent_grid  # noqa: E402
from tkc.kernels.gemm import gemm_few_rows_cluster_kernel, gemm_few_rows_kernel, gemm_split_k_kernel, sum_splits_kernel  # noqa: E402
from tkc.kernels._checks import cdiv  # noqa: E402

gemm_module = importlib.import_module("tkc.kernels.gemm")  # the module (tkc.kernels.gemm is the function)

CANDIDATES = {
    "W4 BN=256": {"WARPS": 4, "BN": 256, "BK": 64, "STAGES": 4},
    "W4 BN=128": {"WARPS": 4, "BN": 128, "BK": 64, "STAGES": 4},
    "W4 BN=64": {"WARPS": 4, "BN": 64, "BK": 64, "STAGES": 6},
    "W4 BN=64 BK=128": {"WARPS": 4, "BN": 64, "BK": 128, "STAGES": 4},
    "W8 BN=128": {"WARPS": 8, "BN": 128, "BK": 64, "STAGES": 4},
    # more bytes in flight per SM for few rows and a long K (two blocks an SM, or deeper rings): not yet measured
    "W4 BN=32 BK=128": {"WARPS": 4, "BN": 32, "BK": 128, "STAGES": 4},
    "W4 BN=64 BK=128 6 stages": {"WARPS": 4, "BN": 64, "BK": 128, "STAGES": 6},
    "W4 BN=64 8 stages": {"WARPS": 4, "BN": 64, "BK": 64, "STAGES": 8},
    # clusters of tiles stacked in M sharing B's slices by TMA multicast (B read from L2 once per cluster, not
    # once per tile): 128 / 256 rows in 64- or 128-row tiles
    "C2 W4 BN=128": {"WARPS": 4, "BN": 128, "BK": 64, "STAGES": 4, "CLUSTER": 2},
    "C2 W4 BN=64 6st": {"WARPS": 4, "BN": 64, "BK": 64, "STAGES": 6, "CLUSTER": 2},
    "C2 W4 BN=128 producer": {"WARPS": 4, "BN": 128, "BK": 64, "STAGES": 4, "CLUSTER": 2, "PRODUCER": 1},
    "C4 W4 BN=128": {"WARPS": 4, "BN": 128, "BK": 64, "STAGES": 4, "CLUSTER": 4},
    "C4 W4 BN=64 6st": {"WARPS": 4, "BN": 64, "BK": 64, "STAGES": 6, "CLUSTER": 4},
    "C2 W8 BN=128": {"WARPS": 8, "BN": 128, "BK": 64, "STAGES": 4, "CLUSTER": 2},
    "C2 W8 BN=64 6st": {"WARPS": 8, "BN": 64, "BK": 64, "STAGES": 6, "CLUSTER": 2},
}
# gemm_split_k_kernel (grid: tiles × SPLITS, f32 partial sums) then sum_splits_kernel
SPLIT_K = {
    "SK BN=64 BK=128 6st x1": {"WARPS": 4, "BN": 64, "BK": 128, "STAGES": 6, "SPLITS": 1},
    "SK BN=64 BK=128 6st x1 rot": {"WARPS": 4, "BN": 64, "BK": 128, "STAGES": 6, "SPLITS": 1, "ROTATE": 1},
    "SK BN=64 BK=128 x2": {"WARPS": 4, "BN": 64, "BK": 128, "STAGES": 4, "SPLITS": 2},
    "SK BN=64 BK=128 x2 rot": {"WARPS": 4, "BN": 64, "BK": 128, "STAGES": 4, "SPLITS": 2, "ROTATE": 1},
    "SK BN=128 BK=64 6st x2": {"WARPS": 4, "BN": 128, "BK": 64, "STAGES": 6, "SPLITS": 2},
    "SK BN=128 BK=64 6st x2 rot": {"WARPS": 4, "BN": 128, "BK": 64, "STAGES": 6, "SPLITS": 2, "ROTATE": 1},
    "SK BN=128 BK=64 6st x4": {"WARPS": 4, "BN": 128, "BK": 64, "STAGES": 6, "SPLITS": 4},
    "SK BN=128 BK=64 6st x4 rot": {"WARPS": 4, "BN": 128, "BK": 64, "STAGES": 6, "SPLITS": 4, "ROTATE": 1},
    "SK BN=128 BK=128 x2": {"WARPS": 4, "BN": 128, "BK": 128, "STAGES": 4, "SPLITS": 2},
    "SK BN=128 BK=128 x2 rot": {"WARPS": 4, "BN": 128, "BK": 128, "STAGES": 4, "SPLITS": 2, "ROTATE": 1},
    "SK BN=256 BK=64 x4": {"WARPS": 4, "BN": 256, "BK": 64, "STAGES": 4, "SPLITS": 4},
    "SK BN=256 BK=64 x4 rot": {"WARPS": 4, "BN": 256, "BK": 64, "STAGES": 4, "SPLITS": 4, "ROTATE": 1},
    # 128-row tiles (M = 128-256: B read once per 128 rows)
    "SK W8 BN=128 BK=64 4st x2 rot": {"WARPS": 8, "BN": 128, "BK": 64, "STAGES": 4, "SPLITS": 2, "ROTATE": 1},
    "SK W8 BN=128 BK=64 4st x4 rot": {"WARPS": 8, "BN": 128, "BK": 64, "STAGES": 4, "SPLITS": 4, "ROTATE": 1},
    "SK W8 BN=256 BK=64 3st x2 rot": {"WARPS": 8, "BN": 256, "BK": 64, "STAGES": 3, "SPLITS": 2, "ROTATE": 1},
    "SK W8 BN=256 BK=64 3st x4 rot": {"WARPS": 8, "BN": 256, "BK": 64, "STAGES": 3, "SPLITS": 4, "ROTATE": 1},
}

# gemm_few_rows_kernel (A·Bᵀ as B·Aᵀ, A of at most ROWS rows; grid: blocks of 16·WARPS rows of B × runs of K), then
# sum_splits_kernel
FEW_ROWS = {
    "FR W4 BK=128 8st x1": {"WARPS": 4, "BK": 128, "STAGES": 8, "SPLITS": 1},
    "FR W4 BK=128 8st x2": {"WARPS": 4, "BK": 128, "STAGES": 8, "SPLITS": 2},
    "FR W4 BK=128 8st x4": {"WARPS": 4, "BK": 128, "STAGES": 8, "SPLITS": 4},
    "FR W4 BK=128 4st x2": {"WARPS": 4, "BK": 128, "STAGES": 4, "SPLITS": 2},
    "FR W4 BK=128 4st x4": {"WARPS": 4, "BK": 128, "STAGES": 4, "SPLITS": 4},
    "FR W8 BK=128 5st x1": {"WARPS": 8, "BK": 128, "STAGES": 5, "SPLITS": 1},
    "FR W8 BK=128 5st x2": {"WARPS": 8, "BK": 128, "STAGES": 5, "SPLITS": 2},
    "FR W8 BK=128 5st x4": {"WARPS": 8, "BK": 128, "STAGES": 5, "SPLITS": 4},
    # A of up to 32 / 64 rows (the wgmma's N)
    "FR32 W4 BK=128 4st x2": {"ROWS": 32, "WARPS": 4, "BK": 128, "STAGES": 4, "SPLITS": 2},
    "FR32 W4 BK=128 4st x4": {"ROWS": 32, "WARPS": 4, "BK": 128, "STAGES": 4, "SPLITS": 4},
    "FR32 W8 BK=128 5st x2": {"ROWS": 32, "WARPS": 8, "BK": 128, "STAGES": 5, "SPLITS": 2},
    "FR32 W8 BK=128 5st x4": {"ROWS": 32, "WARPS": 8, "BK": 128, "STAGES": 5, "SPLITS": 4},
    "FR64 W4 BK=128 4st x2": {"ROWS": 64, "WARPS": 4, "BK": 128, "STAGES": 4, "SPLITS": 2},
    "FR64 W4 BK=128 4st x4": {"ROWS": 64, "WARPS": 4, "BK": 128, "STAGES": 4, "SPLITS": 4},
    "FR64 W8 BK=128 4st x2": {"ROWS": 64, "WARPS": 8, "BK": 128, "STAGES": 4, "SPLITS": 2},
    "FR64 W8 BK=128 4st x4": {"ROWS": 64, "WARPS": 8, "BK": 128, "STAGES": 4, "SPLITS": 4},
    "FR64 W8 BK=64 6st x2": {"ROWS": 64, "WARPS": 8, "BK": 64, "STAGES": 6, "SPLITS": 2},
    "FR128 W8 BK=64 4st x1": {"ROWS": 128, "WARPS": 8, "BK": 64, "STAGES": 4, "SPLITS": 1},
    "FR128 W8 BK=64 4st x2": {"ROWS": 128, "WARPS": 8, "BK": 64, "STAGES": 4, "SPLITS": 2},
    "FR128 W4 BK=64 4st x2": {"ROWS": 128, "WARPS": 4, "BK": 64, "STAGES": 4, "SPLITS": 2},
}

# gemm_few_rows_cluster_kernel: the runs of K of a block column as a cluster of CLUSTER blocks summing in
# distributed shared memory (one launch, no workspace)
FEW_ROWS_CLUSTER = {
    "FRC W8 BK=128 5st x2": {"WARPS": 8, "BK": 128, "STAGES": 5, "CLUSTER": 2},
    "FRC W8 BK=128 5st x4": {"WARPS": 8, "BK": 128, "STAGES": 5, "CLUSTER": 4},
    "FRC32 W8 BK=128 5st x2": {"ROWS": 32, "WARPS": 8, "BK": 128, "STAGES": 5, "CLUSTER": 2},
    "FRC32 W8 BK=128 5st x4": {"ROWS": 32, "WARPS": 8, "BK": 128, "STAGES": 5, "CLUSTER": 4},
    "FRC64 W8 BK=128 4st x2": {"ROWS": 64, "WARPS": 8, "BK": 128, "STAGES": 4, "CLUSTER": 2},
    "FRC64 W8 BK=128 4st x4": {"ROWS": 64, "WARPS": 8, "BK": 128, "STAGES": 4, "CLUSTER": 4},
}


def split_k(a, b, tb, cfg, kernel=gemm_split_k_kernel):
    """A launcher of `kernel` (gemm_split_k_kernel or gemm_few_rows_kernel) + sum_splits_kernel for a and b, and its
    block count."""
    m, k = a.shape
    n = b.shape[0] if tb else b.shape[1]
    cfg = dict(cfg)
    splits = cfg.pop("SPLITS")
    few_rows = kernel is gemm_few_rows_kernel
    spec = kernel.specialize(target="sm_90a", TRANS_B=tb, **cfg)
    total = sum_splits_kernel.specialize(target="sm_90a", COLS=256, WARPS=4)
    partial = torch.full((splits, m, n), float("nan"), device="cuda", dtype=torch.float32)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    tiles = cdiv(n, 16 * cfg["WARPS"]) if few_rows else cdiv(m, 16 * cfg["WARPS"]) * cdiv(n, cfg["BN"])

    def run():
        spec[(tiles, splits)](a, b, partial)
        total[(m, cdiv(n, 4 * 256))](partial, out)
        return out
    return run, tiles * splits


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", type=int, nargs="+", default=[16, 64, 128, 256, 512])
    parser.add_argument("--nk", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--trans-b", type=int, default=0, help="1: b is N×K (a linear layer's weight), a·bᵀ")
    parser.add_argument("--only", default="", help="a regular expression: time only the candidates it matches")
    args = parser.parse_args()
    tb = args.trans_b
    torch.manual_seed(0)
    for nk in args.nk:
        b = torch.randn(nk, nk, device="cuda", dtype=torch.bfloat16)
        for m in args.m:
            a = torch.randn(m, nk, device="cuda", dtype=torch.bfloat16)
            ref = a.float() @ (b.float().t() if tb else b.float())
            impls = {"cuBLAS": (lambda: a @ b.t()) if tb else (lambda: a @ b), "gemm()": lambda: gemm(a, b, trans_b=bool(tb))}
            if m <= 32:  # gemm() with FEW_ROWS_IN_CLUSTERS "eager": one launch outside captures, two kernels in a graph
                product = lambda: gemm(a, b, trans_b=bool(tb))  # noqa: E731
                impls["gemm(), two kernels"] = with_settings(gemm_module, {"FEW_ROWS_LAST_BLOCK": False}, product)
                impls["gemm(), one launch in clusters outside captures"] = with_settings(
                    gemm_module, {"FEW_ROWS_LAST_BLOCK": False, "FEW_ROWS_IN_CLUSTERS": "eager"}, product)
                impls["gemm(), one launch, the last run sums, in graphs too"] = with_settings(
                    gemm_module, {"FEW_ROWS_LAST_BLOCK": True}, product)
            for name, cfg in CANDIDATES.items():
                spec = gemm_sm90_kernel.specialize(target="sm_90a", TRANS_B=tb, **cfg)
                cluster = cfg.get("CLUSTER", 1)
                if cluster > cdiv(m, 16 * cfg["WARPS"]):  # a cluster's stack would be mostly past M's end
                    continue
                grid = persistent_grid(m, nk, 16 * cfg["WARPS"], cfg["BN"], GRID_LIMIT, cluster)[0]
                out = torch.empty(m, nk, device="cuda", dtype=torch.bfloat16)
                impls[f"{name} ({grid} blocks)"] = (lambda spec=spec, grid=grid, out=out: spec[(grid,)](a, b, out) or out)
            for name, cfg in SPLIT_K.items():
                run, grid = split_k(a, b, tb, cfg)
                impls[f"{name} ({grid} blocks)"] = run
            for name, cfg in FEW_ROWS.items():
                if m > cfg.get("ROWS", 16):
                    continue
                run, grid = split_k(a, b, tb, cfg, gemm_few_rows_kernel)
                impls[f"{name} ({grid} blocks)"] = run
            for name, cfg in FEW_ROWS_CLUSTER.items():
                if m > cfg.get("ROWS", 16):
                    continue
                spec = gemm_few_rows_cluster_kernel.specialize(target="sm_90a", TRANS_B=tb, **cfg)
                grid = cdiv(nk, 16 * cfg["WARPS"]) * cfg["CLUSTER"]
                out = torch.empty(m, nk, device="cuda", dtype=torch.bfloat16)
                if not re.search(args.only, name):
                    continue
                resident = spec.resident_blocks(a, b, out)  # a grid past it would run in two waves
                impls[f"{name} ({grid} blocks, {resident} resident)"] = (
                    lambda spec=spec, grid=grid, out=out: spec[(grid,)](a, b, out) or out)
            impls = {name: fn for name, fn in impls.items()
                     if name in ("cuBLAS", "gemm()") or name.startswith("gemm(),") or re.search(args.only, name)}
            print(f"M={m} N=K={nk} trans_b={tb}", flush=True)
            base = None
            for name, fn in impls.items():
                try:
                    err = rel_err(fn(), ref)
                    us = time_ms(fn) * 1e3
                    graph_us = graph_time_ms(fn) * 1e3
                except Exception as e:  # noqa: BLE001
                    print(f"  {name:28s} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    continue
                if name == "cuBLAS":
                    base = us
                    base_graph = graph_us
                print(f"  {name:28s} {us:8.1f} us  err {err:.1e}" + (f"  cuBLAS/this {base / us:.2f}" if base else "")
                      + f"  graph {graph_us:6.1f} us" + (f" {base_graph / graph_us:.2f}" if base else ""), flush=True)


if __name__ == "__main__":
    main()
