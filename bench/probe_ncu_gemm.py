"""gemm() and cuBLAS on one product, three calls each: for ncu (where a skinny product's time goes: DRAM, L2,
the tensor cores). With a JSON configuration, gemm_sm90_kernel launched with it (on every tile) instead of gemm().
    python bench/probe_ncu_gemm.py M N K [trans_b] ['{"WARPS": 4, "BN": 128, "CLUSTER": 2, ...}']"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tkc.kernels import gemm  # noqa: E402
from tkc.kernels.gemm import GRID_LIMIT, gemm_sm90_kernel, persistent_grid  # noqa: E402

m, n, k = (int(x) for x in sys.argv[1:4])
trans_b = len(sys.argv) > 4 and sys.argv[4] == "1"
cfg = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) if trans_b else torch.randn(k, n, device="cuda",
                                                                                         dtype=torch.bfloat16)
out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
if cfg is None:
    ours = lambda: gemm(a, b, trans_b=trans_b)  # noqa: E731
else:
    spec = gemm_sm90_kernel.specialize(target="sm_90a", TRANS_B=int(trans_b), **cfg)
    grid = persistent_grid(m, n, 16 * cfg["WARPS"], cfg["BN"], GRID_LIMIT, cfg.get("CLUSTER", 1))
    ours = lambda: spec[grid](a, b, out)  # noqa: E731
for _ in range(3):
    ours()
for _ in range(3):
    torch.matmul(a, b.t() if trans_b else b)
torch.cuda.synchronize()
