"""Decoding: attention() for one query (or a few) a head over a KV cache, by its decoding kernels (the keys split
over the GPU, then the parts weighed: in one launch where a head's parts make a cluster, attention_decode_cluster;
"two launches": attention_decode and attention_decode_combine) and by attention_sm90 (DECODE_ON_HOPPER off: a block per head), beside SDPA's
backends (enable_gqa). GB/s of K and V read (what bounds decoding) and the ratio to the best SDPA backend;
event-timed (host work included) and from a CUDA graph (the GPU's time alone), outputs checked first.
    python bench/probe_decode.py [--shapes B,H,H_kv,Nq,Nk ...] [--dims 128] [--rounds 5] [--variants [REGEX]] [--kernels]
                                 [--target sm_80]"""
import argparse
import importlib
import re
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import check_outputs, compare, graph_time_ms  # noqa: E402

from tkc.kernels import attention  # noqa: E402
attention_module = importlib.import_module("tkc.kernels.attention")  # the module (tkc.kernels.attention is the function)
decode_module = importlib.import_module("tkc.kernels.attention_decode")

SHAPES = ["1,32,8,1,4096", "1,32,8,1,8192", "1,32,8,1,16384", "1,32,8,1,32768", "8,32,8,1,8192", "64,32,8,1,2048", "1,32,32,1,8192", "16,32,8,4,4096",
          "1,64,8,1,131072"]
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cuDNN": SDPBackend.CUDNN_ATTENTION,
            "mem-efficient": SDPBackend.EFFICIENT_ATTENTION}


# attention_decode's settings beside its defaults (tkc/kernels/attention_decode.py CONFIG: 128-key steps, 2 stages,
# parts for one block a multiprocessor): fewer or more steps a part, parts for two or four blocks a multiprocessor,
# 64-key steps (the sm_80 path's CONFIG_SM80: two blocks fit an SM) with 2 or 3 stages
VARIANTS = {"2 steps a part": {"MIN_STEPS": 2}, "8 steps a part": {"MIN_STEPS": 8},
            "2 blocks an SM": {"CONFIG": {64: (64, 2, 2), 128: (32, 2, 2)}},
            "4 blocks an SM": {"CONFIG": {64: (64, 2, 4), 128: (32, 2, 4)}},
            "64-key steps, 2 stages": {"CONFIG": {64: (32, 2, 2), 128: (16, 2, 2)}},
            "64-key steps, 3 stages": {"CONFIG": {64: (32, 3, 1), 128: (16, 3, 1)}},
            # fewer, larger parts where a wave's do not make clusters the GPU holds (B = 1, 16 parts: GPCs of < 16 SMs)
            "at most 12 parts, clusters": {"CLUSTER_PARTS": 12}, "at most 8 parts, clusters": {"CLUSTER_PARTS": 8},
            "at most 3 parts, clusters": {"CLUSTER_PARTS": 3},  # B = 4, 4 parts: clusters of 4 not all held
            # one launch on the wave's split: the last part of each row tile to arrive weighs them (any GPU)
            "one launch, the last part weighs": {"DECODE_LAST_BLOCK": True, "DECODE_LAST_BLOCK_SM80": True}}  # (graphs too)


def tkc_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decode: bool, settings: dict | None = None,
                  target: str | None = None):
    plans: dict = {}  # its own common-call plans: attention_sm90's (made with the flag off) must not serve the other
    decode_plans: dict = {}  # and its own decoding plans (made under its settings)

    def run() -> torch.Tensor:
        attention_module.DECODE_ON_HOPPER, attention_module._PLANS = decode, plans
        decode_module._PLANS = decode_plans
        saved = {name: getattr(decode_module, name) for name in settings or {}}
        for name, value in (settings or {}).items():
            setattr(decode_module, name, value)
        try:
            return attention(q, k, v, target=target)
        finally:
            for name, value in saved.items():
                setattr(decode_module, name, value)
    run.plans = decode_plans  # type: ignore[attr-defined]
    return run


def decoding_path(run) -> str:
    """How a tkc_attention's decoding plan launched: one launch in clusters (all of them held at once), or two."""
    for plan in run.plans.values():
        if plan.clustered is not None and plan.together:
            return f"one launch, clusters of {plan.clustered.spec.constants['CLUSTER']}"
        parts = plan.flat_parts[0]
        if plan.fewer is not None:
            return (f"one launch in clusters of {plan.fewer[0].spec.constants['CLUSTER']} (a wave's {parts} parts' "
                    "clusters not all held; from a graph: two launches)")
        if plan.last is not None:
            graph = "; from a graph: two launches" if plan.last_block == "eager" else ""
            return f"one launch, the last of {parts} parts weighs them{graph}"
        held = "" if plan.clustered is None else ", its clusters not all held at once"
        return f"two launches, {parts} parts{held}"
    return "no decoding plan"


