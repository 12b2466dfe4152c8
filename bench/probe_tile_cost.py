"""What a query tile costs beyond its key steps: attention_sm90 (not causal) at a fixed number of tiles
(B·H = 256, Nq = 1024) with Nk = 128 ... 4096, time fitted as tiles·(a + b·steps); a/b is the cost of a tile in
key steps of 128. cuDNN beside it (same fit). Prints one line per configuration.
    python bench/probe_tile_cost.py [--dims 64 128]"""
import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import check_outputs, compare  # noqa: E402

from attention import BACKENDS, sdpa, sm90_variant  # noqa: E402

base = {"KEYS": 128, "WARPS": 8, "PRODUCER": 1, "Q_REGS": 1, "PERSISTENT": 1}
CONFIGS = {128: {"defer1": {**base, "DEFER": 1}, "defer2": {**base, "DEFER": 2}, "defer3": {**base, "DEFER": 3},
                 "defer4": {**base, "DEFER": 4}},
           64: {"defer2": {**base, "DEFER": 2}, "defer3": {**base, "DEFER": 3}, "defer4": {**base, "DEFER": 4},
                "wg3": {"KEYS": 128, "WARPS": 12, "DEFER": 1, "PRODUCER": 1, "PERSISTENT": 1}}}

parser = argparse.ArgumentParser()
parser.add_argument("--dims", type=int, nargs="+", default=[128, 64])
parser.add_argument("--rounds", type=int, default=5)
args = parser.parse_args()
torch.manual_seed(0)
batch, heads, nq = 16, 16, 1024
nks = [128, 256, 512, 1024, 2048, 4096]
for d in args.dims:
    q = torch.randn(batch, heads, nq, d, device="cuda", dtype=torch.bfloat16)
    times: dict[str, dict[int, float]] = {}
    for nk in nks:
        k, v = (torch.randn(batch, heads, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        fns = {name: (lambda cfg=cfg, k=k, v=v: sm90_variant(q, k, v, False, cfg)) for name, cfg in CONFIGS[d].items()}
        fns["cuDNN"] = lambda k=k, v=v: sdpa(BACKENDS["cuDNN"], q, k, v, False)
        check_outputs(fns, sdpa(BACKENDS["cuDNN"], q, k, v, False), 2e-2, f"D={d} Nk={nk}")
        for name, ms in compare(fns, args.rounds, 20).items():
            times.setdefault(name, {})[nk] = ms
    print(f"D={d} B·H={batch * heads} Nq={nq}: µs per kernel at Nk = {nks}; fit a + b·steps (steps of 128 keys)")
    for name, per_nk in times.items():
        med = [per_nk[nk] * 1e3 for nk in nks]
        steps = np.array(nks) / 128
        b, a = np.polyfit(steps, med, 1)
        tflops = 4 * batch * heads * nq * nks[-1] * d / (med[-1] * 1e-6) / 1e12
        print(f"  {name:7s} " + " ".join(f"{t:8.1f}" for t in med) +
              f" | a={a:6.1f} µs b={b:6.2f} µs/step  a/b={a / b:5.2f} steps | {tflops:.0f} TFLOP/s at Nk={nks[-1]}")
