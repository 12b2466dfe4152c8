"""layernorm_kernel at 16384×1024 (the shape short of 0.9× copy bandwidth through layernorm()) with its warps and
grid varied: a row over two warps (layernorm()'s) on a grid of a block a row or of the blocks an SM holds (21
at 47 registers), and a row a warp (WARP_ROWS=1, 64 registers: 32 warps an SM) on a grid of a row a warp or of one
or two waves of resident warps. Each beside layernorm() and a same-size copy, event-timed (30 calls ×
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


def variant(warps: int, blocks: int = 0, warp_rows: int = 0, grid: int = 0):
    grid = grid or (-(-m // warps) if warp_rows else m)
    return lambda: layernorm_kernel[(grid,)](x, r, w, b, o, ro, 1e-5, D=d, WARPS=warps, BLOCKS=blocks,
                                             WARP_ROWS=warp_rows, target="sm_90a")


sms = torch.cuda.get_device_properties(0).multi_processor_count
impls["kernel W2"] = variant(2)
impls["kernel W2, 21 blocks/SM grid"] = variant(2, grid=21 * sms)
for warps in (4, 8):  # a row per warp: rows of their own, a grid of one row a warp or a few resident waves
    impls[f"warp rows W{warps}"] = variant(warps, warp_rows=1)
    for waves in (1, 2):
        impls[f"warp rows W{warps}, {waves} wave grid"] = variant(warps, warp_rows=1, grid=waves * 32 // warps * sms)
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
