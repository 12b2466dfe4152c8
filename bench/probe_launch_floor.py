"""What a launch costs before any bytes move, beside layernorm() and a copy of its bytes: a kernel that does nothing,
launched on one block, on one wave of layernorm's blocks and on all of them (16384 blocks of 64 threads at
16384×1024), timed three ways: `event` = an event recorded between calls (the benchmarks' protocol), `stream` =
30 calls between two events, `graph` = 30 calls replayed from a CUDA graph. The gap between `event` and `graph` for
the empty kernel is what the protocol charges any launch; the empty kernel's `graph` time on layernorm's grid is
what handing out its blocks costs. Outputs of layernorm checked first. Median of 5 interleaved rounds, µs a call.
    python bench/probe_launch_floor.py [--rows 16384] [--dim 1024]"""
import argparse
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import graph_time_ms, rel_err, time_ms  # noqa: E402
from probe_dependent_launch import stream_us  # noqa: E402

import tkc  # noqa: E402
from tkc.kernels import layernorm  # noqa: E402
from tkc.lang import *  # noqa: E402,F403


@tkc.kernel(warps=2, min_target="sm_80")
def nothing(Y: gl[f32, 1]):
    """Stores nothing (no block index is negative): the launch alone."""
    if block_idx()[0] < 0:
        store(Y, zeros(rv[f32, 16]), (0,))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--dim", type=int, default=1024)
    args = parser.parse_args()
    m, d = args.rows, args.dim
    bf = torch.bfloat16
    x, r = torch.randn(m, d, device="cuda", dtype=bf), torch.randn(m, d, device="cuda", dtype=bf)
    w, b = torch.randn(d, device="cuda", dtype=bf), torch.randn(d, device="cuda", dtype=bf)
    o, ro = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    layernorm(x, r, w, b, out=o, residual_out=ro)
    s = x.float() + r.float()
    err = max(rel_err(ro, s), rel_err(o, torch.nn.functional.layer_norm(s, (d,), w.float(), b.float(), 1e-5)))
    assert err < 1e-2, f"layernorm: relative error {err}"
    source = torch.randn(2 * m, d, device="cuda", dtype=bf)  # as many bytes read and written as the layernorm
    target = torch.empty_like(source)
    y = torch.zeros(16, device="cuda")
    wave = torch.cuda.get_device_properties(0).multi_processor_count * 21  # layernorm_kernel's blocks at a time
    calls = {
        "nothing, 1 block": lambda: nothing[(1,)](y),
        f"nothing, {wave} blocks": lambda: nothing[(wave,)](y),
        f"nothing, {m} blocks": lambda: nothing[(m,)](y),
        "copy of as many bytes": lambda: target.copy_(source),
        "layernorm()": lambda: layernorm(x, r, w, b, out=o, residual_out=ro),
    }
    ways = {"event": lambda fn: time_ms(fn) * 1e3, "stream": stream_us, "graph": lambda fn: graph_time_ms(fn) * 1e3}
    times: dict[tuple[str, str], list[float]] = {}
    order = random.Random(0)
    cases = [(call, way) for call in calls for way in ways]
    for _ in range(5):
        for call, way in order.sample(cases, len(cases)):
            times.setdefault((call, way), []).append(ways[way](calls[call]))
    print(f"{torch.cuda.get_device_name()}: {m}×{d}, µs a call (median of 5 rounds)")
    print(f"  {'':24s}" + "".join(f"{way:>9s}" for way in ways))
    for call in calls:
        print(f"  {call:24s}" + "".join(f"{statistics.median(times[call, way]):9.2f}" for way in ways))


if __name__ == "__main__":
    main()
