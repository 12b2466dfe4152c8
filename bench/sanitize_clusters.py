"""The kernels of clusters that read each other's shared memory (the one-launch few-rows GEMMs), once each, for
compute-sanitizer:  compute-sanitizer --tool racecheck --error-exitcode 1 python3 bench/sanitize_clusters.py"""
import importlib

import torch

from tkc.kernels import gemm, scaled_mm

importlib.import_module("tkc.kernels.gemm").FEW_ROWS_IN_CLUSTERS = True  # the one-launch path, on or off by default

bf = torch.bfloat16
x = torch.randn(16, 4608, device="cuda", dtype=bf)  # 36 steps of K in 4 runs (a cluster of 4) against 5 stages
gemm(x, torch.randn(4608, 2000, device="cuda", dtype=bf))
gemm(torch.randn(24, 4608, device="cuda", dtype=bf), torch.randn(2000, 4608, device="cuda", dtype=bf), trans_b=True)
x8, w8 = torch.randn(16, 4608, device="cuda").to(torch.float8_e4m3fn), torch.randn(2000, 4608, device="cuda").to(
    torch.float8_e4m3fn)
scaled_mm(x8, w8.t(), torch.rand(16, 1, device="cuda"), torch.rand(1, 2000, device="cuda"))
torch.cuda.synchronize()
print("ok")
