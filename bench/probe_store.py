"""Per-tile cost (bench/probe_tile_cost.py's fit) of attention_sm90 with and without its output store."""
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import attention_sm90_variant, compare  # noqa: E402

STORE = "        store(O, div_row(o, l).to(bf16), (b, h, q_tile, 0))\n"
# the output store skippable at run time (NO_STORE=1: stored only when first_row < -10^9, never)
attention_probe = attention_sm90_variant("NO_STORE", {
    STORE: "        if NO_STORE:\n            if first_row < -1000000000:\n        " + STORE + "        else:\n    " + STORE})

from tkc.kernels._checks import resident_blocks  # noqa: E402

torch.manual_seed(0)
batch, heads, nq = 16, 16, 1024
nks = [128, 256, 512, 1024, 2048, 4096]
base = {"KEYS": 128, "WARPS": 8, "PRODUCER": 1, "Q_REGS": 1}
for d, defer, stages in [(128, 3, 3), (128, 3, 2), (128, 1, 3), (64, 2, 3)]:
    q = torch.randn(batch, heads, nq, d, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    lse = torch.empty((1, 1, 1), dtype=torch.float32, device="cuda")
    times = {}
    for nk in nks:
        k, v = (torch.randn(batch, heads, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        fns = {}
        for no_store in (0, 1):
            c = {"D": d, "CAUSAL": 0, "LSE": 0, **base, "DEFER": defer, "STAGES": stages, "NO_STORE": no_store}
            tiles = (nq // 128) * heads * batch
            blocks = min(tiles, resident_blocks(attention_probe, ("cuda", *c.items()), q, k, v, out, lse, d ** -0.5,
                                                **c, target="sm_90a"))
            fns[f"store={1 - no_store}"] = (lambda c=c, blocks=blocks, k=k, v=v:
                                           attention_probe[(blocks,)](q, k, v, out, lse, d ** -0.5, **c, target="sm_90a"))
        for name, ms in compare(fns, 5, 20).items():
            times.setdefault(name, {})[nk] = ms
    print(f"D={d} DEFER={defer} STAGES={stages}: µs at Nk = {nks}; fit a + b·steps")
    for name, per in times.items():
        med = [per[nk] * 1e3 for nk in nks]
        b, a = np.polyfit(np.array(nks) / 128, med, 1)
        print(f"  {name} " + " ".join(f"{t:7.1f}" for t in med) + f" | a={a:5.1f} b={b:5.2f} a/b={a / b:4.2f}")
