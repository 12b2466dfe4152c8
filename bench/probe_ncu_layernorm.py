"""layernorm() beside copies of as many bytes, three calls each: for ncu, to put the kernels' own durations and DRAM
traffic side by side without the launches between them (bench/layernorm.py times those too).

    ncu --cache-control none --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,... \\
        python bench/probe_ncu_layernorm.py [rows] [D]

Kernels, in order: layernorm_kernel (x, residual → out, x + residual), torch's copy of the same bytes (a (rows, 2·D)
bf16 tensor: as many read and written), the same bytes through torch.mul(·, 1) (a kernel), Triton's layernorm (bench/triton_kernels.py, where Triton is installed), and
a 1 GiB copy (the bench's reference bandwidth)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

from tkc.kernels import layernorm  # noqa: E402

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
d = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
x, residual = (torch.randn(rows, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
weight, bias = (torch.randn(d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
out, residual_out = torch.empty_like(x), torch.empty_like(x)
source, target = torch.randn(rows, 2 * d, device="cuda", dtype=torch.bfloat16), torch.empty(rows, 2 * d, device="cuda",
                                                                                           dtype=torch.bfloat16)
big_source = torch.empty(1 << 29, device="cuda", dtype=torch.bfloat16).normal_()
big_target = torch.empty_like(big_source)
try:
    import triton_kernels
except ImportError:
    triton_kernels = None
for _ in range(3):
    layernorm(x, residual, weight, bias, out=out, residual_out=residual_out)
for _ in range(3):
    target.copy_(source)  # cudaMemcpyAsync: where that runs on a copy engine, ncu shows no kernel for it
for _ in range(3):
    torch.mul(source, 1, out=target)  # the same bytes through torch's elementwise kernel
if triton_kernels is not None:
    for _ in range(3):
        triton_kernels.layernorm(x, residual, weight, bias)
for _ in range(3):
    big_target.copy_(big_source)
torch.cuda.synchronize()
reference = torch.nn.functional.layer_norm((x.float() + residual.float()), (d,), weight.float(), bias.float())
print(f"{rows}x{d}: moved {8 * rows * d / 1e6:.1f} MB a layernorm call; max error "
      f"{(out.float() - reference).abs().max().item():.3g}")
