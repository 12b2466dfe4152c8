"""Grouped GEMM (a mixture of experts' expert layers): tkc.kernels.grouped_gemm vs torch._grouped_mm (CUTLASS on
Hopper), a loop of cuBLAS matmuls over the groups, and a Triton kernel, in TFLOP/s (2·S·N·K a call). The S rows
(tokens routed to experts) fall into G groups at random (each token to an expert drawn uniformly); the weights are
(G, N, K), a linear layer's layout (trans_b). --gather: the rows come unsorted, gathered by a (S,) int32 index as
they are multiplied (tkc and Triton read x by it; torch gathers x[rows] first and then multiplies).

    python bench/grouped_gemm.py [--cases 8x8192x7168x4096 ...] [--gather | --wgrad | --dx]

A case is G×S×N×K.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_timing_options, compare, environment, record, rel_err, table, triton_peer  # noqa: E402

import tkc.kernels  # noqa: E402


def run_case(args, out_rows, groups, slots, n, k, impls, ref) -> None:
    """Check each implementation's output against `ref`, time them side by side, append the case's row."""
    errors = {}
    for name, fn in list(impls.items()):
        try:
            errors[name] = rel_err(fn(), ref)
            assert errors[name] < 1e-2, f"relative error {errors[name]}"
        except Exception as e:  # noqa: BLE001
            print(f"  {name} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            del impls[name]
    times = compare(impls, args.rounds, args.launches)
    flops = 2.0 * slots * n * k
    row = {"case": f"{groups}×{slots}×{n}×{k}"}
    for name in ("tkc sm_80", "tkc", "torch._grouped_mm", "torch loop", "triton"):
        row[f"{name} TFLOP/s"] = flops / times[name] / 1e9 if name in times else float("nan")
        row[f"{name} err"] = errors.get(name, float("nan"))
    row["tkc ms"] = times.get("tkc", float("nan"))
    for peer in ("torch._grouped_mm", "torch loop", "triton"):
        row[f"tkc / {peer}"] = row["tkc TFLOP/s"] / row[f"{peer} TFLOP/s"]
    out_rows.append(row)
    print({key: (round(v, 3) if isinstance(v, float) else v) for key, v in row.items()}, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", nargs="+", default=["8x8192x7168x4096", "64x16384x1408x2048",
                                                       "128x32768x1536x2048", "8x2048x14336x4096"])
    parser.add_argument("--gather", action="store_true", help="rows gathered by an index as they are multiplied")
    parser.add_argument("--wgrad", action="store_true",
                        help="the weights' gradient instead: dw[g] = dy_gᵀ·x_g (tkc.kernels.grouped_gemm_wgrad; torch: "
                             "_grouped_mm of dyᵀ and x)")
    parser.add_argument("--dx", action="store_true",
                        help="the gradient of gathered rows' x instead: dx[rows[s]] += dy[s]·w[g] (tkc.kernels."
                             "grouped_gemm_dx; torch: _grouped_mm of dy and w, then index_add_ into x's rows)")
    add_timing_options(parser)
    args = parser.parse_args()
    triton_kernels = triton_peer()
    env = environment()
    out_rows = []
    for case in args.cases:
        groups, slots, n, k = map(int, case.split("x"))
        experts = torch.randint(0, groups, (slots,), device="cuda")
        sizes = torch.bincount(experts, minlength=groups)
        offsets = sizes.cumsum(0).to(torch.int32)
        bounds = [0, *offsets.tolist()]  # (the torch loop's slices, read once before timing)
        x = torch.randn(slots, k, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(groups, n, k, device="cuda") * k ** -0.5).to(torch.bfloat16)
        rows = torch.randperm(slots, device="cuda", dtype=torch.int32) if args.gather or args.dx else None
        xs = x[rows.long()] if args.gather else x
        if args.dx:  # x (slots × k) was gathered by rows (a permutation) into the product; dy is slots × n
            dy = torch.randn(slots, n, device="cuda", dtype=torch.bfloat16)
            ref = torch.zeros(slots, k, device="cuda").index_add_(0, rows.long(), torch.cat(
                [dy[bounds[g]:bounds[g + 1]].float() @ w[g].float() for g in range(groups)]))

            def torch_dx() -> torch.Tensor:
                product = torch._grouped_mm(dy, w, offs=offsets)
                return torch.zeros(slots, k, device="cuda", dtype=torch.float32).index_add_(
                    0, rows.long(), product.float()).to(torch.bfloat16)

            impls = {"tkc sm_80": lambda: tkc.kernels.grouped_gemm_dx(dy, w, offsets, rows, slots, trans_b=True,
                                                                      target="sm_80"),
                     "tkc": lambda: tkc.kernels.grouped_gemm_dx(dy, w, offsets, rows, slots, trans_b=True),
                     "torch._grouped_mm": torch_dx}
            run_case(args, out_rows, groups, slots, n, k, impls, ref)
            continue
        if args.wgrad:
            dy = torch.randn(slots, n, device="cuda", dtype=torch.bfloat16)
            ref = torch.stack([dy[bounds[g]:bounds[g + 1]].float().t() @ xs[bounds[g]:bounds[g + 1]].float()
                               for g in range(groups)])
            impls = {"tkc sm_80": lambda: tkc.kernels.grouped_gemm_wgrad(x, dy, offsets, rows=rows, trans_b=True,
                                                                         target="sm_80"),
                     "tkc": lambda: tkc.kernels.grouped_gemm_wgrad(x, dy, offsets, rows=rows, trans_b=True),
                     "torch._grouped_mm": lambda: torch._grouped_mm(
                         dy.t(), x[rows.long()] if rows is not None else x, offs=offsets),
                     "torch loop": lambda: torch.stack([dy[bounds[g]:bounds[g + 1]].t() @ (
                         x[rows.long()] if rows is not None else x)[bounds[g]:bounds[g + 1]] for g in range(groups)])}
            run_case(args, out_rows, groups, slots, n, k, impls, ref)
            continue
        ref = torch.cat([xs[bounds[g]:bounds[g + 1]].float() @ w[g].float().t() for g in range(groups)])

        def torch_loop() -> torch.Tensor:
            source = x[rows.long()] if rows is not None else x
            return torch.cat([source[bounds[g]:bounds[g + 1]] @ w[g].t() for g in range(groups)])

        def torch_grouped() -> torch.Tensor:
            source = x[rows.long()] if rows is not None else x
            return torch._grouped_mm(source, w.transpose(1, 2), offs=offsets)

        impls = {"tkc sm_80": lambda: tkc.kernels.grouped_gemm(x, w, offsets, rows=rows, trans_b=True, target="sm_80"),
                 "tkc": lambda: tkc.kernels.grouped_gemm(x, w, offsets, rows=rows, trans_b=True),
                 "torch._grouped_mm": torch_grouped, "torch loop": torch_loop}
        if triton_kernels is not None:
            impls["triton"] = lambda: triton_kernels.grouped_gemm(x, w, offsets, rows, trans_b=True)
        run_case(args, out_rows, groups, slots, n, k, impls, ref)
    cols = [("case", "G×S×N×K"), ("tkc ms", "tkc ms")]
    cols += [(f"{name} TFLOP/s", f"{name} TFLOP/s") for name in ("tkc sm_80", "tkc", "torch._grouped_mm",
                                                                 "torch loop", "triton")]
    cols += [(f"tkc / {peer}", f"tkc / {peer}") for peer in ("torch._grouped_mm", "torch loop", "triton")]
    cols += [("tkc err", "tkc rel err")]
    what = ("its weights' gradient dw[g] = dy_gᵀ·x_g, " if args.wgrad else
            "the gradient of x gathered by an index, dx[rows[s]] += dy[s]·w[g] (f32 sums, then bf16), " if args.dx
            else "")
    text = (f"Grouped GEMM, weights (G, N, K) (trans_b), {what}rows to groups at random{', gathered by an index' if args.gather else ''}; "
            f"median of {args.rounds} interleaved rounds × {args.launches} launches.\n\n" + table(out_rows, cols))
    print(text)
    record("grouped_gemm" + ("_wgrad" if args.wgrad else "") + ("_dx" if args.dx else "")
           + ("_gather" if args.gather else ""), env, text, out_rows)


if __name__ == "__main__":
    main()
