"""layernorm_kernel at 16384×1024 (the shape short of 0.9× copy bandwidth through layernorm()) with its register
budget and warps varied: BLOCKS caps the registers so that that many blocks of 64 threads share an SM (0: ptxas's
47 registers, 21 blocks; 24: 40 registers). Each beside layernorm() and a same-size copy, event-timed (30 calls ×
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
for warps in (2, 4):
    for blocks in (0, 24, 32):
        name = f"kernel W{warps} BLOCKS={blocks}"
        impls[name] = (lambda warps=warps, blocks=blocks: layernorm_kernel[(m,)](
            x, r, w, b, o, ro, 1e-5, D=d, WARPS=warps, BLOCKS=blocks, target="sm_90a"))
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
