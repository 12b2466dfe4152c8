"""attention() beside candidate attention_sm90 configurations (launched as attention() launches its own), cuDNN
and flash, at N = 1024 and 4096 (B·N = 16384, H = 16): TFLOP/s, median of 30 launches × 5 interleaved rounds
(--rounds), every output checked against cuDNN first. One line per implementation. late P·V: LATE_PV=1 (the
deferred P·V issued after the step's row max, not right behind its Q·Kᵀ: ptxas spreads its wgmmas through the
softmax), at D=64 (DEFER=1 or 2) also with a 24-register producer (lean) or 4 stages; at D=64 causal with
N < 4096 the short configuration on tiled grids; at D=128 causal below 4096 keys DEFER=2 on grids of 2-4 query blocks a
block; at D = 64 and 128 K and V in rings apart; at D=256 one ring for K and V, or three stages.
    python bench/probe_candidates.py [--dims 64 128] [--causal 0 1] [--seqlens 1024 4096] [--rounds 5] [--only RE]"""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import probe_arguments, probe_inputs  # noqa: E402

from attention import compare_candidates, one_ring_d256  # noqa: E402


def candidates(d: int, causal: bool, n: int) -> dict[str, dict[str, int]]:
    from tkc.kernels.attention import LONG_KEYS, sm90_config

    own = sm90_config(d, n, n, causal)  # attention()'s configuration at this length
    found = {}
    if own.get("DEFER") in (1, 2) and not own.get("LATE_PV"):  # P·V issued after the row max (D=64)
        found["late P·V"] = {**own, "LATE_PV": 1}
    if d == 64 and own.get("DEFER") == 2 and not causal:  # attention()'s short D=64 configuration
        found["late P·V, lean producer"] = {**own, "LATE_PV": 1, "PRODUCER": 2}
        found["late P·V, 4 stages"] = {**own, "LATE_PV": 1, "STAGES": 4}
    if d == 64 and causal and n < LONG_KEYS:  # causal below 4096 keys: the short configuration on tiled grids
        short = {k: v for k, v in sm90_config(d, 1024, 1024, causal).items() if k != "PERSISTENT"}
        for tiles in (2, 3, 4):
            found[f"short, {tiles} tiles a block"] = {**short, "TILES": tiles}
        found["long (W12), 2 tiles a block"] = {**sm90_config(d, LONG_KEYS, LONG_KEYS, causal), "TILES": 2}
    if d == 128 and causal and n < LONG_KEYS:  # causal short sequences (DEFER=2 gained 4-6% at N=512/1024, 07:33)
        for tiles in (2, 3, 4):
            found[f"defer 2, {tiles} tiles a block"] = {**own, "DEFER": 2, "TILES": tiles}
    if d in (64, 128):  # K and V with barriers of their own (K refilled once Q·Kᵀ is done), step 0 peeled
        found["K and V rings apart"] = {**own, "SPLIT_RING": 1, "DEFER": 2}
        if own.get("STAGES", 3) > 2:
            found["K and V rings apart, 2 stages"] = {**own, "SPLIT_RING": 1, "DEFER": 2, "STAGES": 2}
    if d == 256:  # attention() keeps K and V in rings apart (RESULTS "head dim 256, K and V rings apart —
        # 2026-12-06"); beside it one ring for both (as before), 64-key steps, and three stages: of 48 keys, or of 64
        # beside half of Q's columns in registers (225 KB), with rings apart or one ring
        one_ring = one_ring_d256(own, causal)
        found["one ring for K and V"] = one_ring
        found["64-key steps"] = {**own, "KEYS": 64, "PRODUCER": 2}
        found["3 stages of 48 keys"] = {**own, "KEYS": 48, "STAGES": 3}
        half_q = {"Q_REGS": 2, "KEYS": 64, "STAGES": 3, "PRODUCER": 2}
        found["half Q in registers, 3 stages of 64 keys"] = {**own, **half_q}
        found["one ring, half Q in registers, 3 stages of 64 keys"] = {**one_ring, **half_q}
        if causal and n < LONG_KEYS:  # short causal (0.93x cuDNN at N = 1024): the long configuration, other grids
            found["80-key steps, lean producer"] = {**own, "KEYS": 80, "PRODUCER": 2}
            for tiles in (1, 4):
                found[f"{tiles} tile{'s' * (tiles > 1)} a block"] = {**own, "TILES": tiles}
    return found


if __name__ == "__main__":
    args = probe_arguments([64, 128], [1024, 4096], 5, only=True)
    for d, causal, n, q, k, v in probe_inputs(args):
        chosen = {name: cfg for name, cfg in candidates(d, causal, n).items() if re.search(args.only, name)}
        compare_candidates(q, k, v, causal, chosen, f"D={d} causal={int(causal)} N={n}", args.rounds)
