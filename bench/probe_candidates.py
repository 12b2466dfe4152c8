"""attention() beside candidate attention_sm90 configurations (launched as attention() launches its own), cuDNN
and flash, at N = 1024 and 4096 (B·N = 16384, H = 16): TFLOP/s, median of 30 launches × 5 interleaved rounds
(--rounds), every output checked against cuDNN first. One line per implementation. late P·V: LATE_PV=1 (the
deferred P·V issued after the step's row max, not right behind its Q·Kᵀ: ptxas spreads its wgmmas through the
softmax), at D=64 (DEFER=1 or 2) also with a 24-register producer (lean) or 4 stages; at D=64 causal with
N < 4096 the short configuration on tiled grids; at D=128 causal below 4096 keys DEFER=2 on grids of 2-4 query blocks a
block; at D=256 the warpgroups in ping-pong or staggered a step.
    python bench/probe_candidates.py [--dims 64 128] [--causal 0 1] [--seqlens 1024 4096] [--rounds 5]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import probe_arguments, probe_inputs  # noqa: E402

from attention import compare_candidates  # noqa: E402


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
    if d == 256:  # the warpgroups taking turns at the tensor cores (as FlashAttention-3's D = 256), or one started
        # a step behind the other, beside attention()'s deferred P·V
        found["ping-pong"] = {**own, "PINGPONG": 1}
        found["ping-pong, 64-key steps"] = {**own, "PINGPONG": 1, "KEYS": 64}
        found["staggered a step"] = {**own, "STAGGER": 1}
        # half of Q's columns in registers: Q·Kᵀ reads 3/4 of the shared-memory bytes a step (is its traffic the limit?)
        found["half Q in registers, 64-key steps"] = {**own, "Q_REGS": 2, "KEYS": 64, "PRODUCER": 2, "DEFER": 1}
        # three stages of 48 keys (two of 64 or 80 leave the ring no slack once P·V's release lags a step: at D=128
        # two stages read 0.67x cuDNN against three's 1.00, RESULTS "attention — 2026-12-03 13:11")
        found["48-key steps, 3 stages"] = {**own, "KEYS": 48, "STAGES": 3}
        # K and V with barriers of their own: K's stage refilled once Q·Kᵀ is done, V's a step late (FA3's two
        # pipelines), so that two stages still load a step ahead
        found["K and V rings apart"] = {**own, "SPLIT_RING": 1, "DEFER": 2}
        found["K and V rings apart, 64-key steps"] = {**own, "SPLIT_RING": 1, "DEFER": 2, "KEYS": 64}
        # half of Q in registers leaves room for three stages of 64 keys (225 KB)
        found["half Q in registers, 3 stages of 64 keys"] = {**own, "Q_REGS": 2, "KEYS": 64, "STAGES": 3,
                                                             "PRODUCER": 2, "DEFER": max(own.get("DEFER", 1), 1)}
    return found


if __name__ == "__main__":
    args = probe_arguments([64, 128], [1024, 4096], 5)
    for d, causal, n, q, k, v in probe_inputs(args):
        compare_candidates(q, k, v, causal, candidates(d, causal, n), f"D={d} causal={int(causal)} N={n}", args.rounds)
