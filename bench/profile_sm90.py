"""The sm_90a GEMM once at 4096³ for a profiler (ncu -k regex:gemm_sm90_kernel --launch-skip 1):

    python3 bench/profile_sm90.py [PRODUCER STAGES GRID]
"""

from __future__ import annotations

import sys

import torch

from tkc.kernels import gemm_sm90_kernel

producer, stages, grid = (int(x) for x in (sys.argv[1:] or ["1", "4", "132"]))
n = 4096
a, b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16), torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(2):  # the first compiles and loads; the profiler looks at the second
    gemm_sm90_kernel[(grid,)](a, b, c, BN=256, BK=64, WARPS=8, STAGES=stages, PRODUCER=producer, target="sm_90a")
torch.cuda.synchronize()
