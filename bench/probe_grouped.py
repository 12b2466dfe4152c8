"""grouped_gemm_sm90_kernel's tile orders, grids and rings (TMA, cp.async, mixed: MIXED=1) beside grouped_gemm() as
shipped and torch._grouped_mm, at a few of bench/grouped_gemm.py's cases (rows sorted; --gather: gathered; --wgrad:
the weights' gradient's kernel, WGRAD_CONFIGS).   python bench/probe_grouped.py [--gather | --wgrad]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compare, rel_err  # noqa: E402

import tkc.kernels  # noqa: E402
from tkc.compiler import default_pipeline  # noqa: E402
from tkc.kernels.grouped_gemm import grouped_gemm_sm90_kernel, grouped_gemm_wgrad_sm90_kernel  # noqa: E402

# (name, constants, persistent): the kernel on one block a tile, or on one block a multiprocessor walking the tiles
CONFIGS = [("tiles", dict(BN=256, BK=64, WARPS=8, STAGES=4), False),
           ("tiles L16", dict(BN=256, BK=64, WARPS=8, STAGES=4, LOADS=16), False),
           ("tiles L16 GN8", dict(BN=256, BK=64, WARPS=8, STAGES=4, LOADS=16, GROUP_N=8), False),
           ("tiles L16 GN4", dict(BN=256, BK=64, WARPS=8, STAGES=4, LOADS=16, GROUP_N=4), False),
           ("tiles L16 GN12", dict(BN=256, BK=64, WARPS=8, STAGES=4, LOADS=16, GROUP_N=12), False),
           ("persistent L16 GN8", dict(BN=256, BK=64, WARPS=8, STAGES=4, LOADS=16, GROUP_N=8), True),
           ("persistent L16 GN8 producer", dict(BN=256, BK=64, WARPS=8, STAGES=4, LOADS=16, GROUP_N=8, PRODUCER=1),
            True),
           ("tiles L16 GN8 cp.async", dict(BN=256, BK=64, WARPS=8, STAGES=4, LOADS=16, GROUP_N=8, TMA=0), False),
           ("tiles L16 GN12 mixed ring", dict(BN=256, BK=64, WARPS=8, STAGES=4, LOADS=16, GROUP_N=12, MIXED=1),
            False)]  # (MIXED=1 changes only gathered rows: --gather)
# TMA=0: the pipeline without insert-tma-pipeline (a cp.async ring for W too, as where X's rows are gathered)
NO_TMA = default_pipeline("sm_90a").replace("insert-tma-pipeline,", "")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", nargs="+", default=["64x16384x1408x2048", "8x8192x7168x4096", "128x32768x1536x2048", "8x2048x14336x4096"])
    parser.add_argument("--gather", action="store_true")
    parser.add_argument("--wgrad", action="store_true", help="the weights' gradient's kernel (WGRAD_CONFIGS)")
    args = parser.parse_args()
    for case in args.cases:
        if args.wgrad:
            probe_wgrad(case)
            continue
        groups, slots, n, k = map(int, case.split("x"))
        offsets = torch.bincount(torch.randint(0, groups, (slots,), device="cuda"), minlength=groups).cumsum(0).int()
        x = torch.randn(slots, k, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(groups, n, k, device="cuda") * k ** -0.5).to(torch.bfloat16)
        rows = torch.randperm(slots, device="cuda", dtype=torch.int32) if args.gather else None
        source = x[rows.long()] if rows is not None else x
        ref = torch._grouped_mm(source, w.transpose(1, 2), offs=offsets)
        impls = {"shipped": lambda: tkc.kernels.grouped_gemm(x, w, offsets, rows=rows, trans_b=True),
                 "torch._grouped_mm": lambda: torch._grouped_mm(source, w.transpose(1, 2), offs=offsets)}
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for name, cfg, persistent in CONFIGS:
            if args.gather and cfg.get("PRODUCER"):
                continue  # (a producer warpgroup issues TMA loads; gathered rows are cp.async)
            cfg = dict(cfg)
            pipeline = NO_TMA if not cfg.pop("TMA", 1) else None
            spec = grouped_gemm_sm90_kernel.specialize(target="sm_90a", pipeline=pipeline, GATHER=int(rows is not None),
                                                       TRANS_B=1, **cfg)
            out = torch.empty(slots, n, device="cuda", dtype=torch.bfloat16)
            tiles = (-(-slots // (16 * cfg["WARPS"])) + groups) * -(-n // cfg["BN"])
            grid = (min(tiles, sms) if persistent else tiles, 1, 1)
            index = rows if rows is not None else offsets
            impls[name] = lambda spec=spec, out=out, grid=grid, index=index: (spec.launch(grid, (x, w, offsets, index, out)), out)[1]
        check_and_time(impls, ref, 2.0 * slots * n * k, f"{case}{' gathered' if args.gather else ''}")


# (name, constants, persistent) of grouped_gemm_wgrad_sm90_kernel; persistent: on as many blocks as the GPU holds
WGRAD_CONFIGS = [("tiles S3", dict(BN=128, BR=64, WARPS=8, STAGES=3), False),
                 ("persistent S3", dict(BN=128, BR=64, WARPS=8, STAGES=3), True),
                 ("persistent S4", dict(BN=128, BR=64, WARPS=8, STAGES=4), True),
                 ("persistent BN256 S3", dict(BN=256, BR=64, WARPS=8, STAGES=3), True),
                 ("tiles BN256 S3", dict(BN=256, BR=64, WARPS=8, STAGES=3), False),
                 ("tiles BN256 S3 mixed ring", dict(BN=256, BR=64, WARPS=8, STAGES=3, MIXED=1), False)]


def probe_wgrad(case: str) -> None:
    """dw[g] = dy_gᵀ·x_g (trans_b: w is (G, N, K)) by WGRAD_CONFIGS beside grouped_gemm_wgrad and torch._grouped_mm."""
    groups, slots, n, k = map(int, case.split("x"))
    offsets = torch.bincount(torch.randint(0, groups, (slots,), device="cuda"), minlength=groups).cumsum(0).int()
    x = torch.randn(slots, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(slots, n, device="cuda", dtype=torch.bfloat16)
    ref = torch._grouped_mm(dy.t(), x, offs=offsets)
    impls = {"shipped": lambda: tkc.kernels.grouped_gemm_wgrad(x, dy, offsets, trans_b=True),
             "torch._grouped_mm": lambda: torch._grouped_mm(dy.t(), x, offs=offsets)}
    for name, cfg, persistent in WGRAD_CONFIGS:
        spec = grouped_gemm_wgrad_sm90_kernel.specialize(target="sm_90a", **cfg)
        out = torch.empty(groups, n, k, device="cuda", dtype=torch.bfloat16)
        tiles = groups * -(-n // (16 * cfg["WARPS"])) * -(-k // cfg["BN"])
        grid = (min(tiles, spec.resident_blocks(dy, x, offsets, offsets, out)) if persistent else tiles, 1, 1)
        impls[name] = lambda spec=spec, out=out, grid=grid: (spec.launch(grid, (dy, x, offsets, offsets, out)), out)[1]
    check_and_time(impls, ref, 2.0 * slots * n * k, f"{case} wgrad")


def check_and_time(impls: dict, ref: torch.Tensor, flops: float, title: str) -> None:
    """Drop the implementations that fail or miss `ref`, time the others side by side, print TFLOP/s and the ratio
    to torch._grouped_mm."""
    for name, fn in list(impls.items()):
        try:
            err = rel_err(fn(), ref)
            assert err < 1e-2, err
        except Exception as e:  # noqa: BLE001
            print(f"  {name} failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            del impls[name]
    times = compare(impls, 5, 20)
    print(f"{title}:", flush=True)
    for name, ms in times.items():
        print(f"  {name:28s} {flops / ms / 1e9:6.0f} TFLOP/s  /grouped_mm {times['torch._grouped_mm'] / ms:.3f}", flush=True)


if __name__ == "__main__":
    main()
