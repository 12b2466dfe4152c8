"""Attention backward: tkc vs torch SDPA's backward (flash, cuDNN, mem-efficient backends).

Each implementation's forward runs once on inputs requiring grad; the timed call is its backward,
torch.autograd.grad(o, (q, k, v), do) (autograd's own work included, the same for all). FLOPs = 2.5 × the forward's
(10·B·H·N²·D: the five products of the backward), halved when causal. Every gradient is checked against the
mem-efficient backend's backward run in float32.

    python bench/attention_backward.py [--seqlens 1024 ...] [--dims 64 128] [--causal 0 1] [--launches 20] [--rounds 3]
                                       [--kv-heads 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (add_attention_sizes, add_timing_options, attention_cases, compare, environment,  # noqa: E402
                    heads_text, record, rel_err, table)

import tkc.kernels  # noqa: E402

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cuDNN": SDPBackend.CUDNN_ATTENTION,
            "mem-efficient": SDPBackend.EFFICIENT_ATTENTION}
IMPLS = ("tkc", *BACKENDS)


def forward(name: str, q, k, v, causal: bool):
    """`name`'s forward on leaves q, k, v requiring grad: its output, with the graph its backward runs."""
    if name == "tkc":
        return tkc.kernels.attention(q, k, v, causal=causal)
    with sdpa_kernel(BACKENDS[name]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                enable_gqa=k.shape[1] != q.shape[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    add_attention_sizes(parser)
    add_timing_options(parser)
    parser.set_defaults(launches=20)
    args = parser.parse_args()
    env = environment()
    rows = []
    for d, causal, n, b, h in attention_cases(args):
        q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16).requires_grad_()
        k, v = (torch.randn(b, args.kv_heads or h, n, d, device="cuda", dtype=torch.bfloat16).requires_grad_()
                for _ in range(2))
        grad = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
        leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
        group = h // k.shape[1]  # K and V repeated per query head inside autograd (mem-efficient takes no GQA)
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            ref_out = torch.nn.functional.scaled_dot_product_attention(
                leaves[0], leaves[1].repeat_interleave(group, 1), leaves[2].repeat_interleave(group, 1),
                is_causal=causal)
        refs = torch.autograd.grad(ref_out, leaves, grad.float())
        impls, errors = {}, {}
        for name in IMPLS:
            try:
                out = forward(name, q, k, v, causal)
                grads = torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
                errors[name] = max(rel_err(g, r) for g, r in zip(grads, refs))
                impls[name] = lambda out=out: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
            except Exception as e:  # noqa: BLE001  (a backend that refuses this case)
                print(f"  {name} failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        times = compare(impls, args.rounds, args.launches)
        flops = 10 * b * h * n * n * d / (2 if causal else 1)
        row = {"D": d, "causal": int(causal), "N": n, "B": b}
        for name in IMPLS:
            row[f"{name} TFLOP/s"] = flops / times[name] / 1e9 if name in times else float("nan")
            row[f"{name} err"] = errors.get(name, float("nan"))
        for peer in BACKENDS:
            row[f"tkc / {peer}"] = times[peer] / times["tkc"] if peer in times and "tkc" in times else float("nan")
        rows.append(row)
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        del q, k, v, grad, leaves, refs, impls
    cols = [("D", "D"), ("causal", "causal"), ("N", "N"), ("B", "B")]
    cols += [(f"{n} TFLOP/s", n) for n in IMPLS]
    cols += [(f"tkc / {p}", f"tkc/{p}") for p in BACKENDS]
    cols += [("tkc err", "tkc err"), ("flash err", "flash err")]
    text = table(rows, cols)
    print(text)
    record("attention-backward", env, f"TFLOP/s of the backward (10·B·H·N²·D, halved when causal), B·N = {args.tokens}, "
           f"{heads_text(args)}, bf16; median of {args.launches} back-to-back torch.autograd.grad calls × {args.rounds} "
           "interleaved rounds (each in a new order); errors (the largest of dq, dk, dv) against the mem-efficient "
           "backend's backward in float32.\n\n" + text, rows)


if __name__ == "__main__":
    main()
