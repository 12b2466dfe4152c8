"""attention() at D=64, N=1024 (B=16, H=16, not causal) beside attention_sm90 with other pipeline depths and
grids, cuDNN and flash: where the short-sequence D=64 configuration stands. Prints one line per implementation."""
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import time_ms  # noqa: E402

from attention import BACKENDS, sdpa, sm90_variant  # noqa: E402
from tkc.kernels import attention  # noqa: E402

torch.manual_seed(0)
base = {"KEYS": 128, "WARPS": 8, "DEFER": 2, "PRODUCER": 1, "Q_REGS": 1, "PERSISTENT": 1}
configs = {"STAGES=2": {**base, "STAGES": 2}, "STAGES=4": {**base, "STAGES": 4}, "STAGES=5": {**base, "STAGES": 5},
           "DEFER=1": {**base, "DEFER": 1}, "TILES=2": {**{k: v for k, v in base.items() if k != "PERSISTENT"}, "TILES": 2},
           "TILES=1": {k: v for k, v in base.items() if k != "PERSISTENT"}}
for batch, heads, n in [(16, 16, 1024), (33, 8, 1024)]:
    q, k, v = (torch.randn(batch, heads, n, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = sdpa(BACKENDS["cuDNN"], q, k, v, False).float()
    fns = {"attention()": lambda: attention(q, k, v), **{name: (lambda cfg=cfg: sm90_variant(q, k, v, False, cfg))
                                                         for name, cfg in configs.items()},
           "cuDNN": lambda: sdpa(BACKENDS["cuDNN"], q, k, v, False), "flash": lambda: sdpa(BACKENDS["flash"], q, k, v, False)}
    for name, fn in fns.items():
        err = ((fn().float() - ref).norm() / ref.norm()).item()
        assert err < 2e-2, (name, err)
    times = {name: [] for name in fns}
    for _ in range(7):
        for name, fn in fns.items():
            times[name].append(time_ms(fn, 30))
    flops = 4 * batch * heads * n * n * 64
    tf = {name: flops / (statistics.median(t) * 1e-3) / 1e12 for name, t in times.items()}
    print(f"B={batch} H={heads} N={n} D=64 not causal ({batch * heads * n // 128} tiles of 128 rows)")
    for name, value in tf.items():
        print(f"  {name:12s} {value:6.0f} TFLOP/s  /cuDNN {value / tf['cuDNN']:.3f}  /flash {value / tf['flash']:.3f}")
