"""attention() beside attention_sm90 with every N-th exponential on the FMA pipe (EXP2_POLY=N), cuDNN and flash:
TFLOP/s, median of 30 launches × 5 interleaved rounds, each output checked against cuDNN first."""
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import time_ms  # noqa: E402

from attention import BACKENDS, sdpa, sm90_variant  # noqa: E402
from tkc.kernels import attention  # noqa: E402
from tkc.kernels.attention import sm90_config  # noqa: E402

torch.manual_seed(0)
for d, causal, n, polys in [(64, 0, 1024, (3, 4, 6, 8)), (64, 1, 1024, (4, 6)), (128, 0, 1024, (4, 8)),
                            (128, 0, 4096, (4, 8)), (64, 0, 4096, (4, 8))]:
    batch, heads = 16384 // n, 16
    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = sdpa(BACKENDS["cuDNN"], q, k, v, bool(causal)).float()
    cfg = sm90_config(d, n, n, bool(causal))
    fns = {"attention()": lambda: attention(q, k, v, causal=bool(causal))}
    for every in polys:
        fns[f"EXP2_POLY={every}"] = lambda every=every: sm90_variant(q, k, v, bool(causal), {**cfg, "EXP2_POLY": every})
    fns["cuDNN"] = lambda: sdpa(BACKENDS["cuDNN"], q, k, v, bool(causal))
    fns["flash"] = lambda: sdpa(BACKENDS["flash"], q, k, v, bool(causal))
    for name, fn in fns.items():
        out = fn().float()
        err = ((out - ref).norm() / ref.norm()).item()
        assert torch.isfinite(out).all() and err < 1e-2, (d, causal, n, name, err)
    times = {name: [] for name in fns}
    for _ in range(5):
        for name, fn in fns.items():
            times[name].append(time_ms(fn, 30))
    flops = 4 * batch * heads * n * n * d / (2 if causal else 1)
    tf = {name: flops / (statistics.median(t) * 1e-3) / 1e12 for name, t in times.items()}
    print(f"D={d} causal={causal} N={n} {cfg}")
    for name, value in tf.items():
        print(f"  {name:12s} {value:6.0f} TFLOP/s  /cuDNN {value / tf['cuDNN']:.3f}  /flash {value / tf['flash']:.3f}")
