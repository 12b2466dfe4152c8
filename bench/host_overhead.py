"""Host time per call of tkc's public entry points (and of a bare `kernel[grid](...)` launch), at shapes so small
that the GPU is never the bottleneck, with a cProfile of the slowest; what a small-shape benchmark pays on top of
the kernel.

    python bench/host_overhead.py [--profile layernorm]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from tkc.kernels import attention, gemm, layernorm, layernorm_kernel


def per_call_us(fn, calls: int = 2000) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", choices=["gemm", "attention", "layernorm", "launch"], default="layernorm")
    args = parser.parse_args()
    bf = torch.bfloat16
    a, b = torch.randn(64, 64, device="cuda", dtype=bf), torch.randn(64, 64, device="cuda", dtype=bf)
    q = torch.randn(1, 1, 128, 64, device="cuda", dtype=bf)
    x = torch.randn(4, 1024, device="cuda", dtype=bf)
    w = torch.randn(1024, device="cuda", dtype=bf)
    o, ro = torch.empty_like(x), torch.empty_like(x)
    calls = {
        "gemm": lambda: gemm(a, b),
        "attention": lambda: attention(q, q, q),
        "layernorm": lambda: layernorm(x, x, w, w),
        "launch": lambda: layernorm_kernel[(4,)](x, x, w, w, o, ro, 1e-5, D=1024, WARPS=1),
    }
    for name, fn in calls.items():
        print(f"{name}: {per_call_us(fn):.1f} us per call (host)", flush=True)
    profiler = cProfile.Profile()
    fn = calls[args.profile]
    profiler.enable()
    for _ in range(2000):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
