"""attention() beside attention_sm90 with every N-th exponential on the FMA pipe (EXP2_POLY=N), cuDNN and flash:
TFLOP/s, median of 30 launches × 5 interleaved rounds, each output checked against cuDNN first."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import check_outputs, compare, print_rates  # noqa: E402

from attention import BACKENDS, sdpa, sm90_variant  # noqa: E402
from tkc.kernels import attention  # noqa: E402
from tkc.kernels.attention import sm90_config  # noqa: E402

torch.manual_seed(0)
for d, causal, n, polys in [(64, 0, 1024, (3, 4, 6, 8)), (64, 1, 1024, (4, 6)), (128, 0, 1024, (4, 8)),
                            (128, 0, 4096, (4, 8)), (64, 0, 4096, (4, 8))]:
    batch, heads = 16384 // n, 16
    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = sdpa(BACKENDS["cuDNN"], q, k, v, bool(causal))
    cfg = sm90_config(d, n, n, bool(causal))
    fns = {"attention()": lambda: attention(q, k, v, causal=bool(causal))}
    for every in polys:
        fns[f"EXP2_POLY={every}"] = lambda every=every: sm90_variant(q, k, v, bool(causal), {**cfg, "EXP2_POLY": every})
    fns["cuDNN"] = lambda: sdpa(BACKENDS["cuDNN"], q, k, v, bool(causal))
    fns["flash"] = lambda: sdpa(BACKENDS["flash"], q, k, v, bool(causal))
    check_outputs(fns, ref, where=f"D={d} causal={causal} N={n}")
    print_rates(f"D={d} causal={causal} N={n} {cfg}", compare(fns, rounds=5),
                4 * batch * heads * n * n * d / (2 if causal else 1))