def kernels_alone(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict:
    """attention_decode and attention_decode_combine launched alone, on buffers made once (as attention_decode_launch
    launches them on Hopper): what each costs of a decoding step; and attention_decode_cluster where it applies."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = decode_module._plan(q.shape, k.shape, q.dtype, False, None, sms, True, False)
    kv = (k, v, q.new_zeros((1,), dtype=torch.int32), q.new_zeros((1, 1), dtype=torch.int32))  # (Lengths, Pages: unread)
    decode, combine, steps, q_rows, (parts, flat, d) = plan.decode, plan.combine, plan.steps, plan.q_rows, plan.flat_parts
    o_parts = q.new_empty(plan.parts_shape, dtype=torch.float32)
    l_parts = q.new_empty(plan.parts_shape[:3], dtype=torch.float32)
    out = torch.empty_like(q)
    kernels = {f"attention_decode alone ({parts} parts of {steps} steps)":
               lambda: decode(q.view(q_rows), *kv, o_parts, l_parts, 0.1, steps),
               "attention_decode_combine alone": lambda: combine(o_parts.view(parts, flat, d),
                                                                 l_parts.view(parts, flat), out.view(flat, d),
                                                                 l_parts.view(-1))}
    last = decode_module.attention_decode_last.specialize(**{**decode.spec.constants, "LSE": 0},
                                                          target=decode.spec.target)[decode.grid]
    counters = torch.zeros(plan.q_rows[0] * plan.q_rows[1] * -(-plan.q_rows[2] // 16), device="cuda",
                           dtype=torch.int32)
    last_out = q.new_empty((1, 1, 1), dtype=torch.float32)
    kernels["attention_decode_last alone (one launch, the last part weighs)"] = (
        lambda: last(q.view(q_rows), *kv, o_parts, l_parts, out.view(q_rows), last_out, counters, 0.1, steps))
    if plan.clustered is not None:
        unread = q.new_empty((1, 1, 1), dtype=torch.float32)
        x, y, z = plan.clustered.grid
        held = plan.clustered.spec.resident_blocks(q.view(q_rows), *kv, out.view(q_rows), unread, 0.1, steps)
        kernels[f"attention_decode_cluster alone (clusters of {parts}; {x * y * z} blocks, the GPU holds {held})"] = (
            lambda: plan.clustered(q.view(q_rows), *kv, out.view(q_rows), unread, 0.1, steps))
    return kernels


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: SDPBackend):
    def run() -> torch.Tensor:
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="+", default=SHAPES)
    parser.add_argument("--dims", type=int, nargs="+", default=[128])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", nargs="?", const="", default=None, metavar="REGEX",
                        help="attention_decode's other settings too (those whose names REGEX finds)")
    parser.add_argument("--kernels", action="store_true", help="attention_decode and its combine alone too (graph)")
    parser.add_argument("--target", default=None, help="tkc's target (sm_80: the path A100s run, no clusters)")
    args = parser.parse_args()
    torch.manual_seed(0)
    for d in args.dims:
        for shape in args.shapes:
            b, h, h_kv, nq, nk = map(int, shape.split(","))
            q = torch.randn(b, h, nq, d, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(b, h_kv, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
            target = args.target
            impls = {"tkc decode": tkc_attention(q, k, v, True, target=target),
                     # the parts not in clusters (two launches: attention_decode, attention_decode_combine)
                     "tkc decode, two launches": tkc_attention(q, k, v, True, {"DECODE_IN_CLUSTERS": False,
                                                                              "DECODE_LAST_BLOCK_SM80": False}, target)}
            if target is None:
                impls["tkc sm90"] = tkc_attention(q, k, v, False)
            for name, settings in VARIANTS.items() if args.variants is not None else ():
                if not re.search(args.variants, name):
                    continue
                impls[f"decode, {name}"] = tkc_attention(q, k, v, True, settings, target)
            for name, backend in BACKENDS.items():
                try:
                    sdpa(q, k, v, backend)()
                    impls[name] = sdpa(q, k, v, backend)
                except RuntimeError as e:
                    print(f"  {name} refuses: {str(e).splitlines()[0][:100]}")
            check_outputs(impls, ref, where=f"B={b} H={h} H_kv={h_kv} Nq={nq} Nk={nk} D={d}")
            times = compare(impls, rounds=args.rounds)
            graphs = {name: graph_time_ms(fn) for name, fn in impls.items()}
            nbytes = 2 * k.numel() * k.element_size()
            best = min((name for name in impls if name in BACKENDS), key=lambda name: times[name], default=None)
            print(f"B={b} H={h} H_kv={h_kv} Nq={nq} Nk={nk} D={d}: K+V {nbytes / 1e6:.1f} MB; GB/s event-timed "
                  f"(graph); ratio to {best} event (graph); tkc decode: {decoding_path(impls['tkc decode'])}",
                  flush=True)
            for name in impls:
                rate, graph_rate = nbytes / times[name] / 1e6, nbytes / graphs[name] / 1e6
                ratio = (f"{times[best] / times[name]:5.2f} ({graphs[best] / graphs[name]:5.2f})" if best else "")
                print(f"  {name:28s} {times[name] * 1e3:8.1f} µs {rate:7.0f} ({graph_rate:7.0f})  {ratio}", flush=True)
            for name, fn in (kernels_alone(q, k, v) if args.kernels else {}).items():
                print(f"  {name}: {graph_time_ms(fn) * 1e3:.1f} µs from a graph", flush=True)
    attention_module.DECODE_ON_HOPPER = False


if __name__ == "__main__":
    main()
