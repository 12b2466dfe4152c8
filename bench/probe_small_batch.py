"""attention() at small batches (B·N = 1024 or 2048, H = 16: one or two sequences), where the grid has few tiles,
beside configurations that give it more: shorter query tiles (the short configuration) and fewer query blocks a
block (TILES), and cuDNN / flash. TFLOP/s, median of 30 launches × 5 interleaved rounds, outputs checked first.
    python bench/probe_small_batch.py [--tokens 1024 2048] [--rounds 5]"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention import compare_candidates  # noqa: E402

from tkc.kernels.attention import sm90_config  # noqa: E402

SHAPES = [(64, 0, 1024), (64, 0, 2048), (64, 0, 4096), (64, 1, 2048), (64, 1, 4096), (128, 0, 1024),
          (128, 1, 1024), (128, 1, 2048)]


def candidates(d: int, causal: bool, n: int) -> dict[str, dict[str, int]]:
    own = sm90_config(d, n, n, causal)
    short = {k: v for k, v in sm90_config(d, 1024, 1024, causal).items() if k not in ("PERSISTENT", "TILES")}
    found = {"short, persistent": {**short, "PERSISTENT": 1}}
    for tiles in (1, 2):
        found[f"short, {tiles} tiles a block"] = {**short, "TILES": tiles}
    if own.get("TILES", 1) > 1 or own.get("PERSISTENT"):
        base = {k: v for k, v in own.items() if k not in ("PERSISTENT", "TILES")}
        found["own, 1 tile a block"] = base
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    for tokens in args.tokens:
        for d, causal, n in SHAPES:
            if n > tokens * 4:
                continue
            b = max(1, tokens // n)
            q, k, v = (torch.randn(b, 16, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            compare_candidates(q, k, v, bool(causal), candidates(d, bool(causal), n),
                               f"D={d} causal={causal} N={n} B={b}", args.rounds)


if __name__ == "__main__":
    main()
