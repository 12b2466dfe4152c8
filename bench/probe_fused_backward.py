"""Where attention_bwd_sm90's time goes: the fused kernel as it is, with DEFER_DQ=1 (each step's dQ added in the
next, its wgmma left running), with DS_BUFFERS=2 (dSᵀ in two buffers: no write-after-read barrier), both, without
its TMA reductions (left out of the PTX, the staging stores kept so that the dQ product stays: wgmma results are
Pure and would otherwise go), and the two-kernel path's dkdv kernel alone.
Each variant in its own process (the compile cache cannot tell a patched lowering from the real one):

    for v in fused defer ds2 defer-ds2 noreduce dkdv; do TKC_CACHE_DIR=/tmp/tkc-$v python bench/probe_fused_backward.py $v; done
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import time_ms  # noqa: E402

import tkc.backend.lower_memory  # noqa: E402,F401  (imported before lower_tma_store is patched)
import tkc.backend.lower_tma as lower_tma  # noqa: E402
from tkc.backend import ptx  # noqa: E402
from tkc.kernels.attention_bwd import attention_bwd_dkdv_sm90, attention_bwd_sm90  # noqa: E402


def leave_out_reductions() -> None:
    """TMA reductions lower to everything but their cp.reduce.async.bulk: the cost of the bytes they add."""
    original = lower_tma.lower_tma_store

    def without_the_reduction(lw, op, reduce=None):  # noqa: ANN001, ANN202
        if reduce is None:
            return original(lw, op)
        emit = lw.emit
        lw.emit = lambda o: None if isinstance(o, ptx.TmaStoreOp) else emit(o)
        try:
            original(lw, op, reduce)
        finally:
            lw.emit = emit

    lower_tma.lower_tma_store = without_the_reduction


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("variant", choices=["fused", "defer", "ds2", "defer-ds2", "noreduce", "dkdv"])
    parser.add_argument("--shapes", nargs="+", default=["4,16,4096,128", "4,16,4096,64"])
    parser.add_argument("--configs", default='{"128": {"STAGES": 3}, "64": {"WARPS": 4, "STAGES": 3}}',
                        help="constants by head dim, as JSON")
    args = parser.parse_args()
    if args.variant == "noreduce":
        leave_out_reductions()
    configs = json.loads(args.configs)
    for shape in args.shapes:
        b, h, n, d = map(int, shape.split(","))
        cfg = configs[str(d)] | ({"DEFER_DQ": 1} if "defer" in args.variant else {}) | (
            {"DS_BUFFERS": 2} if "ds2" in args.variant else {})
        warps = cfg.get("WARPS", 8)
        for causal in (0, 1):
            q, k, v, do = (torch.randn(b, h, n, d, device="cuda").to(torch.bfloat16) for _ in range(4))
            lse, delta = torch.randn(b, h, n, device="cuda") + 5, torch.randn(b, h, n, device="cuda")
            dk, dv, dq_sum = torch.empty_like(k), torch.empty_like(v), torch.zeros(b, h, n, d, device="cuda")
            if args.variant == "dkdv":
                def run() -> None:
                    attention_bwd_dkdv_sm90[(n // (16 * warps), h, b)](q, k, v, do, lse, delta, dk, dv, 0.1, D=d,
                                                                       CAUSAL=causal, **cfg, target="sm_90a")
            else:
                def run() -> None:
                    attention_bwd_sm90[(h, n // (16 * warps), b)](q, k, v, do, lse, delta, dk, dv, dq_sum, 0.1, D=d,
                                                                  CAUSAL=causal, **cfg, target="sm_90a")
            run()
            torch.cuda.synchronize()
            print(f"{args.variant:9s} B={b} H={h} N={n} D={d} causal={causal} {cfg}: {time_ms(run, 20) * 1e3:.0f} µs",
                  flush=True)


if __name__ == "__main__":
    main()
