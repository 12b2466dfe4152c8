"""attention() beside candidate attention_sm90 configurations (launched as attention() launches its own), cuDNN
and flash, at N = 1024 and 4096 (B·N = 16384, H = 16): TFLOP/s, median of 30 launches × 5 interleaved rounds (--rounds),
every output checked against cuDNN first. One line per implementation. TMA-st: O stored by TMA; skip: O's
rescale skipped in steps where no row's maximum moved; lean: a 24-register producer warpgroup (producer=2);
    python bench/probe_candidates.py [--dims 64 128] [--causal 0 1] [--seqlens 1024 4096] [--rounds 5]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import check_outputs, compare, print_rates, probe_arguments, probe_inputs  # noqa: E402

from attention import BACKENDS, sdpa, sm90_variant  # noqa: E402
from tkc.kernels import attention  # noqa: E402

REGS = {"WARPS": 8, "PRODUCER": 1, "Q_REGS": 1}
# FlashAttention-3's two-stage pipelining with 128-key steps: P·V_{j-1} and Q·Kᵀ_{j+1} both under softmax_j; the
# queries in shared memory and a 24-register producer (producer=2) leave the two S tiles room in registers
OVERLAPPED = {"WARPS": 8, "PRODUCER": 2, "KEYS": 128, "DEFER": 1, "OVERLAP": 1}


def candidates(d: int, causal: bool) -> dict[str, dict[str, int]]:
    from tkc.kernels.attention import sm90_config

    own = sm90_config(d, 1024, 1024, causal)  # attention()'s configuration at N = 1024
    found = {}
    if d == 128:
        found["attention() lean"] = {**own, "PRODUCER": 2}
        grid = {"TILES": 2} if causal else {"PERSISTENT": 1}
        found["pingpong K128"] = {**REGS, "KEYS": 128, "DEFER": 2, "PINGPONG": 1, **grid}
        found["pingpong K128 D3"] = {**REGS, "KEYS": 128, "DEFER": 3, "PINGPONG": 1, **grid}
        found["pingpong K128 lean"] = {**REGS, "KEYS": 128, "DEFER": 2, "PINGPONG": 1, "PRODUCER": 2, **grid}
        return found
    # attention()'s short configuration (a 24-register producer) with the row sums' lane parts exchanged once a
    # tile (late sums), warpgroup 1 started 1 or 2 key steps after warpgroup 0 (stagger: their tile ends apart)
    found["short late sums"] = {**own, "LATE_SUMS": 1}
    found["short stagger 1"] = {**own, "STAGGER": 1}
    found["short stagger 2, 4 stages"] = {**own, "STAGGER": 2, "STAGES": 4}
    found["short stagger 1, late sums"] = {**own, "STAGGER": 1, "LATE_SUMS": 1}
    return found


args = probe_arguments([64, 128], [1024, 4096], 5)
for d, causal, n, q, k, v in probe_inputs(args):
    batch, heads = q.shape[:2]
    ref = sdpa(BACKENDS["cuDNN"], q, k, v, causal)
    fns = {"attention()": lambda: attention(q, k, v, causal=causal)}
    for name, cfg in candidates(d, causal).items():
        fns[name] = lambda cfg=cfg: sm90_variant(q, k, v, causal, cfg)
    fns["cuDNN"] = lambda: sdpa(BACKENDS["cuDNN"], q, k, v, causal)
    fns["flash"] = lambda: sdpa(BACKENDS["flash"], q, k, v, causal)
    check_outputs(fns, ref, where=f"D={d} causal={int(causal)} N={n}")
    print_rates(f"D={d} causal={int(causal)} N={n}", compare(fns, rounds=args.rounds),
                4 * batch * heads * n * n * d / (2 if causal else 1))
