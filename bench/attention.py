"""Attention forward: tkc vs torch SDPA (flash, cuDNN, mem-efficient backends) and Triton.

B·N = 16384 tokens, H = 16, N in {512 … 16384}, D in {64, 128}, causal and not. FLOPs = 4·B·H·N²·D, halved when
causal. Every output is checked against the mem-efficient backend run in float32.

    python bench/attention.py [--seqlens 512 1024 ...] [--dims 64 128] [--launches 30] [--rounds 3] [--variants]
                              [--kv-heads 4]

--kv-heads gives K and V fewer heads than Q (grouped-query attention); SDPA's backends then run through
scaled_dot_product_attention(..., enable_gqa=True) inside sdpa_kernel (its dispatch inside the timing), and the peers
that take no groups drop out with their error printed.

With --variants, attention_sm90's variants run beside attention() (same wrapper work, the kernel launched
directly): see `variant_configs`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (add_attention_sizes, add_timing_options, attention_cases, check_outputs, compare, environment,  # noqa: E402
                    heads_text, print_rates, record, rel_err, table, triton_peer)

import tkc.kernels  # noqa: E402

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cuDNN": SDPBackend.CUDNN_ATTENTION,
            "mem-efficient": SDPBackend.EFFICIENT_ATTENTION}


def sdpa(backend: SDPBackend, q, k, v, causal: bool):
    """torch's SDPA through one backend: bf16 calls go straight to the op SDPA dispatches to for it (no backend
    selection or context manager inside the timing); the float32 reference (mem-efficient) goes through SDPA."""
    ops = torch.ops.aten
    if q.dtype == torch.bfloat16 and k.shape[1] == q.shape[1]:  # plain branches: this is inside the timed call
        if backend == SDPBackend.CUDNN_ATTENTION:
            return ops._scaled_dot_product_cudnn_attention(q, k, v, None, False, 0.0, causal)[0]
        if backend == SDPBackend.FLASH_ATTENTION:
            return ops._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[0]
        if backend == SDPBackend.EFFICIENT_ATTENTION:
            return ops._scaled_dot_product_efficient_attention(q, k, v, None, False, 0.0, causal)[0]
    with sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                enable_gqa=k.shape[1] != q.shape[1])


VARIANTS = ("tkc alt A", "tkc alt B", "tkc alt C")


def variant_configs(d: int, n: int, causal: bool) -> dict[str, dict[str, int]]:
    """Beside attention()'s sm90_config(d, N, N, causal), attention_sm90 launched directly with other schedules
    (a producer and the queries in registers). D=128 (attention() rotates the tile loop, DEFER=3, 128-key steps),
    on attention()'s grid (persistent not causal, two query blocks per block causal): A = P·V deferred only
    (DEFER=1, the previous default), B = 64-key steps with P·V deferred and the next Q·Kᵀ early (DEFER=1 +
    OVERLAP=1: both under the softmax), C = DEFER=3 with the warpgroups taking turns at the tensor cores
    (PINGPONG=1). D=64, on a persistent grid: A = attention()'s short configuration (below 2048 keys: P·V after the
    row max) with a lean producer warpgroup (PRODUCER=2, 24 registers a thread), B = DEFER=1 + OVERLAP=1 with
    64-key steps, C = the same with a 5-stage ring. All with the row sums exchanged once a tile (LATE_SUMS=1), as
    attention()."""
    regs = {"WARPS": 8, "PRODUCER": 1, "Q_REGS": 1, "LATE_SUMS": 1}
    overlapped = {**regs, "KEYS": 64, "DEFER": 1, "OVERLAP": 1}
    if d == 256:  # beside attention()'s (K and V in rings apart, two stages; 80-key steps, causal below LONG_KEYS
        # keys 64): A one ring for both (attention() before 2026-12-06: P·V deferred one step not causal), B half of
        # Q in registers with three stages of 64 keys, C 64-key steps with a lean producer
        from tkc.kernels.attention import sm90_config

        own = sm90_config(d, n, n, causal)
        return {"tkc alt A": one_ring_d256(own, causal),
                "tkc alt B": {**own, "Q_REGS": 2, "KEYS": 64, "STAGES": 3, "PRODUCER": 2},
                "tkc alt C": {**own, "KEYS": 64, "PRODUCER": 2}}
    if d >= 96:  # D = 96 as 128
        grid = {"TILES": 2} if causal else {"PERSISTENT": 1}
        return {"tkc alt A": {**regs, "KEYS": 128, "DEFER": 1, **grid}, "tkc alt B": {**overlapped, **grid},
                "tkc alt C": {**regs, "KEYS": 128, "DEFER": 3, "PINGPONG": 1, **grid}}
    return {"tkc alt A": {**regs, "KEYS": 128, "DEFER": 2, "PRODUCER": 2, "LATE_PV": 1, "PERSISTENT": 1},
            "tkc alt B": {**overlapped, "PERSISTENT": 1}, "tkc alt C": {**overlapped, "STAGES": 5, "PERSISTENT": 1}}


def one_ring_d256(own: dict[str, int], causal: bool) -> dict[str, int]:
    """attention()'s D = 256 configuration `own` with one ring for K and V, as before 2026-12-06 (P·V deferred one
    step not causal, step 0 peeled causal)."""
    return {**{key: value for key, value in own.items() if key != "SPLIT_RING"}, "DEFER": 2 if causal else 1}


def sm90_variant(q, k, v, causal: bool, cfg: dict[str, int]):
    """attention_sm90 with a scheduling variant, allocated and launched as attention() does."""
    from tkc.kernels.attention import launch_sm90

    out = torch.empty_like(q)
    lse = torch.empty((1, 1, 1), dtype=torch.float32, device=q.device)
    launch_sm90(q, k, v, out, lse, q.shape[3] ** -0.5, cfg, causal=causal)
    return out


def compare_candidates(q, k, v, causal: bool, configs: dict[str, dict[str, int]], where: str, rounds: int) -> None:
    """attention() beside attention_sm90 `configs` (name → configuration), cuDNN and flash on q, k, v: each output
    checked against cuDNN, then a probe's TFLOP/s lines."""
    ref = sdpa(BACKENDS["cuDNN"], q, k, v, causal)
    fns = {"attention()": lambda: tkc.kernels.attention(q, k, v, causal=causal)}
    for name, cfg in configs.items():
        fns[name] = lambda cfg=cfg: sm90_variant(q, k, v, causal, cfg)
    fns["cuDNN"] = lambda: sdpa(BACKENDS["cuDNN"], q, k, v, causal)
    fns["flash"] = lambda: sdpa(BACKENDS["flash"], q, k, v, causal)
    check_outputs(fns, ref, where=where)
    b, h, n, d = q.shape
    print_rates(where, compare(fns, rounds=rounds), 4 * b * h * n * k.shape[2] * d / (2 if causal else 1))


