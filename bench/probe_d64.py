"""attention() at D=64, N=1024 (B=16, H=16, not causal) beside attention_sm90 with other pipeline depths and
grids, cuDNN and flash: where the short-sequence D=64 configuration stands. Prints one line per implementation."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import check_outputs, compare, print_rates  # noqa: E402

from attention import BACKENDS, sdpa, sm90_variant  # noqa: E402
from tkc.kernels import attention  # noqa: E402

torch.manual_seed(0)
base = {"KEYS": 128, "WARPS": 8, "DEFER": 2, "PRODUCER": 1, "Q_REGS": 1, "PERSISTENT": 1}
configs = {"STAGES=2": {**base, "STAGES": 2}, "STAGES=4": {**base, "STAGES": 4}, "STAGES=5": {**base, "STAGES": 5},
           "DEFER=1": {**base, "DEFER": 1}, "TILES=2": {**{k: v for k, v in base.items() if k != "PERSISTENT"}, "TILES": 2},
           "TILES=1": {k: v for k, v in base.items() if k != "PERSISTENT"}}
for batch, heads, n in [(16, 16, 1024), (33, 8, 1024)]:
    q, k, v = (torch.randn(batch, heads, n, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = sdpa(BACKENDS["cuDNN"], q, k, v, False)
    fns = {"attention()": lambda: attention(q, k, v), **{name: (lambda cfg=cfg: sm90_variant(q, k, v, False, cfg))
                                                         for name, cfg in configs.items()},
           "cuDNN": lambda: sdpa(BACKENDS["cuDNN"], q, k, v, False), "flash": lambda: sdpa(BACKENDS["flash"], q, k, v, False)}
    check_outputs(fns, ref, 2e-2)
    print_rates(f"B={batch} H={heads} N={n} D=64 not causal ({batch * heads * n // 128} tiles of 128 rows)",
                compare(fns, rounds=7), 4 * batch * heads * n * n * 64)
