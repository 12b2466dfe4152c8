"""Where a layernorm() call's time goes at 16384×1024, the shape where bench/layernorm.py reads ~58 µs a call
although the kernel alone (CUDA graph) takes ~35 µs and bench/host_breakdown.py puts the Python at ~24–33 µs.
Per variant: host time per call (calls queued, no sync), wall time per call with the GPU drained, bench/common.py's
time_ms and graph_time_ms; then a cProfile of layernorm().

    python bench/layernorm_host_probe.py [--rows 16384] [--cols 1024]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import graph_time_ms, time_ms  # noqa: E402

from tkc.kernels import layernorm, layernorm_kernel  # noqa: E402


def host_and_wall_us(fn, calls: int = 300) -> tuple[float, float]:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    return host / calls * 1e6, wall / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--cols", type=int, default=1024)
    args = parser.parse_args()
    m, d, bf = args.rows, args.cols, torch.bfloat16
    x, r = (torch.randn(m, d, device="cuda", dtype=bf) for _ in range(2))
    w = torch.randn(d, device="cuda", dtype=bf)
    o, ro = torch.empty_like(x), torch.empty_like(x)
    moved = 8 * m * d
    calls = {
        "layernorm()": lambda: layernorm(x, r, w, w),
        "layernorm(out=...)": lambda: layernorm(x, r, w, w, out=o, residual_out=ro),
        "layernorm_kernel[grid]": lambda: layernorm_kernel[(m,)](x, r, w, w, o, ro, 1e-5, D=d, WARPS=1),
    }
    for name, fn in calls.items():
        host, wall = host_and_wall_us(fn)
        timed, graph = time_ms(fn, 30) * 1e3, graph_time_ms(fn, 30) * 1e3
        print(f"{name:24s} host {host:6.1f} µs, drained {wall:6.1f} µs, time_ms {timed:6.1f} µs "
              f"({moved / timed / 1e3:.0f} GB/s), graph {graph:6.1f} µs", flush=True)
    event = torch.cuda.Event(enable_timing=True)
    print(f"{'Event.record':24s} host {host_and_wall_us(lambda: event.record())[0]:6.1f} µs")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(300):
        layernorm(x, r, w, w)
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
