"""layernorm_kernel at 16384×1024 (the shape short of 0.9× copy bandwidth through layernorm()) with its grid varied:
a block a row (layernorm()'s), or one or two waves of resident blocks each reading its next row while it reduces
this one (PREFETCH=1), with 2 or 4 warps a row. Each beside layernorm() and a same-size copy, event-timed (30 calls ×
5 interleaved rounds) and from a CUDA graph (the kernel alone); GB/s as a fraction of a 1 GiB copy's.
    python bench/probe_layernorm.py [--rows 16384] [--dim 1024]"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compare, graph_time_ms, rel_err, time_ms  # noqa: E402

from tkc.kernels import layernorm, layernorm_kernel  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--rows", type=int, default=16384)
parser.add_argument("--dim", type=int, default=1024)
args = parser.parse_args()
m, d = args.rows, args.dim
big = torch.empty(2**29, device="cuda", dtype=torch.bfloat16)
copy_gbs = 2 * big.numel() * 2 / time_ms(lambda: big.clone()) / 1e6
x, r = (torch.randn(m, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
w, b = (torch.randn(d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
o, ro = torch.empty_like(x), torch.empty_like(x)
src, dst = torch.randn(2 * m * d, device="cuda", dtype=torch.bfloat16), torch.empty(2 * m * d, device="cuda",
                                                                                     dtype=torch.bfloat16)
ref = torch.nn.functional.layer_norm(x.float() + r.float(), (d,), w.float(), b.float(), 1e-5)
nbytes = 4 * x.numel() * 2
impls = {"layernorm()": lambda: layernorm(x, r, w, b, out=o, residual_out=ro), "same-size copy": lambda: dst.copy_(src)}



def variant(warps: int, prefetch: int = 0, waves: int = 0, blocks: int = 0):
    """layernorm_kernel on a grid of a block a row, or (waves > 0) of `waves` times the blocks the GPU holds."""
    constants = {"D": d, "WARPS": warps, "BLOCKS": blocks, "PREFETCH": prefetch}
    args = (x, r, w, b, o, ro, 1e-5)
    grid = waves * layernorm_kernel.resident_blocks(*args, target="sm_90a", **constants) if waves else m
    print(f"  W{warps} PREFETCH={prefetch} BLOCKS={blocks}: grid {grid}")
    return lambda: layernorm_kernel[(min(grid, m),)](*args, **constants, target="sm_90a")


impls["kernel W2"] = variant(2)
for warps in (2, 4):  # the next row read during this one's sums, on grids of one or two resident waves
    for waves in (1, 2):
        impls[f"prefetch W{warps}, {waves} wave grid"] = variant(warps, 1, waves)
impls["prefetch W2, 24 blocks/SM, 1 wave"] = variant(2, 1, 1, blocks=24)
for name, fn in impls.items():
    if name != "same-size copy":
        o.fill_(float("nan"))
        fn()
        assert rel_err(o, ref) < 1e-2, f"{name}: relative error {rel_err(o, ref)}"
times = compare(impls, rounds=5)
print(f"{m}x{d}: 1 GiB copy {copy_gbs:.0f} GB/s; fractions of it, event-timed / graph")
for name, ms in times.items():
    print(f"  {name:24s} {nbytes / ms / 1e6 / copy_gbs:5.3f}  {nbytes / graph_time_ms(impls[name]) / 1e6 / copy_gbs:5.3f}",
          flush=True)
