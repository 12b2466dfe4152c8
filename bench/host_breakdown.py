"""Where the host time of one call goes: each piece of the launch path timed on its own (steady state, tiny
shapes so that the GPU is never the bottleneck), next to torch's and Triton's calls, then a cProfile of the
public entry points. A memory-bound kernel of ~30 µs is host-bound once its call costs more than that; the
layernorm section at --rows × --cols (default 16384 × 1024) puts host, drained, event-timed and graph-replayed
times per call side by side.

    python bench/host_breakdown.py [--profile gemm attention layernorm scaled_mm] [--backward]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))

from common import graph_time_ms, time_ms  # noqa: E402

from tkc.kernels import attention, gemm, layernorm, layernorm_kernel, scaled_mm  # noqa: E402
from tkc.kernels._checks import check_tensor  # noqa: E402
from tkc.runtime import launch as L  # noqa: E402
from tkc.runtime import driver as driver_module  # noqa: E402
from tkc.runtime.driver import driver  # noqa: E402


def host_and_wall_us(fn, calls: int = 5000) -> tuple[float, float]:
    """Per call: the host's time to queue `calls` calls, and the wall time until the GPU has run them all."""
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    return host / calls * 1e6, wall / calls * 1e6


def per_call_us(fn, calls: int = 5000) -> float:
    return host_and_wall_us(fn, calls)[0]


