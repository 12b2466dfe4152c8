"""GEMM: tkc (the sm_80 mma.sync path, and the best for this GPU) vs torch.matmul (cuBLAS) and Triton.

    python bench/gemm.py [--sizes 2048 4096 8192] [--launches 30] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_timing_options, compare, environment, record, rel_err, table, triton_peer  # noqa: E402

import tkc.kernels  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192], help="square M = N = K")
    parser.add_argument("--shapes", nargs="*", default=["8192x8192x1024", "4096x14336x4096", "16384x4096x4096"],
                        help="more MxNxK shapes (the Hopper issue's)")
    add_timing_options(parser)
    args = parser.parse_args()
    triton_kernels = triton_peer()
    env = environment()
    rows = []
    shapes = [(n, n, n) for n in args.sizes] + [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ b.float()
        impls = {
            "tkc sm_80": lambda: tkc.kernels.gemm(a, b, target="sm_80"),
            "tkc": lambda: tkc.kernels.gemm(a, b),
            "cuBLAS": lambda: torch.matmul(a, b),
        }
        if triton_kernels is not None:
            impls["triton"] = lambda: triton_kernels.matmul(a, b)
        errors = {}
        for name, fn in impls.items():
            try:
                errors[name] = rel_err(fn(), ref)
            except Exception as e:  # noqa: BLE001
                print(f"  {name} failed: {type(e).__name__}: {e}")
                errors[name] = float("nan")
        times = compare(impls, args.rounds, args.launches)
        flops = 2 * m * n * k
        row = {"size": f"{n}³" if m == n == k else f"{m}×{n}×{k}"}
        for name in impls:
            row[f"{name} TFLOP/s"] = flops / times[name] / 1e9
            row[f"{name} err"] = errors[name]
        for peer in ("cuBLAS", "triton"):
            if peer in impls:
                row[f"tkc sm_80 / {peer}"] = times[peer] / times["tkc sm_80"]
                row[f"tkc / {peer}"] = times[peer] / times["tkc"]
        rows.append(row)
        print(row, flush=True)
    cols = [("size", "M×N×K")] + [(f"{n} TFLOP/s", f"{n} TFLOP/s") for n in ("tkc sm_80", "tkc", "cuBLAS", "triton")]
    cols += [(k, k) for k in ("tkc sm_80 / cuBLAS", "tkc / cuBLAS", "tkc sm_80 / triton", "tkc / triton")]
    cols += [(f"{n} err", f"{n} rel err") for n in ("tkc sm_80", "tkc")]
    text = table(rows, cols)
    print(text)
    record("gemm", env, "bf16 inputs, bf16 output, f32 accumulation; median of " f"{args.launches} back-to-back launches × "
           f"{args.rounds} interleaved rounds, CUDA events, through each public entry point.\n\n" + text, rows)


if __name__ == "__main__":
    main()
