"""Configuration sweeps for tuning tkc's kernels on a GPU (not a benchmark of record): each variant's TFLOP/s and
error at one size, through the kernel launch itself.

    python bench/sweep.py gemm [--size 4096]      python bench/sweep.py attention [--n 4096]
    python bench/sweep.py layernorm
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import checked_time, time_ms  # noqa: E402

from tkc.kernels import attention_fwd, gemm_kernel, layernorm, layernorm_kernel  # noqa: E402
from tkc.kernels import gemm as tkc_gemm  # noqa: E402

GEMM_CONFIGS = [
    dict(BM=128, BN=128, BK=32, WARPS=4, WARPS_N=2, STAGES=3),
    dict(BM=128, BN=128, BK=64, WARPS=4, WARPS_N=2, STAGES=3),
    dict(BM=128, BN=128, BK=64, WARPS=4, WARPS_N=2, STAGES=2),
    dict(BM=128, BN=256, BK=64, WARPS=8, WARPS_N=4, STAGES=3),
    dict(BM=256, BN=128, BK=64, WARPS=8, WARPS_N=2, STAGES=3),
    dict(BM=256, BN=128, BK=64, WARPS=8, WARPS_N=2, STAGES=2),
    dict(BM=128, BN=128, BK=64, WARPS=4, WARPS_N=2, STAGES=2, BLOCKS_PER_SM=3),
    dict(BM=128, BN=128, BK=32, WARPS=4, WARPS_N=2, STAGES=3, BLOCKS_PER_SM=3),
    dict(BM=128, BN=128, BK=32, WARPS=4, WARPS_N=2, STAGES=4, BLOCKS_PER_SM=3),
    dict(BM=128, BN=128, BK=32, WARPS=4, WARPS_N=2, STAGES=4),
    dict(BM=128, BN=128, BK=64, WARPS=4, WARPS_N=2, STAGES=2, GROUP_M=16),
]


def gemm(size: int) -> None:
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    cublas = time_ms(lambda: torch.matmul(a, b))
    print(f"cuBLAS {2 * size**3 / cublas / 1e9:.0f} TFLOP/s")
    for cfg in GEMM_CONFIGS:
        c = torch.empty((size, size), device="cuda", dtype=torch.bfloat16)
        grid = (-(-size // cfg["BM"]) * -(-size // cfg["BN"]),)
        try:
            ms, err = checked_time(lambda: gemm_kernel[grid](a, b, c, target="sm_80", **cfg), c, ref)
            print(f"{cfg}: {2 * size**3 / ms / 1e9:.0f} TFLOP/s ({cublas / ms:.2f}x cuBLAS), err {err:.1e}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{cfg}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
    c = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)
    for label, call in (("gemm() fresh output", lambda: tkc_gemm(a, b, target="sm_80")),
                        ("gemm() given output", lambda: tkc_gemm(a, b, target="sm_80", out=c)),
                        ("cuBLAS again", lambda: torch.matmul(a, b))):
        ms = time_ms(call)
        print(f"{label}: {2 * size**3 / ms / 1e9:.0f} TFLOP/s ({cublas / ms:.2f}x cuBLAS)", flush=True)


ATTENTION_CONFIGS = {  # (ROWS, KEYS, Q_IN_SHARED) per head dim
    32: [(16, 64, 0), (32, 64, 0), (32, 32, 0), (32, 64, 1)],
    64: [(16, 64, 0), (16, 32, 0), (32, 64, 0), (32, 32, 0), (32, 64, 1), (32, 32, 1)],
    96: [(16, 64, 0), (16, 32, 0), (16, 64, 1), (32, 32, 1), (32, 64, 1)],
    128: [(16, 64, 0), (16, 32, 0), (16, 64, 1), (16, 32, 1), (32, 32, 1)],
}


def attention(n: int, dims: list[int]) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for d, causal in itertools.product(dims, (0, 1)):
        b, h = max(1, 16384 // n), 16
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o = torch.empty_like(q)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            flash = time_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)))
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        for rows, keys, q_in_shared in ATTENTION_CONFIGS[d]:
            run = lambda: attention_fwd[(n // (4 * rows), h, b)](q, k, v, o, d**-0.5, D=d, CAUSAL=causal, ROWS=rows,  # noqa: E731
                                                               KEYS=keys, Q_IN_SHARED=q_in_shared, target="sm_80")
            try:
                ms, err = checked_time(run, o, ref)
            except Exception as e:  # noqa: BLE001
                print(f"D={d} causal={causal} ROWS={rows} KEYS={keys} Q_IN_SHARED={q_in_shared}: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:200]}", flush=True)
                continue
            print(f"D={d} causal={causal} ROWS={rows} KEYS={keys} Q_IN_SHARED={q_in_shared}: {flops / ms / 1e9:.0f} "
                  f"TFLOP/s ({flash / ms:.2f}x flash {flops / flash / 1e9:.0f}), err {err:.1e}", flush=True)


def layernorm_sweep() -> None:
    """Kernel-only GB/s per (warps per row, grid) against a 1 GiB copy, and the wrapper's own cost."""
    import time

    big = torch.empty(2**29, device="cuda", dtype=torch.bfloat16)
    copy_gbs = 2 * big.numel() * 2 / time_ms(lambda: big.clone()) / 1e6
    print(f"copy {copy_gbs:.0f} GB/s")
    for m, d in ((16384, 1024), (16384, 2048), (16384, 4096), (8192, 8192)):
        x, r = (torch.randn(m, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w, b = (torch.randn(d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        o, ro = torch.empty_like(x), torch.empty_like(x)
        ref = torch.nn.functional.layer_norm((x.float() + r.float()), (d,), w.float(), b.float(), 1e-5)
        nbytes = 4 * x.numel() * 2
        for warps in (1, 2, 4, 8, 16):
            if d % (16 * warps):
                continue
            args = (x, r, w, b, o, ro, 1e-5)
            resident = layernorm_kernel.resident_blocks(*args, D=d, WARPS=warps, target="sm_80")
            for label, grid in (("rows", m), ("1x", resident), ("2x", 2 * resident), ("4x", 4 * resident)):
                run = lambda: layernorm_kernel[(min(grid, m),)](*args, D=d, WARPS=warps, target="sm_80")  # noqa: E731
                ms, err = checked_time(run, o, ref)
                print(f"{m}x{d} warps={warps} grid={label}({min(grid, m)}): {nbytes / ms / 1e6:.0f} GB/s "
                      f"({nbytes / ms / 1e6 / copy_gbs:.2f}x copy), err {err:.1e}", flush=True)
        for label, call in (("layernorm() fresh outputs", lambda: layernorm(x, r, w, b)),
                            ("layernorm() given outputs", lambda: layernorm(x, r, w, b, out=o, residual_out=ro))):
            ms = time_ms(call)
            print(f"{m}x{d} {label}: {nbytes / ms / 1e6:.0f} GB/s ({nbytes / ms / 1e6 / copy_gbs:.2f}x copy)", flush=True)
        layernorm(x, r, w, b)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            layernorm(x, r, w, b)
        host = (time.perf_counter() - t0) / 200
        torch.cuda.synchronize()
        print(f"{m}x{d}: layernorm() host time {host * 1e6:.1f} us/call (queued, not synchronized)", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["gemm", "attention", "layernorm"])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--d", type=int, nargs="*", default=[64, 128], help="attention head dims")
    args = parser.parse_args()
    {"gemm": lambda: gemm(args.size), "attention": lambda: attention(args.n, args.d), "layernorm": layernorm_sweep}[args.what]()
