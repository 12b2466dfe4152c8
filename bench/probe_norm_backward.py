"""layernorm_bwd_kernel's variants beside layernorm_backward() as shipped: the warps a block (WARPS), a row over all
of them or over one (SPLIT) and the grid (blocks an SM; 0: as many as the GPU holds at once). Each variant is the
kernel then column_sums_kernel, checked against float32 autograd, then timed event-timed and from a CUDA graph;
GB/s as a fraction of a 1 GiB copy's.

    python bench/probe_norm_backward.py [--shapes 16384x1024 ...] [--rms] [--variants W8S1B0 ...]
                                        [--sums-target sm_90a]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compare, copy_bandwidth, graph_time_ms, rel_err  # noqa: E402
from layernorm_backward import reference  # noqa: E402

from tkc.kernels._checks import cdiv, dtype_constant, multiprocessors  # noqa: E402
from tkc.lang import bf16  # noqa: E402
from tkc.kernels.layernorm_bwd import column_sums_kernel, layernorm_backward, layernorm_bwd_kernel  # noqa: E402


def variant(s, dy, w, eps, rms, warps, split, blocks_per_sm, sums_target="sm_80"):
    """(the variant's two launches as one call, its blocks)."""
    rows, d = s.shape
    spec = layernorm_bwd_kernel.specialize(D=d, WARPS=warps, SPLIT=split, RMS=int(rms), DS_IN=0,
                                           **dtype_constant(s.dtype))
    width = d if rms else 2 * d
    ds = torch.empty_like(s)
    totals = torch.empty(width, dtype=w.dtype, device=s.device)
    rows_a_block = warps if split == 1 else 1
    probe = torch.empty((cdiv(rows, rows_a_block), width), dtype=torch.float32, device=s.device)
    if blocks_per_sm == 0:
        blocks = spec.resident_blocks(s, dy, s, w, ds, probe, eps)
    else:
        blocks = blocks_per_sm * multiprocessors(s.get_device())
    blocks = max(1, min(cdiv(rows, rows_a_block), blocks))
    parts = torch.empty((blocks, width), dtype=torch.float32, device=s.device)
    sums_spec = column_sums_kernel.specialize(target=sums_target, DT=dtype_constant(s.dtype).get("DT", bf16))
    backward, sums = spec[(blocks,)], sums_spec[(cdiv(width, 32),)]

    def run():
        backward(s, dy, s, w, ds, parts, eps)
        sums(parts, totals)
        return ds, totals[:d], None if rms else totals[d:]
    return run, blocks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="+", default=["16384x1024", "65536x1024", "16384x4096"])
    parser.add_argument("--rms", action="store_true")
    parser.add_argument("--variants", nargs="+", default=["W1S1B8", "W8S1B0", "W4S1B0", "W4S4B4"],
                        help="W<warps a block>S<warps a row: 1 or all>B<blocks an SM, 0: as many as fit>")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sums-target", default="sm_80", help="column_sums_kernel's build (sm_90a: it can take a "
                        "programmatic dependent launch, TKC_DEPENDENT_LAUNCH=1)")
    args = parser.parse_args()
    copy_gbs = copy_bandwidth(3, 30)
    eps = 1e-6 if args.rms else 1e-5
    for shape in args.shapes:
        m, d = map(int, shape.split("x"))
        s, dy = (torch.randn(m, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w, b = (torch.randn(d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        src = torch.empty(3 * m * d, device="cuda", dtype=torch.uint8)
        dst = torch.empty_like(src)
        refs = reference(s, dy, w, b, args.rms)
        impls = {"same-size copy": lambda: dst.copy_(src),
                 "layernorm_backward()": lambda: layernorm_backward(s, dy, None, w, eps, rms=args.rms)}
        notes = {}
        for name in args.variants:
            warps, split, per_sm = map(int, re.fullmatch(r"W(\d+)S(\d+)B(\d+)", name).groups())
            try:
                impls[name], blocks = variant(s, dy, w, eps, args.rms, warps, split, per_sm, args.sums_target)
                notes[name] = f"{blocks} blocks"
            except Exception as e:
                print(f"  {name}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        for name, fn in list(impls.items())[1:]:
            for got, ref in zip(fn(), refs):
                err = rel_err(got, ref)
                if not err < 1e-2:
                    print(f"  {name}: relative error {err}: dropped")
                    del impls[name]
                    break
            else:
                notes[name] = notes.get(name, "") + f" err {max(rel_err(g, r) for g, r in zip(fn(), refs)):.4f}"
        times = compare(impls, args.rounds, 30)
        nbytes = 6 * m * d
        print(f"{shape}{' RMS' if args.rms else ''}: 1 GiB copy {copy_gbs:.0f} GB/s; fraction event-timed / graph")
        for name, ms in times.items():
            graph = nbytes / graph_time_ms(impls[name]) / 1e6 / copy_gbs
            print(f"  {name:24s} {nbytes / ms / 1e6 / copy_gbs:5.3f}  {graph:5.3f}  {notes.get(name, '')}", flush=True)


if __name__ == "__main__":
    main()
