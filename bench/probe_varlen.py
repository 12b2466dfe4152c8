"""attention_varlen's Hopper kernels under other constants, launched directly and interleaved with the shipped
ones: the forward (attention_varlen_sm90) and, with --backward, the dK/dV and dQ kernels (their default constants
are BACKWARD_SM90's), each timed alone; outputs checked against the shipped configuration's. TFLOP/s count each
sequence's own work (4·len²·H·D, halved when causal; the backward's two kernels 1.5× and 1× of that, dK/dV
holding four products and dQ three).

    python bench/probe_varlen.py [--dims 128] [--causal 0 1] [--mixes uniform mixed short long]
        [--configs DEFER=2,LATE_PV=0 KEYS=64] [--backward --dkdv QUERIES=32 --dq KEYS=96,STAGES=2 PRODUCER=1]

(Not every combination builds: DEFER=3 cannot run the ends' walk a tile ahead; WARPS=12 spills at 128 registers.)
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_varlen import lengths  # noqa: E402
from common import add_timing_options, compare, environment, record, rel_err, table  # noqa: E402

from tkc.kernels._checks import unread_lse  # noqa: E402

varlen = importlib.import_module("tkc.kernels.attention_varlen")


def parse(config: str) -> dict[str, int]:
    return {k: int(v) for k, v in (kv.split("=") for kv in config.split(",") if kv)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dims", type=int, nargs="+", default=[128])
    parser.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--mixes", nargs="+", default=["uniform", "mixed", "short"])
    parser.add_argument("--configs", nargs="+", default=["DEFER=2,LATE_PV=0", "KEYS=64", "WARPS=4"],
                        help="the forward's constants beside the shipped ones, NAME=VALUE,...")
    parser.add_argument("--backward", action="store_true", help="the backward's two kernels instead")
    parser.add_argument("--dkdv", nargs="*", default=["QUERIES=32"], help="dK/dV constants beside BACKWARD_SM90's")
    parser.add_argument("--dq", nargs="*", default=["KEYS=96,STAGES=2", "PRODUCER=1"],
                        help="dQ constants beside BACKWARD_SM90's")
    add_timing_options(parser)
    args = parser.parse_args()
    env, rows = environment(), []
    for d in args.dims:
        for causal in args.causal:
            for mix in args.mixes:
                lens = lengths(mix, args.tokens) if mix != "long" else [args.tokens // 2] * 2
                seqs, total, h = len(lens), args.tokens, args.heads
                cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
                q, k, v, do = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                packed = lambda t: t.unsqueeze(0).transpose(1, 2)  # noqa: E731
                ends, scale = cu[1:], d ** -0.5
                work = sum(4 * n * n * h * d for n in lens) / (2 if causal else 1)
                base = {"D": d, "CAUSAL": causal}
                impls, outputs, rates = {}, {}, {}
                if not args.backward:
                    for config in ["shipped", *args.configs]:
                        constants = {**base, **({} if config == "shipped" else parse(config))}
                        spec = varlen.attention_varlen_sm90.specialize(target="sm_90a", **constants)
                        grid = ((-(-total // (16 * constants.get("WARPS", 8))) + seqs) * h, 1, 1)
                        out = torch.empty_like(q)
                        outputs[config] = out
                        impls[config] = (lambda spec=spec, grid=grid, out=out: spec.launch(grid, (
                            packed(q), packed(k), packed(v), packed(out), unread_lse(q), ends, ends, scale)))
                        rates[config] = work
                else:
                    out, lse = varlen.attention_varlen(q, k, v, cu, causal=bool(causal), return_lse=True)
                    delta = torch.empty_like(lse)
                    varlen.attention_bwd_delta[(-(-total // 64), h, 1)](packed(out), packed(do), lse.unsqueeze(0),
                                                                       delta.unsqueeze(0), D=d, target="sm_80")
                    common = (packed(q), packed(k), packed(v), packed(do), lse.unsqueeze(0), delta.unsqueeze(0))
                    dkdv_default, dq_default = varlen.BACKWARD_SM90[d]
                    for kind, configs, default, kernel, factor in (
                            ("dkdv", args.dkdv, dkdv_default, varlen.attention_varlen_bwd_dkdv_sm90, 1.5),
                            ("dq", args.dq, dq_default, varlen.attention_varlen_bwd_dq_sm90, 1.0)):
                        for config in ["shipped", *configs]:
                            constants = {**base, **default, **({} if config == "shipped" else parse(config))}
                            spec = kernel.specialize(target="sm_90a", **constants)
                            rows_a_block = 16 * constants.get("WARPS", 8)
                            grid = (-(-total // rows_a_block) + seqs, h, 1)
                            grads = [torch.empty_like(q) for _ in range(2 if kind == "dkdv" else 1)]
                            name = f"{kind} {config}"
                            outputs[name] = grads[0]
                            impls[name] = (lambda spec=spec, grid=grid, grads=grads: spec.launch(
                                grid, (*common, *[packed(g) for g in grads], ends, ends, scale)))
                            rates[name] = work * factor
                for fn in impls.values():
                    fn()
                torch.cuda.synchronize()
                errors = {}
                for name, got in outputs.items():
                    shipped = outputs["shipped" if not args.backward else name.split()[0] + " shipped"]
                    errors[name] = rel_err(got[:int(cu[-1])], shipped[:int(cu[-1])])
                times = compare(impls, args.rounds, args.launches)
                for name, ms in times.items():
                    row = {"D": d, "causal": causal, "mix": mix, "sequences": seqs, "config": name,
                           "us": ms * 1e3, "TFLOP/s": rates[name] / (ms * 1e-3) / 1e12, "diff": errors[name]}
                    rows.append(row)
                    print("  ".join(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
                                    for key, value in row.items()), flush=True)
    columns = [("D", "D"), ("causal", "causal"), ("mix", "lengths"), ("sequences", "sequences"),
               ("config", "constants"), ("us", "µs"), ("TFLOP/s", "TFLOP/s"), ("diff", "vs shipped")]
    what = "the backward's kernels" if args.backward else "the forward kernel"
    text = (f"attention_varlen's Hopper {what} under other constants, {args.tokens} tokens, H = {args.heads}, bf16; "
            f"median of {args.launches} launches × {args.rounds} interleaved rounds.\n\n" + table(rows, columns))
    print(text)
    record("probe-varlen-backward" if args.backward else "probe-varlen", env, text, rows)


if __name__ == "__main__":
    main()
