"""attention() beside candidate attention_sm90 configurations (launched as attention() launches its own), cuDNN
and flash, at N = 1024 and 4096 (B·N = 16384, H = 16): TFLOP/s, median of 30 launches × 5 interleaved rounds
(--rounds), every output checked against cuDNN first. One line per implementation. sums each step: LATE_SUMS=0
(attention() exchanges the row sums' lane parts once a tile); at D=64 under 2048 keys a producer of 24 registers
a thread (lean), warpgroup 1 a key step behind warpgroup 0 (stagger 1) and the next tile's first Q·Kᵀ under this
one's epilogue (DEFER=3: tile loop rotated) beside attention()'s configuration.
    python bench/probe_candidates.py [--dims 64 128] [--causal 0 1] [--seqlens 1024 4096] [--rounds 5]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import check_outputs, compare, print_rates, probe_arguments, probe_inputs  # noqa: E402

from attention import BACKENDS, sdpa, sm90_variant  # noqa: E402
from tkc.kernels import attention  # noqa: E402


def candidates(d: int, causal: bool, n: int) -> dict[str, dict[str, int]]:
    from tkc.kernels.attention import sm90_config

    own = sm90_config(d, n, n, causal)  # attention()'s configuration at this length
    found = {"sums each step": {**own, "LATE_SUMS": 0}}
    if d == 64 and own.get("DEFER") == 2:  # attention()'s short D=64 configuration
        found["lean producer"] = {**own, "PRODUCER": 2}
        found["stagger 1"] = {**own, "STAGGER": 1}
        found["tile loop rotated"] = {**own, "DEFER": 3}
        found["tile loop rotated, stagger 1"] = {**own, "DEFER": 3, "STAGGER": 1}
    return found


if __name__ == "__main__":
    args = probe_arguments([64, 128], [1024, 4096], 5)
    for d, causal, n, q, k, v in probe_inputs(args):
        batch, heads = q.shape[:2]
        ref = sdpa(BACKENDS["cuDNN"], q, k, v, causal)
        fns = {"attention()": lambda: attention(q, k, v, causal=causal)}
        for name, cfg in candidates(d, causal, n).items():
            fns[name] = lambda cfg=cfg: sm90_variant(q, k, v, causal, cfg)
        fns["cuDNN"] = lambda: sdpa(BACKENDS["cuDNN"], q, k, v, causal)
        fns["flash"] = lambda: sdpa(BACKENDS["flash"], q, k, v, causal)
        check_outputs(fns, ref, where=f"D={d} causal={int(causal)} N={n}")
        print_rates(f"D={d} causal={int(causal)} N={n}", compare(fns, rounds=args.rounds),
                    4 * batch * heads * n * n * d / (2 if causal else 1))
