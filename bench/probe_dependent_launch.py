"""Programmatic dependent launch per kernel: what layernorm_kernel's own opt-in (@tkc.kernel(dependent_launch=True))
gains back to back, and whether it costs a GEMM it follows (the GEMM's blocks let the next kernel's blocks start
early). Per iteration µs, median of 5 interleaved rounds: `stream` = 30 iterations between two events (as a model's
layers run), `event` = an event between iterations (the benchmarks' protocol). Launch settings: off (none
dependent), default (the kernels that ask: layernorm, opted in by this probe), all (TKC_DEPENDENT_LAUNCH=1).
Outputs checked first.
    python bench/probe_dependent_launch.py [--rows 16384] [--dim 1024] [--k 1024]"""
import argparse
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import rel_err, time_ms  # noqa: E402

from tkc.kernels import gemm, layernorm, layernorm_kernel  # noqa: E402
from tkc.runtime import driver  # noqa: E402

SETTINGS = {"off": False, "default": None, "all": True}


def stream_us(fn, iterations: int = 30) -> float:
    """µs per iteration of `iterations` iterations queued back to back between two events."""
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iterations


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--k", type=int, default=1024, help="the GEMM's inner dimension (rows × k · k × dim)")
    args = parser.parse_args()
    layernorm_kernel.dependent_launch = True  # as @tkc.kernel(dependent_launch=True) would (no shipped kernel asks)
    m, d = args.rows, args.dim
    bf = torch.bfloat16
    h, proj = torch.randn(m, args.k, device="cuda", dtype=bf), torch.randn(args.k, d, device="cuda", dtype=bf) / 32
    x, r = torch.empty(m, d, device="cuda", dtype=bf), torch.randn(m, d, device="cuda", dtype=bf)
    w, b = torch.randn(d, device="cuda", dtype=bf), torch.randn(d, device="cuda", dtype=bf)
    o, ro = torch.empty_like(x), torch.empty_like(x)
    sequences = {
        "layernorm": lambda: layernorm(x, r, w, b, out=o, residual_out=ro),
        "gemm": lambda: gemm(h, proj, out=x),
        "gemm → layernorm": lambda: (gemm(h, proj, out=x), layernorm(x, r, w, b, out=o, residual_out=ro)),
    }
    default = driver.DEPENDENT_LAUNCH
    for setting, value in SETTINGS.items():  # each setting's answers first
        driver.DEPENDENT_LAUNCH = value
        for t in (x, o, ro):
            t.fill_(float("nan"))
        sequences["gemm → layernorm"]()
        torch.cuda.synchronize()
        s = (h.float() @ proj.float()) + r.float()
        ref = torch.nn.functional.layer_norm(s, (d,), w.float(), b.float(), 1e-5)
        err = max(rel_err(ro, s), rel_err(o, ref))
        assert err < 1e-2, f"{setting}: relative error {err}"
    times: dict[tuple[str, str, str], list[float]] = {}
    order = random.Random(0)
    cases = [(seq, setting) for seq in sequences for setting in SETTINGS]
    for _ in range(5):
        for seq, setting in order.sample(cases, len(cases)):
            driver.DEPENDENT_LAUNCH = SETTINGS[setting]
            times.setdefault((seq, setting, "stream"), []).append(stream_us(sequences[seq]))
            times.setdefault((seq, setting, "event"), []).append(time_ms(sequences[seq]) * 1e3)
    driver.DEPENDENT_LAUNCH = default
    print(f"{m}×{d} layernorm, {m}×{args.k}×{d} GEMM: µs per iteration, stream / event (median of 5 rounds)")
    print(f"  {'':18s}" + "".join(f"{s:>18s}" for s in SETTINGS))
    for seq in sequences:
        cells = "".join(f"{statistics.median(times[seq, s, 'stream']):8.1f} /{statistics.median(times[seq, s, 'event']):7.1f}"
                        for s in SETTINGS)
        print(f"  {seq:18s}{cells}")


if __name__ == "__main__":
    main()
