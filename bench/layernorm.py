"""LayerNorm with residual: tkc vs torch (x + residual, then layer_norm) and Triton, in GB/s against the
device-to-device copy bandwidth measured in the same run. Bytes: x and residual read, out and x + residual
written (8 bytes per element; weight and bias are negligible). Beside the 1 GiB copy, a copy of as many bytes as
each layernorm moves, timed the same way: what a call's fixed costs (launch, the event between calls, ramp, tail;
~3 µs, 9% of a 134 MB call at 16384×1024, 2% at 65536×1024) leave of the copy bandwidth at that size.

    python bench/layernorm.py [--shapes 16384x1024 ...] [--rms]

--rms: RMSNorm instead (tkc.kernels.rmsnorm; torch: x + residual, then F.rms_norm; Triton's kernel with RMS=True),
the same bytes moved.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_timing_options, compare, copy_bandwidth, environment, graph_time_ms, record, rel_err, table, triton_peer  # noqa: E402

import tkc.kernels  # noqa: E402


def torch_layernorm(x, r, w, b, eps):
    s = x + r
    return torch.nn.functional.layer_norm(s, (x.shape[-1],), w, b, eps), s


def torch_rmsnorm(x, r, w, eps):
    s = x + r
    return torch.nn.functional.rms_norm(s, (x.shape[-1],), w, eps), s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="+", default=["16384x1024", "32768x1024", "65536x1024", "16384x2048", "16384x4096", "8192x8192"])
    parser.add_argument("--rms", action="store_true", help="RMSNorm instead of LayerNorm")
    add_timing_options(parser)
    args = parser.parse_args()
    triton_kernels = triton_peer()
    env = environment()
    copy_gbs = copy_bandwidth(args.rounds, args.launches)
    rows = []
    for shape in args.shapes:
        m, d = map(int, shape.split("x"))
        x, r = (torch.randn(m, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w, b = (torch.randn(d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        s = x.float() + r.float()
        src = torch.empty(4 * m * d, device="cuda", dtype=torch.uint8)  # as many bytes as layernorm moves
        dst = torch.empty_like(src)
        impls = {"same-size copy": lambda: dst.copy_(src)}
        if args.rms:
            ref = torch.nn.functional.rms_norm(s, (d,), w.float(), 1e-6)
            impls["tkc sm_80"] = lambda: tkc.kernels.rmsnorm(x, r, w, 1e-6, target="sm_80")
            impls["tkc"] = lambda: tkc.kernels.rmsnorm(x, r, w, 1e-6)
            impls["torch"] = lambda: torch_rmsnorm(x, r, w, 1e-6)
            if triton_kernels is not None:
                impls["triton"] = lambda: triton_kernels.layernorm(x, r, w, None, 1e-6, rms=True)
        else:
            ref = torch.nn.functional.layer_norm(s, (d,), w.float(), b.float(), 1e-5)
            impls["tkc sm_80"] = lambda: tkc.kernels.layernorm(x, r, w, b, 1e-5, target="sm_80")
            impls["tkc"] = lambda: tkc.kernels.layernorm(x, r, w, b, 1e-5)
            impls["torch"] = lambda: torch_layernorm(x, r, w, b, 1e-5)
            if triton_kernels is not None:
                impls["triton"] = lambda: triton_kernels.layernorm(x, r, w, b, 1e-5)
        errors = {}
        for name, fn in list(impls.items()):
            if name == "same-size copy":
                continue
            try:
                out, resid = fn()
                errors[name] = max(rel_err(out, ref), rel_err(resid, s))
            except Exception as e:  # noqa: BLE001
                print(f"  {name} failed: {type(e).__name__}: {e}")
                del impls[name]
        times = compare(impls, args.rounds, args.launches)
        nbytes = 8 * m * d
        row = {"shape": f"{m}×{d}", "copy GB/s": copy_gbs,
               "same-size copy / copy": nbytes / times["same-size copy"] / 1e6 / copy_gbs}
        for name in ("tkc", "triton"):  # the kernels alone: calls replayed from a CUDA graph, no host work
            try:
                row[f"{name} graph / copy"] = nbytes / graph_time_ms(impls[name], args.launches) / 1e6 / copy_gbs
            except Exception as e:  # noqa: BLE001
                print(f"  {name} in a CUDA graph failed: {type(e).__name__}: {e}")
                row[f"{name} graph / copy"] = float("nan")
        for name in ("tkc sm_80", "tkc", "torch", "triton"):
            row[f"{name} GB/s"] = nbytes / times[name] / 1e6 if name in times else float("nan")
            row[f"{name} / copy"] = row[f"{name} GB/s"] / copy_gbs
            row[f"{name} err"] = errors.get(name, float("nan"))
        row["tkc / same-size copy"] = row["tkc / copy"] / row["same-size copy / copy"]
        rows.append(row)
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    cols = [("shape", "rows×D"), ("copy GB/s", "copy GB/s"), ("same-size copy / copy", "same-size copy / copy")]
    cols += [(f"{n} GB/s", f"{n} GB/s") for n in ("tkc sm_80", "tkc", "torch", "triton")]
    cols += [(f"{n} / copy", f"{n} / copy") for n in ("tkc sm_80", "tkc", "torch", "triton")]
    cols += [(f"{n} graph / copy", f"{n} graph / copy") for n in ("tkc", "triton")]
    cols += [("tkc / same-size copy", "tkc / same-size copy")]
    cols += [("tkc err", "tkc rel err")]
    text = table(rows, cols)
    print(text)
    record("rmsnorm" if args.rms else "layernorm", env, f"GB/s (8 bytes per element moved), median of {args.launches} back-to-back launches × {args.rounds} "
           "interleaved rounds; copy = a 1 GiB device-to-device copy in the same run; same-size copy = a copy moving as many bytes as the layernorm, timed the same way (what launching back to back with an event between calls leaves of the copy bandwidth at that size); graph = the same calls "
           "replayed from a CUDA graph (the kernel alone, no host work).\n\n" + text, rows)


if __name__ == "__main__":
    main()
