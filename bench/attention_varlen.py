"""Attention over packed sequences of different lengths: tkc.kernels.attention_varlen (Hopper kernel and sm_80 one)
vs torch's FlashAttention varlen kernel (`torch.ops.aten._flash_attention_forward` with cumulative lengths:
FlashAttention-2, what flash_attn_varlen_func runs) and, as a yardstick, tkc's own attention() and cuDNN's SDPA on a batch of sequences of
the mean length (the same tokens, no padding). TFLOP/s count each sequence's own work (4·len_q·len_k·H·D, halved when
causal); every timed output checked against the flash varlen kernel's first.

    python bench/attention_varlen.py [--tokens 16384] [--heads 16] [--dims 128 64] [--causal 0 1] [--backward]

--backward: the backward instead, torch.autograd.grad(o, (q, k, v), do) of each (the forward's graph kept), FLOPs
2.5 × the forward's; tkc's (attention_varlen_backward's kernels) beside flash varlen's autograd.

Mixes: "uniform" (the tokens as sequences of 2048), "mixed" (random lengths 256–4096, seeded), "short" (random
lengths 64–1024: many sequences, as a packed fine-tuning batch).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_timing_options, compare, environment, record, rel_err, table  # noqa: E402

import tkc.kernels  # noqa: E402


def lengths(mix: str, tokens: int) -> list[int]:
    rng = random.Random(tokens)
    low, high = {"uniform": (2048, 2048), "mixed": (256, 4096), "short": (64, 1024)}[mix]
    out: list[int] = []
    while sum(out) < tokens:
        out.append(min(rng.randint(low, high), tokens - sum(out)))
    return out


def flash_varlen(q, k, v, cu, longest, causal):  # type: ignore[no-untyped-def]
    """torch's FlashAttention-2 varlen forward (its output only)."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, longest, longest, 0.0, causal, False)[0]


def dense_yardstick(dense, causal, args):  # type: ignore[no-untyped-def]
    """Median ms of tkc's attention() and cuDNN's SDPA on the dense batch `dense` (q, k, v)."""
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        return compare({"tkc dense": lambda: tkc.kernels.attention(*dense, causal=causal),
                        "cuDNN dense": lambda: torch.nn.functional.scaled_dot_product_attention(*dense,
                                                                                                is_causal=causal)},
                       args.rounds, args.launches)


def backward_impls(forwards, q, k, v):  # type: ignore[no-untyped-def]
    """Each forward of `forwards` as a backward: torch.autograd.grad of its output (its graph kept) with one grad_out;
    and the reference gradient of q (flash varlen's)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    grad = torch.randn_like(q)
    impls = {}
    for name, forward in forwards.items():
        try:
            out = forward(*leaves)
        except Exception as e:
            print(f"    {name} forward: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            continue
        impls[name] = lambda out=out: torch.autograd.grad(out, leaves, grad, retain_graph=True)
    try:
        return impls, impls["flash varlen"]()[0]
    except Exception as e:  # (no autograd for the aten op in this torch: tkc's two builds checked against each other)
        print(f"    flash varlen backward: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        impls.pop("flash varlen", None)
        return impls, impls["tkc sm_80 varlen"]()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dims", type=int, nargs="+", default=[128, 64])
    parser.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--mixes", nargs="+", default=["uniform", "mixed", "short"])
    parser.add_argument("--backward", action="store_true", help="time the backward (autograd.grad) instead")
    add_timing_options(parser)
    args = parser.parse_args()
    env, rows = environment(), []
    for d in args.dims:
        for causal in map(bool, args.causal):
            for mix in args.mixes:
                lens = lengths(mix, args.tokens)
                cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
                q, k, v = (torch.randn(args.tokens, args.heads, d, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                mean = args.tokens // len(lens) // 64 * 64 or 64  # a dense batch of about the same tokens
                dense = [torch.randn(args.tokens // mean, args.heads, mean, d, device="cuda", dtype=torch.bfloat16)
                         for _ in range(3)]
                forwards = {  # (q, k, v) → out
                    "tkc varlen": lambda q, k, v: tkc.kernels.attention_varlen(q, k, v, cu, causal=causal),
                    "tkc sm_80 varlen": lambda q, k, v: tkc.kernels.attention_varlen(q, k, v, cu, causal=causal,
                                                                                    target="sm_80"),
                    "flash varlen": lambda q, k, v: flash_varlen(q, k, v, cu, max(lens), causal),
                }
                try:
                    ref = forwards["flash varlen"](q, k, v)
                except Exception as e:  # (this torch's op differs: tkc's two kernels checked against each other)
                    print(f"    flash varlen: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    del forwards["flash varlen"]
                    ref = forwards["tkc sm_80 varlen"](q, k, v)
                impls = {name: (lambda f=f: f(q, k, v)) for name, f in forwards.items()}
                if args.backward:
                    impls, ref = backward_impls(forwards, q, k, v)
                errors = {name: rel_err(fn()[0] if args.backward else fn(), ref) for name, fn in impls.items()}
                times = compare(impls, args.rounds, args.launches)
                dense_times = {"tkc dense": float("nan"), "cuDNN dense": float("nan")}  # (none for the backward)
                if not args.backward:
                    dense_times = dense_yardstick(dense, causal, args)
                work = (sum(4 * n * n * args.heads * d for n in lens) / (2 if causal else 1)
                        * (2.5 if args.backward else 1))
                dense_work = 4 * mean * mean * args.heads * d * (args.tokens // mean) / (2 if causal else 1)
                rate = {name: work / (ms * 1e-3) / 1e12 for name, ms in times.items()}
                rate.update({name: dense_work / (ms * 1e-3) / 1e12 for name, ms in dense_times.items()})
                row = {"D": d, "causal": int(causal), "mix": mix, "sequences": len(lens), "longest": max(lens),
                       **{name: rate[name] for name in rate},
                       "tkc/flash": rate["tkc varlen"] / rate.get("flash varlen", float("nan")),
                       "sm_80/flash": rate["tkc sm_80 varlen"] / rate.get("flash varlen", float("nan")),
                       "tkc/tkc dense": rate["tkc varlen"] / rate["tkc dense"],
                       "err": max(errors["tkc varlen"], errors["tkc sm_80 varlen"])}
                rows.append(row)
                print("  ".join(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
                                for key, value in row.items()), flush=True)
    columns = [("D", "D"), ("causal", "causal"), ("mix", "lengths"), ("sequences", "sequences"),
               ("longest", "longest"), ("tkc varlen", "tkc varlen"), ("tkc sm_80 varlen", "tkc sm_80 varlen"),
               ("flash varlen", "flash varlen"),
               ("tkc dense", "tkc dense (mean length)"), ("cuDNN dense", "cuDNN dense"), ("tkc/flash", "tkc/flash"),
               ("sm_80/flash", "sm_80/flash"),
               ("tkc/tkc dense", "tkc varlen / dense"), ("err", "tkc err")]
    what = ("the backward: torch.autograd.grad calls, FLOPs 2.5 × the forward's; errors of dq against flash's"
            if args.backward else "errors against torch's flash varlen kernel")
    text = (f"TFLOP/s (each sequence's 4·len²·H·D, halved when causal), {args.tokens} tokens, H = {args.heads}, bf16; "
            f"median of {args.launches} back-to-back launches × {args.rounds} interleaved rounds; {what}. Dense: a "
            f"batch of sequences of the mean length, the same tokens.\n\n" + table(rows, columns))
    print(text)
    record("attention-varlen-backward" if args.backward else "attention-varlen", env, text, rows)


if __name__ == "__main__":
    main()
