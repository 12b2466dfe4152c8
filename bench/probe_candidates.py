"""attention() beside candidate attention_sm90 configurations (launched as attention() launches its own), cuDNN
and flash, at N = 1024 and 4096 (B·N = 16384, H = 16): TFLOP/s, median of 30 launches × 5 interleaved rounds,
every output checked against cuDNN first. One line per implementation. TMA-st: O stored by TMA; skip: O's
rescale skipped in steps where no row's maximum moved.
    python bench/probe_candidates.py [--dims 64 128] [--causal 0 1] [--seqlens 1024 4096]"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import check_outputs, compare, print_rates  # noqa: E402

from attention import BACKENDS, sdpa, sm90_variant  # noqa: E402
from tkc.kernels import attention  # noqa: E402

REGS = {"WARPS": 8, "PRODUCER": 1, "Q_REGS": 1}
OVERLAPPED = {**REGS, "KEYS": 64, "DEFER": 1, "OVERLAP": 1}


def candidates(d: int, causal: bool) -> dict[str, dict[str, int]]:
    grid = {"TILES": 2} if causal and d == 128 else {"PERSISTENT": 1}
    found = {"overlap K64": {**OVERLAPPED, **grid}, "overlap K64 S5": {**OVERLAPPED, "STAGES": 5, **grid},
             "overlap K64 T2": {**OVERLAPPED, "TILES": 2}, "pingpong K128": {**REGS, "KEYS": 128, "DEFER": 2,
                                                                              "PINGPONG": 1, **grid}}
    found["overlap K64 TMA-st"] = {**OVERLAPPED, "TMA_STORE": 1, **grid}
    if d == 128:
        found["overlap K64 Qsh"] = {**{k: v for k, v in OVERLAPPED.items() if k != "Q_REGS"}, **grid}
    else:  # attention()'s short configuration with O stored by TMA, or O's rescale skipped when no maximum moved
        found["K128 peeled TMA-st"] = {**REGS, "KEYS": 128, "DEFER": 2, "TMA_STORE": 1, "PERSISTENT": 1}
        found["K128 peeled skip"] = {**REGS, "KEYS": 128, "DEFER": 2, "SKIP_RESCALE": 1, "PERSISTENT": 1}
    found["overlap K64 skip"] = {**OVERLAPPED, "SKIP_RESCALE": 1, **grid}
    return found


parser = argparse.ArgumentParser()
parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
parser.add_argument("--causal", type=int, nargs="+", default=[0, 1])
parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096])
args = parser.parse_args()
torch.manual_seed(0)
for d in args.dims:
    for causal in map(bool, args.causal):
        for n in args.seqlens:
            batch, heads = 16384 // n, 16
            q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            ref = sdpa(BACKENDS["cuDNN"], q, k, v, causal)
            fns = {"attention()": lambda: attention(q, k, v, causal=causal)}
            for name, cfg in candidates(d, causal).items():
                fns[name] = lambda cfg=cfg: sm90_variant(q, k, v, causal, cfg)
            fns["cuDNN"] = lambda: sdpa(BACKENDS["cuDNN"], q, k, v, causal)
            fns["flash"] = lambda: sdpa(BACKENDS["flash"], q, k, v, causal)
            check_outputs(fns, ref, where=f"D={d} causal={int(causal)} N={n}")
            print_rates(f"D={d} causal={int(causal)} N={n}", compare(fns, rounds=5),
                        4 * batch * heads * n * n * d / (2 if causal else 1))
