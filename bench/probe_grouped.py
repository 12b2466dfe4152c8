"""grouped_gemm_sm90_kernel's tile shapes and ring depths beside grouped_gemm() as shipped and torch._grouped_mm, at
a few of bench/grouped_gemm.py's cases (rows sorted; --gather: gathered).   python bench/probe_grouped.py [--gather]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compare, rel_err  # noqa: E402

import tkc.kernels  # noqa: E402
from tkc.kernels.grouped_gemm import grouped_gemm_sm90_kernel  # noqa: E402

CONFIGS = [dict(BN=128, BK=64, WARPS=8, STAGES=4), dict(BN=256, BK=64, WARPS=8, STAGES=3),
           dict(BN=256, BK=64, WARPS=8, STAGES=4), dict(BN=256, BK=64, WARPS=8, STAGES=3, PRODUCER=1),
           dict(BN=256, BK=64, WARPS=8, STAGES=4, PRODUCER=1), dict(BN=256, BK=64, WARPS=12, STAGES=3),
           dict(BN=128, BK=64, WARPS=12, STAGES=4)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", nargs="+", default=["64x16384x1408x2048", "8x8192x7168x4096", "128x32768x1536x2048"])
    parser.add_argument("--gather", action="store_true")
    args = parser.parse_args()
    for case in args.cases:
        groups, slots, n, k = map(int, case.split("x"))
        offsets = torch.bincount(torch.randint(0, groups, (slots,), device="cuda"), minlength=groups).cumsum(0).int()
        x = torch.randn(slots, k, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(groups, n, k, device="cuda") * k ** -0.5).to(torch.bfloat16)
        rows = torch.randperm(slots, device="cuda", dtype=torch.int32) if args.gather else None
        source = x[rows.long()] if rows is not None else x
        ref = torch._grouped_mm(source, w.transpose(1, 2), offs=offsets)
        impls = {"shipped": lambda: tkc.kernels.grouped_gemm(x, w, offsets, rows=rows, trans_b=True),
                 "torch._grouped_mm": lambda: torch._grouped_mm(source, w.transpose(1, 2), offs=offsets)}
        for cfg in CONFIGS:
            spec = grouped_gemm_sm90_kernel.specialize(target="sm_90a", GATHER=int(rows is not None), TRANS_B=1, **cfg)
            out = torch.empty(slots, n, device="cuda", dtype=torch.bfloat16)
            grid = (-(-slots // (16 * cfg["WARPS"])) + groups, -(-n // cfg["BN"]), 1)
            index = rows if rows is not None else offsets
            name = "BN{BN} BK{BK} W{WARPS} S{STAGES}".format(**cfg) + (" producer" if cfg.get("PRODUCER") else "")
            impls[name] = lambda spec=spec, out=out, grid=grid, index=index: (spec.launch(grid, (x, w, offsets, index, out)), out)[1]
        for name, fn in list(impls.items()):
            try:
                err = rel_err(fn(), ref)
                assert err < 1e-2, err
            except Exception as e:  # noqa: BLE001
                print(f"  {name} failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                del impls[name]
        times = compare(impls, 3, 20)
        flops = 2.0 * slots * n * k
        print(f"{case}{' gathered' if args.gather else ''}:", flush=True)
        for name, ms in times.items():
            print(f"  {name:24s} {flops / ms / 1e9:6.0f} TFLOP/s  /grouped_mm {times['torch._grouped_mm'] / ms:.3f}", flush=True)


if __name__ == "__main__":
    main()
