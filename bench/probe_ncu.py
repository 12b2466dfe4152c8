"""attention() (not causal, B·N = 16384, H = 16) at one head dim and length, three calls: for ncu. With a JSON
configuration, attention_sm90 launched with it instead (as bench/attention.py's variants are).
    python bench/probe_ncu.py D N [causal] ['{"KEYS": 128, "DEFER": 1, ...}']"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention import sm90_variant  # noqa: E402
from tkc.kernels import attention  # noqa: E402

d, n = int(sys.argv[1]), int(sys.argv[2])
causal = len(sys.argv) > 3 and sys.argv[3] == "1"
cfg = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
q, k, v = (torch.randn(16384 // n, 16, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3):
    if cfg is None:
        attention(q, k, v, causal=causal)
    else:
        sm90_variant(q, k, v, causal, cfg)
torch.cuda.synchronize()
