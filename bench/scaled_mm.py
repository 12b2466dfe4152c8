"""FP8 GEMM with scales: tkc.kernels.scaled_mm vs torch._scaled_mm (cuBLASLt) and Triton, per-tensor and rowwise
scales, e4m3 operands, bf16 output; bf16 GEMM (cuBLAS) beside it for the fp8 speed-up.

    python bench/scaled_mm.py [--sizes 2048 4096 8192] [--shapes 4096x14336x4096] [--launches 30] [--rounds 3]
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
    parser.add_argument("--shapes", nargs="*", default=["8192x8192x1024", "4096x14336x4096", "16384x4096x4096",
                                                        "16x8192x8192", "32x4096x4096"],
                        help="more MxNxK shapes (the last two: a few tokens times a weight, the few-rows path)")
    add_timing_options(parser)
    args = parser.parse_args()
    triton_kernels = triton_peer()
    env = environment()
    rows = []
    shapes = [(n, n, n) for n in args.sizes] + [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    for m, n, k in shapes:
        for rowwise in (False, True):
            a = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
            weight = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn)
            b = weight.t()
            shape_a, shape_b = ((m, 1), (1, n)) if rowwise else ((), ())
            scale_a, scale_b = torch.rand(shape_a, device="cuda") + 0.5, torch.rand(shape_b, device="cuda") + 0.5
            ref = (a.float() @ b.float()) * scale_a * scale_b
            a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
            impls = {
                "tkc": lambda: tkc.kernels.scaled_mm(a, b, scale_a, scale_b),
                "cuBLASLt": lambda: torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16),
                "bf16 cuBLAS": lambda: torch.matmul(a16, b16) * (scale_a * scale_b).to(torch.bfloat16),
            }
            if triton_kernels is not None:
                impls["triton"] = lambda: triton_kernels.scaled_mm(a, b, scale_a, scale_b)
            errors = {}
            for name in list(impls):
                try:
                    errors[name] = rel_err(impls[name](), ref)
                except Exception as e:  # noqa: BLE001 - a peer that cannot run this shape is left out
                    print(f"  {name} failed: {type(e).__name__}: {e}")
                    del impls[name]
            times = compare(impls, args.rounds, args.launches)
            flops = 2 * m * n * k
            row = {"size": f"{n}³" if m == n == k else f"{m}×{n}×{k}", "scales": "rowwise" if rowwise else "tensor"}
            for name in impls:
                row[f"{name} TFLOP/s"] = flops / times[name] / 1e9
                row[f"{name} err"] = errors[name]
            for peer in ("cuBLASLt", "triton", "bf16 cuBLAS"):
                if peer in impls and "tkc" in impls:
                    row[f"tkc / {peer}"] = times[peer] / times["tkc"]
            rows.append(row)
            print(row, flush=True)
    names = ("tkc", "cuBLASLt", "triton", "bf16 cuBLAS")
    cols = [("size", "M×N×K"), ("scales", "scales")] + [(f"{n} TFLOP/s", f"{n} TFLOP/s") for n in names]
    cols += [(f"tkc / {p}", f"tkc / {p}") for p in names[1:]]
    cols += [(f"{n} err", f"{n} rel err") for n in ("tkc", "cuBLASLt")]
    text = table(rows, cols)
    print(text)
    record("scaled_mm", env, "float8_e4m3fn inputs (a row-major, b an N×K weight's .t()), bf16 output, f32 "
           "accumulation; scales per tensor or rowwise; bf16 cuBLAS = the same product from bf16 copies of the "
           f"operands. Median of {args.launches} back-to-back launches × {args.rounds} interleaved rounds, CUDA "
           "events, through each public entry point.\n\n" + text, rows)


if __name__ == "__main__":
    main()