def big_shape(rows: int, cols: int) -> None:
    """layernorm at a benchmark shape, where bench/layernorm.py reads more per call than the Python and the kernel
    seem to cost: per variant the host time to queue a call, the wall time with the GPU drained, bench/common.py's
    time_ms (one event between calls) and graph_time_ms (the kernel alone); the bare kernel on smaller grids."""
    bf = torch.bfloat16
    x, r = (torch.randn(rows, cols, device="cuda", dtype=bf) for _ in range(2))
    w = torch.randn(cols, device="cuda", dtype=bf)
    o, ro = torch.empty_like(x), torch.empty_like(x)
    moved = 8 * rows * cols
    print(f"\n{rows}×{cols}: 8 bytes per element moved = {moved / 1e6:.0f} MB")
    src = torch.empty(moved // 2, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    warps = 2 if cols >= 1024 else 1
    calls = {"copy of as many bytes": lambda: dst.copy_(src),
             "layernorm()": lambda: layernorm(x, r, w, w),
             "layernorm() with out=": lambda: layernorm(x, r, w, w, out=o, residual_out=ro)}
    for blocks in (rows, 132 * 32):
        calls[f"layernorm_kernel[{blocks}]"] = (
            lambda blocks=blocks: layernorm_kernel[(blocks,)](x, r, w, w, o, ro, 1e-5, D=cols, WARPS=warps))
    default = driver_module.DEPENDENT_LAUNCH
    for dependent in (True, False):  # sm_90 kernels with and without programmatic dependent launch
        driver_module.DEPENDENT_LAUNCH = dependent
        print(f"programmatic dependent launch {'on' if dependent else 'off'}:")
        for name, fn in calls.items():
            if name.startswith("copy") and not dependent:
                continue
            host, wall = host_and_wall_us(fn, 300)
            timed, graph = time_ms(fn, 30) * 1e3, graph_time_ms(fn, 30) * 1e3
            print(f"  {name:26s} host {host:6.1f} µs, drained {wall:6.1f} µs, time_ms {timed:6.1f} µs "
                  f"({moved / timed / 1e3:.0f} GB/s), graph {graph:6.1f} µs", flush=True)
    driver_module.DEPENDENT_LAUNCH = default


def backward_shape(rows: int, cols: int) -> None:
    """layernorm_backward() at a benchmark shape (bench/layernorm_backward.py read it at 0.18 of the copy
    event-timed, 0.51 from a graph): host, drained, event-timed and graph-replayed times per call, of the whole
    call and of its two kernels alone, then a cProfile of the call."""
    from tkc.kernels import layernorm_bwd

    bf = torch.bfloat16
    s, dy = (torch.randn(rows, cols, device="cuda", dtype=bf) for _ in range(2))
    w = torch.randn(cols, device="cuda", dtype=bf)
    backward, column_sums, blocks, width = layernorm_bwd._plan(rows, cols, bf, 0, False, False, None,
                                                               example=(s, w, 1e-5))
    ds, parts = torch.empty_like(s), torch.empty((blocks, width), device="cuda")
    totals = torch.empty(width, device="cuda", dtype=bf)
    calls = {"layernorm_backward()": lambda: layernorm_bwd.layernorm_backward(s, dy, None, w, 1e-5),
             f"layernorm_bwd_kernel[{blocks}]": lambda: backward(s, dy, s, w, ds, parts, 1e-5),
             "column_sums_kernel": lambda: column_sums(parts, totals)}
    print(f"\nlayernorm_backward {rows}×{cols}: 6 bytes per element = {6 * rows * cols / 1e6:.0f} MB")
    for name, fn in calls.items():
        host, wall = host_and_wall_us(fn, 300)
        timed, graph = time_ms(fn, 30) * 1e3, graph_time_ms(fn, 30) * 1e3
        print(f"  {name:30s} host {host:6.1f} µs, drained {wall:6.1f} µs, time_ms {timed:6.1f} µs, "
              f"graph {graph:6.1f} µs", flush=True)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(300):
        calls["layernorm_backward()"]()
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", nargs="*", default=["gemm", "attention", "layernorm", "scaled_mm"])
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--backward", action="store_true", help="only layernorm_backward() at --rows × --cols")
    args = parser.parse_args()
    if args.backward:
        backward_shape(args.rows, args.cols)
        return
    bf = torch.bfloat16
    x = torch.randn(4, 1024, device="cuda", dtype=bf)
    w = torch.randn(1024, device="cuda", dtype=bf)
    o, ro = torch.empty_like(x), torch.empty_like(x)
    a, b = torch.randn(64, 64, device="cuda", dtype=bf), torch.randn(64, 64, device="cuda", dtype=bf)
    q = torch.randn(1, 1, 128, 64, device="cuda", dtype=bf)
    # fp8 at 2048³: a ~15 µs kernel, so the call is host-bound (RESULTS "short fp8 calls — 2026-12-05 03:55")
    a8 = torch.randn(2048, 2048, device="cuda").to(torch.float8_e4m3fn)
    w8 = torch.randn(2048, 2048, device="cuda").to(torch.float8_e4m3fn)
    b8, one = w8.t(), torch.ones((), device="cuda")
    launch_args, constants = (x, x, w, w, o, ro, 1e-5), {"D": 1024, "WARPS": 1}
    spec = layernorm_kernel.specialize(**constants)
    values: list = []
    fast = spec.variant(launch_args, values)
    cu, stream = driver(), L.current_stream_handle(0)
    packed = fast.params.pack(values)
    params = fast.params.address(packed)
    event = torch.cuda.Event(enable_timing=True)
    stream_object = torch.cuda.current_stream()
    pieces = {
        "torch event.record": lambda: event.record(),
        "torch event.record(stream)": lambda: event.record(stream_object),
        "torch.empty_like": lambda: torch.empty_like(x),
        "check_tensor": lambda: check_tensor("x", x, bf, 2),
        "kernel[grid]": lambda: layernorm_kernel[(4,)],
        "launch: argument reader": lambda: spec.read(launch_args, []),
        "launch: saved parameters": lambda: fast.parameters(layernorm_kernel, launch_args, values[:]),
        "launch: params.address": lambda: fast.params.address(packed),
        "launch: current_stream_handle": lambda: L.current_stream_handle(0),
        "cuLaunchKernel (cuda-bindings)": lambda: cu.cuLaunchKernel(
            fast.loaded.function, 4, 1, 1, fast.loaded.threads, 1, 1, fast.loaded.shared_bytes, cu.CUstream(stream),
            params, 0),
        "launch: driver.launch": lambda: L.launch(fast.loaded, (4, 1, 1), stream, params),
        "launch: run()": lambda: L.run(layernorm_kernel, (4, 1, 1), launch_args, constants),
        "launch: specialized": lambda: spec.launch((4, 1, 1), launch_args),
        "layernorm_kernel[grid](...)": lambda: layernorm_kernel[(4,)](*launch_args, **constants),
        "layernorm()": lambda: layernorm(x, x, w, w),
        "gemm() 64³": lambda: gemm(a, b),
        "attention() 1×1×128×64": lambda: attention(q, q, q),
        "scaled_mm() fp8 2048³": lambda: scaled_mm(a8, b8, one, one),
        "torch._scaled_mm 2048³": lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=bf),
        "torch: reshape(-1) of a 0-dim": lambda: one.reshape(-1),
        "torch: weight.t()": lambda: w8.t(),
        "torch: new_empty 2048²": lambda: a8.new_empty((2048, 2048), dtype=bf),
        "torch: x + x": lambda: x + x,
        "torch: F.layer_norm": lambda: torch.nn.functional.layer_norm(x, (1024,), w, w, 1e-5),
        "torch: matmul 64³": lambda: a @ b,
    }
    try:
        import triton_kernels

        pieces["triton: layernorm"] = lambda: triton_kernels.layernorm(x, x, w, w, 1e-5)
    except Exception as e:  # noqa: BLE001
        print(f"(no Triton peer: {e})")
    for name, fn in pieces.items():
        print(f"{name:34s} {per_call_us(fn):7.2f} us", flush=True)
    big_shape(args.rows, args.cols)
    entry = {"gemm": lambda: gemm(a, b), "attention": lambda: attention(q, q, q),
             "layernorm": lambda: layernorm(x, x, w, w), "scaled_mm": lambda: scaled_mm(a8, b8, one, one)}
    for name in args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(2000):
            entry[name]()
        profiler.disable()
        torch.cuda.synchronize()
        print(f"\n=== cProfile: {name}() × 2000")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
