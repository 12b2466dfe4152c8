"""LayerNorm's backward: tkc (layernorm_bwd_kernel, then the column sums of dweight and dbias) beside torch's
(aten.native_layer_norm_backward, the mean and rstd from its forward: what autograd runs) and a copy of as many
bytes, in GB/s against the 1 GiB device-to-device copy of the same run. Bytes: s and dy read, ds written (6 per
element; weight and the partial sums are negligible). tkc recomputes each row's mean and rstd from s; torch reads
the ones its forward saved. Outputs checked against float32 autograd first.

    python bench/layernorm_backward.py [--shapes 16384x1024 ...] [--rms]

--rms: RMSNorm's backward (tkc only beside the copies: torch's rms_norm backward is a composite of several kernels).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_timing_options, compare, copy_bandwidth, environment, graph_time_ms, record, rel_err, table  # noqa: E402

from tkc.kernels.layernorm_bwd import layernorm_backward  # noqa: E402


def reference(s: torch.Tensor, dy: torch.Tensor, w: torch.Tensor, b: torch.Tensor, rms: bool):
    """float32 autograd's (ds, dw, db)."""
    leaves = [t.detach().float().requires_grad_() for t in (s, w, b)]
    d = s.shape[-1]
    y = (torch.nn.functional.rms_norm(leaves[0], (d,), leaves[1], 1e-6) if rms
         else torch.nn.functional.layer_norm(leaves[0], (d,), leaves[1], leaves[2], 1e-5))
    return torch.autograd.grad((y * dy.float()).sum(), leaves[:2] if rms else leaves)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="+", default=["16384x1024", "65536x1024", "16384x4096", "8192x8192", "32768x768"])
    parser.add_argument("--rms", action="store_true", help="RMSNorm's backward instead")
    add_timing_options(parser)
    args = parser.parse_args()
    env = environment()
    copy_gbs = copy_bandwidth(args.rounds, args.launches)
    rows = []
    for shape in args.shapes:
        m, d = map(int, shape.split("x"))
        s, dy = (torch.randn(m, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w, b = (torch.randn(d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        src = torch.empty(3 * m * d, device="cuda", dtype=torch.uint8)  # copied: as many bytes as the backward moves
        dst = torch.empty_like(src)
        eps = 1e-6 if args.rms else 1e-5
        impls = {"same-size copy": lambda: dst.copy_(src),
                 "tkc": lambda: layernorm_backward(s, dy, None, w, eps, rms=args.rms),
                 "tkc sm_80": lambda: layernorm_backward(s, dy, None, w, eps, rms=args.rms, target="sm_80")}
        if not args.rms:
            _, mean, rstd = torch.ops.aten.native_layer_norm(s, (d,), w, b, eps)
            impls["torch"] = lambda: torch.ops.aten.native_layer_norm_backward(dy, s, (d,), mean, rstd, w, b,
                                                                               [True, True, True])
        refs = reference(s, dy, w, b, args.rms)
        errors = {name: max(rel_err(got, ref) for got, ref in zip(fn(), refs)) for name, fn in impls.items()
                  if name != "same-size copy"}
        times = compare(impls, args.rounds, args.launches)
        nbytes = 6 * m * d
        row = {"shape": f"{m}×{d}", "copy GB/s": copy_gbs,
               "same-size copy / copy": nbytes / times["same-size copy"] / 1e6 / copy_gbs,
               "tkc graph / copy": nbytes / graph_time_ms(impls["tkc"], args.launches) / 1e6 / copy_gbs}
        for name in ("tkc", "tkc sm_80", "torch"):
            row[f"{name} GB/s"] = nbytes / times[name] / 1e6 if name in times else float("nan")
            row[f"{name} / copy"] = row[f"{name} GB/s"] / copy_gbs
            row[f"{name} err"] = errors.get(name, float("nan"))
        row["tkc / torch"] = row["tkc GB/s"] / row["torch GB/s"]
        rows.append(row)
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    cols = [("shape", "rows×D"), ("copy GB/s", "copy GB/s"), ("same-size copy / copy", "same-size copy / copy")]
    cols += [(f"{n} GB/s", f"{n} GB/s") for n in ("tkc", "tkc sm_80", "torch")]
    cols += [(f"{n} / copy", f"{n} / copy") for n in ("tkc", "tkc sm_80", "torch")]
    cols += [("tkc graph / copy", "tkc graph / copy"), ("tkc / torch", "tkc / torch"), ("tkc err", "tkc rel err")]
    text = table(rows, cols)
    print(text)
    record("rmsnorm-backward" if args.rms else "layernorm-backward", env,
           f"GB/s (6 bytes per element: s and dy read, ds written), median of {args.launches} back-to-back calls × "
           f"{args.rounds} interleaved rounds; copy = a 1 GiB device-to-device copy in the same run; tkc = "
           "layernorm_backward() (the kernel, then the column sums of dweight and dbias); torch = "
           "aten.native_layer_norm_backward with its forward's mean and rstd; graph = tkc's calls replayed from a "
           "CUDA graph.\n\n" + text, rows)


if __name__ == "__main__":
    main()
