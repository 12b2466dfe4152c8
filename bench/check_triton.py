"""Checks bench/triton_kernels.py (the Triton benchmark peers) against float32 torch references on a CUDA GPU.

    python bench/check_triton.py

Prints one line per check (relative error ‖out − ref‖ / ‖ref‖, which must stay below 1e-2) and exits non-zero if
any check fails. Shapes include edges that are not multiples of the block sizes, to exercise the masks.
"""

from __future__ import annotations

import sys
from pathlib import Path

TOL = 1e-2


def _rel_err(out, ref) -> float:
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm()).item()


def _report(name: str, errs: list[float]) -> bool:
    ok = all(e < TOL for e in errs)
    detail = ", ".join(f"{e:.2e}" for e in errs)
    print(f"{'ok  ' if ok else 'FAIL'} {name}: rel err {detail}")
    return ok


def main() -> int:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import triton_kernels as tk

    if not torch.cuda.is_available():
        print("no CUDA device; nothing checked")
        return 1
    torch.manual_seed(0)
    dev = "cuda"
    bf = torch.bfloat16
    ok = True

    # Row-major with N, K multiples of 8 takes the TMA kernel (edges zero-filled / clipped by the copy engine);
    # N=777 K=333 and the transposed view below take the pointer kernel (edges masked).
    for M, N, K in [(512, 512, 512), (100, 264, 72), (1000, 776, 336), (2048, 1536, 4096), (1000, 777, 333)]:
        a = torch.randn(M, K, device=dev, dtype=bf)
        b = torch.randn(K, N, device=dev, dtype=bf)
        ref = torch.matmul(a.float(), b.float())
        ok &= _report(f"matmul M={M} N={N} K={K}", [_rel_err(tk.matmul(a, b), ref)])
    # A transposed (non-contiguous) operand goes through the stride arguments.
    a = torch.randn(640, 384, device=dev, dtype=bf)
    b = torch.randn(512, 384, device=dev, dtype=bf).t()
    ok &= _report("matmul M=640 N=512 K=384, B transposed view",
                  [_rel_err(tk.matmul(a, b), torch.matmul(a.float(), b.float()))])

    for B, H, N, D, causal, scale in [(2, 4, 512, 64, False, None), (1, 8, 1024, 128, True, None),
                                      (2, 3, 384, 128, False, 0.3), (1, 2, 640, 64, True, 0.2)]:
        q, k, v = (torch.randn(B, H, N, D, device=dev, dtype=bf) for _ in range(3))
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, scale=scale)
        out = tk.attention(q, k, v, causal=causal, scale=scale)
        ok &= _report(f"attention B={B} H={H} N={N} D={D} causal={causal} scale={scale}", [_rel_err(out, ref)])

    for rows, D in [(64, 1024), (33, 5000), (8, 16384)]:
        x = torch.randn(rows, D, device=dev, dtype=bf)
        res = torch.randn(rows, D, device=dev, dtype=bf)
        w = torch.randn(D, device=dev, dtype=bf)
        b = torch.randn(D, device=dev, dtype=bf)
        s = x.float() + res.float()
        ref = F.layer_norm(s, (D,), w.float(), b.float(), eps=1e-5)
        out, res_out = tk.layernorm(x, res, w, b, eps=1e-5)
        ok &= _report(f"layernorm rows={rows} D={D} (out, residual_out)", [_rel_err(out, ref), _rel_err(res_out, s)])

    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
