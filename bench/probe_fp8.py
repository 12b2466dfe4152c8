"""scaled_mm_kernel configurations beside scaled_mm(), torch._scaled_mm (cuBLASLt) and bf16 cuBLAS: TFLOP/s and
the ratio to cuBLASLt, per-tensor scales, every output checked against cuBLASLt's first. Candidates differ in
the tile (rows: 16·WARPS, BN), the ring's depth, a producer warpgroup and the grouping of tiles; each runs on a
persistent grid of at most the blocks the GPU holds.

    python bench/probe_fp8.py [--sizes 4096 8192] [--only REGEX] [--rounds 3]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import check_outputs, compare, print_rates  # noqa: E402

from tkc.kernels import scaled_mm  # noqa: E402
from tkc.kernels._checks import cdiv  # noqa: E402
from tkc.kernels.scaled_mm import scaled_mm_kernel  # noqa: E402

CANDIDATES = {  # every one fits the 227 KB of shared memory and assembles without spills (CPU: test_scaled_mm.py)
    "W8 BN=256 3st (shipped)": {"WARPS": 8, "BN": 256, "STAGES": 3},
    "W8 BN=256 3st producer": {"WARPS": 8, "BN": 256, "STAGES": 3, "PRODUCER": 1},
    "W8 BN=256 2st": {"WARPS": 8, "BN": 256, "STAGES": 2},
    "W8 BN=256 3st G16": {"WARPS": 8, "BN": 256, "STAGES": 3, "GROUP_M": 16},
    "W8 BN=128 4st": {"WARPS": 8, "BN": 128, "STAGES": 4},
    "W8 BN=128 6st producer": {"WARPS": 8, "BN": 128, "STAGES": 6, "PRODUCER": 1},
    "W12 BN=256 3st no TMA store": {"WARPS": 12, "BN": 256, "STAGES": 3, "TMA_STORE": 0},
    "W4 BN=256 4st": {"WARPS": 4, "BN": 256, "STAGES": 4},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--only", default="", help="a regex: only the candidates it finds")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for n in args.sizes:
        a = (torch.randn(n, n, device="cuda") * 2).to(torch.float8_e4m3fn)
        weight = (torch.randn(n, n, device="cuda") * 2).to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        a16, w16 = a.to(torch.bfloat16), weight.to(torch.bfloat16)
        out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        impls = {"scaled_mm()": lambda: scaled_mm(a, weight.t(), one, one),
                 "cuBLASLt": lambda: torch._scaled_mm(a, weight.t(), one, one, out_dtype=torch.bfloat16),
                 "bf16 cuBLAS": lambda: torch.matmul(a16, w16.t())}
        for name, cfg in CANDIDATES.items():
            if args.only and not re.search(args.only, name):
                continue
            cfg = {"BK": 128, "TMA_STORE": 1, **cfg}
            spec = scaled_mm_kernel.specialize(target="sm_90a", **cfg)
            call = (a, weight, one.reshape(1), one.reshape(1), out)
            grid = (min(cdiv(n, 16 * cfg["WARPS"]) * cdiv(n, cfg["BN"]), spec.resident_blocks(*call)),)
            impls[name] = lambda spec=spec, grid=grid, call=call: spec[grid](*call) or out
        check_outputs(impls, impls["cuBLASLt"]().float(), where=f"{n}³")
        print_rates(f"{n}³", compare(impls, args.rounds), 2 * n**3, peers=("cuBLASLt",))


if __name__ == "__main__":
    main()
