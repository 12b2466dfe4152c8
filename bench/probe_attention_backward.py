"""Attention backward, piece by piece: the log-sum-exp of each forward path against float64, each backward kernel's
gradients (compiled for sm_80 and for sm_90a) from the float64 O and L, and each kernel's time.

    python bench/probe_attention_backward.py [--shapes B,H,N,D ...] [--causal 0 1]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import rel_err, time_ms  # noqa: E402

from tkc.kernels import attention  # noqa: E402
from tkc.kernels.attention_bwd import (CONFIG, attention_bwd_delta, attention_bwd_dkdv, attention_bwd_dkdv_sm90,  # noqa: E402
                                      attention_bwd_dq, attention_bwd_dq_scale, attention_bwd_dq_sm90,
                                      attention_bwd_sm90, dkdv_blocks)


def reference(q, k, v, grad, causal: bool, scale: float):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    s = leaves[0] @ leaves[1].transpose(-1, -2) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), -math.inf)
    out = torch.softmax(s, -1) @ leaves[2]
    return (out, torch.logsumexp(s, -1), *torch.autograd.grad(out, leaves, grad.double()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="+", default=["1,4,4096,64", "16,16,1024,64", "4,16,1024,64", "1,4,4096,128"])
    parser.add_argument("--causal", type=int, nargs="+", default=[0])
    parser.add_argument("--configs", nargs="*", default=[],
                        help="more (target, dkdv constants, dq constants) to try, as JSON lists (target \"sm90\": the "
                             "wgmma kernels; \"sm90-fused\": attention_bwd_sm90, dQ by atomics, then its scaling): "
                             '\'["sm_80", {"QUERIES": 64}, {"KEYS": 32}]\'')
    parser.add_argument("--no-mma-sync", action="store_true", help="only the --configs, not the mma.sync kernels' builds")
    args = parser.parse_args()
    for shape in args.shapes:
        b, h, n, d = map(int, shape.split(","))
        for causal in map(bool, args.causal):
            q, k, v, grad = (torch.randn(b, h, n, d, device="cuda").to(torch.bfloat16) for _ in range(4))
            scale = d**-0.5
            out_ref, lse_ref, dq_ref, dk_ref, dv_ref = reference(q, k, v, grad, causal, scale)
            where = f"B={b} H={h} N={n} D={d} causal={int(causal)}"
            for target in ("sm_80", None):
                out, lse = attention(q, k, v, causal=causal, return_lse=True, target=target)
                print(f"{where} forward {target or 'default'}: out {rel_err(out, out_ref):.2e}  lse max abs err "
                      f"{(lse.double() - lse_ref).abs().max().item():.2e}", flush=True)
            o, lse = out_ref.to(torch.bfloat16), lse_ref.float()
            grid = (n // 64, h, b)
            configs = [] if args.no_mma_sync else [("sm_80", *CONFIG[d]), ("sm_90a", *CONFIG[d])]
            configs += [tuple(json.loads(c)) for c in args.configs]
            for target, dkdv_cfg, dq_cfg in configs:
                # steps that do not divide N (48-query steps): the last one masked, as attention_backward() asks
                dkdv_cfg = {"RAGGED": int(n % dkdv_cfg.get("QUERIES", 64) > 0), **dkdv_cfg}
                dq_cfg = {"RAGGED": int(n % dq_cfg.get("KEYS", 64) > 0), **dq_cfg}
                delta = torch.full((b, h, n), math.nan, device="cuda")
                dq, dk, dv = (torch.full_like(q, math.nan) for _ in range(3))
                fused = target == "sm90-fused"  # dK, dV and dQ (by atomics) in one wgmma kernel
                wgmma = target.startswith("sm90")  # the wgmma kernels (attention_bwd_*_sm90), eight warps by default
                dkdv_kernel, dq_kernel = ((attention_bwd_dkdv_sm90, attention_bwd_dq_sm90) if wgmma
                                          else (attention_bwd_dkdv, attention_bwd_dq))
                build = "sm_90a" if wgmma else target
                kv_grid, q_grid = ((n // (16 * c.get("WARPS", 8 if wgmma else 4)), h, b) for c in (dkdv_cfg, dq_cfg))
                kv_grid = (dkdv_blocks(n, d, {"WARPS": 8 if wgmma else 4, **dkdv_cfg}), h, b)
                dq_sum = torch.full(q.shape, math.nan, device="cuda")
                runs = {
                    "delta": lambda: attention_bwd_delta[grid](o, grad, lse, delta, D=d, target="sm_80"),
                    "dkdv": lambda: dkdv_kernel[kv_grid](q, k, v, grad, lse, delta, dk, dv, scale, D=d,
                                                         CAUSAL=int(causal), **dkdv_cfg, target=build),
                    "dq": lambda: dq_kernel[q_grid](q, k, v, grad, lse, delta, dq, scale, D=d,
                                                    CAUSAL=int(causal), **dq_cfg, target=build),
                }
                if fused:  # "dkdv": zeroing dQ_sum and the fused kernel; "dq": its scaling into bf16
                    runs["dkdv"] = lambda: (dq_sum.zero_(), attention_bwd_sm90[kv_grid[1], kv_grid[0], b](
                        q, k, v, grad, lse, delta, dk, dv, dq_sum, scale, D=d, CAUSAL=int(causal), **dkdv_cfg,
                        target=build))
                    runs["dq"] = lambda: attention_bwd_dq_scale[grid](dq_sum, dq, scale, D=d, target="sm_80")
                for run in runs.values():
                    run()
                errors = f"dq {rel_err(dq, dq_ref):.2e} dk {rel_err(dk, dk_ref):.2e} dv {rel_err(dv, dv_ref):.2e}"
                times = {name: time_ms(run) for name, run in runs.items()}
                flops = 2 * b * h * n * n * d / (2 if causal else 1)  # one product
                print(f"{where} backward {target} {dkdv_cfg} {dq_cfg}: {errors};  µs delta {times['delta'] * 1e3:.0f} dkdv {times['dkdv'] * 1e3:.0f} "
                      f"({(5 if fused else 4) * flops / times['dkdv'] / 1e9:.0f} TFLOP/s) dq {times['dq'] * 1e3:.0f} "
                      f"({0 if fused else 3 * flops / times['dq'] / 1e9:.0f} TFLOP/s) total "
                      f"{sum(times.values()) * 1e3:.0f} ({5 * flops / sum(times.values()) / 1e9:.0f} TFLOP/s)",
                      flush=True)


if __name__ == "__main__":
    main()
