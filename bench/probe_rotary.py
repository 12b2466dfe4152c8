"""rotary_kernel's constants (heads a warp, warps a block) at a few shapes, the kernel launched directly and from a
CUDA graph, beside a copy of as many bytes and Triton's rotary: GB/s as a fraction of a 1 GiB copy's.

    python bench/probe_rotary.py [--shapes 4x32x4096x128:128 16x16x2048x64:64] [--configs HEADS=2 HEADS=1,WARPS=8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_bandwidth, rel_err, report_copy_fractions, triton_peer  # noqa: E402
from rotary import tables, torch_rotary  # noqa: E402

from tkc.kernels.rotary import rotary_kernel  # noqa: E402
from tkc.lang import bf16  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="+", default=["4x32x4096x128:128", "16x16x2048x64:64", "4x32x4096x128:64"])
    parser.add_argument("--configs", nargs="+", default=["HEADS=1", "HEADS=2", "HEADS=4", "HEADS=2,WARPS=8"],
                        help="constants of rotary_kernel, NAME=VALUE,... (WARPS 4, HEADS 2 unless given; CT=bf16: bf16 tables)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    triton_kernels = triton_peer()
    copy_gbs = copy_bandwidth(3, 30)
    for shape in args.shapes:
        dims, r = shape.split(":")
        b, h, n, d = map(int, dims.split("x"))
        r = int(r)
        x = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
        cos, sin = tables(n, r)
        ref = torch_rotary(x.double(), torch.cat((cos, cos), -1).double(), torch.cat((sin, sin), -1).double())
        nbytes = 4 * x.numel() + 8 * n * (r // 2)
        src = torch.empty(nbytes // 2, device="cuda", dtype=torch.uint8)
        dst = torch.empty_like(src)
        out = torch.empty_like(x)
        impls = {"same-size copy": lambda: dst.copy_(src)}
        if triton_kernels is not None:
            impls["triton"] = lambda: triton_kernels.rotary(x, cos, sin)
        for config in args.configs:
            given = dict(kv.split("=") for kv in config.split(","))
            tables_bf16 = given.pop("CT", "f32") == "bf16"  # cos and sin in bf16: half the table bytes
            constants = {"WARPS": 4, "HEADS": 2, **{k: int(v) for k, v in given.items()}}
            spec = rotary_kernel.specialize(D=d, R=r, COPY_REST=int(r < d), **constants, **({"CT": bf16} if tables_bf16 else {}))
            grid = (-(-n // (16 * constants["WARPS"])), b, -(-h // constants["HEADS"]))
            c, s = (cos.bfloat16(), sin.bfloat16()) if tables_bf16 else (cos, sin)
            unread = torch.zeros(1, device="cuda", dtype=torch.int32)  # Positions (POSITIONS=0: not read)
            impls[f"tkc {config}"] = (lambda spec=spec, grid=grid, c=c, s=s, p=unread:
                                      spec[grid](x, c, s, out, x, out, p, 0, 0) or out)
        for name, fn in list(impls.items()):
            if name != "same-size copy":
                out.fill_(float("nan"))
                err = rel_err(fn(), ref)
                assert err < 1e-2, f"{name}: relative error {err}"
        report_copy_fractions(f"{shape} ({nbytes / 1e6:.0f} MB)", impls, nbytes, copy_gbs, args.rounds)


if __name__ == "__main__":
    main()
