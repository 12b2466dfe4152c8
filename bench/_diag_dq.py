"""dq of attention_bwd_dq's sm_90a build at D=64 against float64, by head, 64-row block and warp."""
import math, sys
import torch
sys.path.insert(0, "bench")
from probe_attention_backward import reference
from tkc.kernels.attention_bwd import attention_bwd_dq
for (b, h, n), keys in [((1, 1, 4096), 64), ((1, 4, 4096), 64), ((4, 1, 1024), 64), ((1, 1, 512), 64), ((1, 1, 4096), 32)]:
    d = 64
    q, k, v, grad = (torch.randn(b, h, n, d, device="cuda").to(torch.bfloat16) for _ in range(4))
    out, lse, dq_ref, _, _ = reference(q, k, v, grad, False, d ** -0.5)
    o = out.to(torch.bfloat16)
    delta = (grad.double() * o.double()).sum(-1).float()
    for target in ("sm_80", "sm_90a"):
        dq = torch.full_like(q, math.nan)
        attention_bwd_dq[(n // 64, h, b)](q, k, v, grad, lse.float(), delta, dq, d ** -0.5, D=d, KEYS=keys, target=target)
        torch.cuda.synchronize()
        err = (dq.double() - dq_ref).norm(dim=-1) / dq_ref.norm(dim=-1)   # per row
        per_block = err.view(b, h, n // 64, 64).amax(-1)
        per_warp = err.view(b, h, n // 64, 4, 16).amax(-1).amax(2)
        per_lane_row = err.view(b, h, n // 64, 4, 16).amax(2).amax(2)
        print(f"B={b} H={h} N={n} KEYS={keys} {target}: max {err.max().item():.2e}; blocks(first head) "
              f"{[round(x, 3) for x in per_block[0, 0, :8].tolist()]} ... warps {[round(x, 3) for x in per_warp[0, 0].tolist()]} "
              f"rows-in-warp {[round(x, 2) for x in per_lane_row[0, 0].tolist()]}", flush=True)
        bad = (err > 1e-2).nonzero()
        if len(bad):
            print("   first bad rows:", bad[:6].tolist(), "count", len(bad), "of", err.numel(), flush=True)
