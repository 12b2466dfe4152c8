"""attention() (not causal, B·N = 16384, H = 16) at one head dim and length, three calls: for ncu.
    python bench/probe_ncu.py D N [causal]"""
import sys

import torch

from tkc.kernels import attention

d, n = int(sys.argv[1]), int(sys.argv[2])
causal = len(sys.argv) > 3 and sys.argv[3] == "1"
q, k, v = (torch.randn(16384 // n, 16, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3):
    attention(q, k, v, causal=causal)
torch.cuda.synchronize()