def main() -> None:
    parser = argparse.ArgumentParser()
    add_attention_sizes(parser)
    parser.add_argument("--variants", action="store_true", help="also attention_sm90's variants (variant_configs)")
    add_timing_options(parser)
    args = parser.parse_args()
    triton_kernels = triton_peer()
    env = environment()
    rows = []
    for d, causal, n, b, h in attention_cases(args):
        q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, args.kv_heads or h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        group = h // k.shape[1]  # the reference's K and V repeated per query head (mem-efficient takes no GQA)
        ref = sdpa(SDPBackend.EFFICIENT_ATTENTION, q.float(), k.float().repeat_interleave(group, 1),
                   v.float().repeat_interleave(group, 1), causal)
        impls = {
            "tkc sm_80": lambda: tkc.kernels.attention(q, k, v, causal=causal, target="sm_80"),
            "tkc": lambda: tkc.kernels.attention(q, k, v, causal=causal),
        }
        for name, backend in BACKENDS.items():
            impls[name] = lambda backend=backend: sdpa(backend, q, k, v, causal)
        if triton_kernels is not None:
            impls["triton"] = lambda: triton_kernels.attention(q, k, v, causal=causal)
        if args.variants:
            for name, cfg in variant_configs(d, n, bool(causal)).items():
                impls[name] = lambda cfg=cfg: sm90_variant(q, k, v, causal, cfg)
        errors = {}
        for name, fn in list(impls.items()):
            try:
                errors[name] = rel_err(fn(), ref)
            except Exception as e:  # noqa: BLE001
                print(f"  {name} failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                errors[name] = float("nan")
                del impls[name]
        times = compare(impls, args.rounds, args.launches)
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        row = {"D": d, "causal": int(causal), "N": n, "B": b}
        for name in ["tkc sm_80", "tkc", *BACKENDS, "triton", *(VARIANTS if args.variants else ())]:
            row[f"{name} TFLOP/s"] = flops / times[name] / 1e9 if name in times else float("nan")
            row[f"{name} err"] = errors.get(name, float("nan"))
        for peer in [*BACKENDS, "triton"]:
            for mine in ("tkc sm_80", "tkc", *(VARIANTS if args.variants else ())):
                row[f"{mine} / {peer}"] = (times[peer] / times[mine]) if peer in times and mine in times else float("nan")
        rows.append(row)
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if "err" not in k}, flush=True)
        del q, k, v, ref
    cols = [("D", "D"), ("causal", "causal"), ("N", "N"), ("B", "B")]
    cols += [(f"{n} TFLOP/s", f"{n}") for n in ("tkc sm_80", "tkc", *BACKENDS, "triton")]
    cols += [(f"tkc sm_80 / {p}", f"sm_80/{p}") for p in ("flash", "cuDNN", "triton")]
    cols += [(f"tkc / {p}", f"tkc/{p}") for p in ("flash", "cuDNN", "triton")]
    if args.variants:
        cols += [(f"{v} / cuDNN", f"{v.removeprefix('tkc ')}/cuDNN") for v in VARIANTS]
    cols += [("tkc sm_80 err", "sm_80 err"), ("tkc err", "tkc err")]
    text = table(rows, cols)
    print(text)
    record("attention", env, f"TFLOP/s (4·B·H·N²·D, halved when causal), B·N = {args.tokens}, {heads_text(args)}, bf16; "
           f"median of {args.launches} back-to-back launches × {args.rounds} interleaved rounds (each in a new order) through each public entry point; "
           "errors against the mem-efficient backend in float32.\n\n" + text, rows)


if __name__ == "__main__":
    main()
