"""Decoding over KV caches filled to different lengths: tkc.kernels.attention_kvcache vs torch's FlashAttention-2
varlen kernel reading each batch's first cache_seqlens[b] keys of its cache (`aten._flash_attention_forward` with
seqused_k: what flash_attn_with_kvcache's cache_seqlens does) and SDPA's mem-efficient backend with a key mask (the
usual way without a varlen kernel, K and V expanded to the query heads beforehand). The caches lie (B, N_max, H_kv, D)
as FlashAttention's; tkc reads them through a transposed view. "tkc, the wave's split": FEWER_PARTS_WITH_LENGTHS
off; "tkc, checked": every call takes the full checks (no common call); "tkc, paged": the same caches in pages of 256
keys scattered over a pool by a page table (block_table). GB/s: the K and V bytes each batch reads
(its length's), per µs; every timed output checked against the flash kernel's (or tkc's sm_80 build where it is
missing).

    python bench/attention_kvcache.py [--shapes 8x32x8x8192x128 32x32x8x4096x128 64x16x16x2048x64] [--nq 1]
"""

from __future__ import annotations

import argparse
import importlib
import random
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_timing_options, compare, environment, record, rel_err, table  # noqa: E402

import tkc.kernels  # noqa: E402

decode_module = importlib.import_module("tkc.kernels.attention_decode")
attention_module = importlib.import_module("tkc.kernels.attention")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["8x32x8x8192x128", "32x32x8x4096x128", "64x16x16x2048x64",
                                                        "1x32x8x32768x128", "1x32x8x4096x128"],
                        help="B x H x H_kv x N_max x D")
    parser.add_argument("--nq", type=int, default=1, help="query rows a head (decoding: 1)")
    add_timing_options(parser)
    args = parser.parse_args()
    env, rows = environment(), []
    for shape in args.shapes:
        b, h, h_kv, n_max, d = map(int, shape.split("x"))
        rng = random.Random(b * n_max)
        lengths = [rng.randint(n_max // 8, n_max) for _ in range(b)]
        seqlens = torch.tensor(lengths, device="cuda", dtype=torch.int32)
        q = torch.randn(b, h, args.nq, d, device="cuda", dtype=torch.bfloat16)
        k_cache, v_cache = (torch.randn(b, n_max, h_kv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = k_cache.transpose(1, 2), v_cache.transpose(1, 2)  # (B, H_kv, N_max, D) views
        def wave_split() -> torch.Tensor:  # Hopper's two kernels where the clusters are not all held
            decode_module.FEWER_PARTS_WITH_LENGTHS = False
            try:
                return tkc.kernels.attention_kvcache(q, k, v, seqlens)
            finally:
                decode_module.FEWER_PARTS_WITH_LENGTHS = True

        def checked() -> torch.Tensor:  # the full checks every call, as a first call's
            attention_module._KVCACHE.clear()
            return tkc.kernels.attention_kvcache(q, k, v, seqlens)

        # the same caches in pages of 256 keys (vLLM's / FlashAttention's pool (pages, page size, H_kv, D)), each
        # batch's pages scattered over the pool by its row of the page table
        per_batch = n_max // 256  # (N_max a multiple of 256)
        table = torch.randperm(b * per_batch, device="cuda").view(b, per_batch).to(torch.int32)
        pools = []
        for cache in (k_cache, v_cache):
            pool = torch.empty(b * per_batch, 256, h_kv, d, device="cuda", dtype=torch.bfloat16)
            pool[table.view(-1).long()] = cache.view(b * per_batch, 256, h_kv, d)
            pools.append(pool.transpose(1, 2))
        impls = {
            "tkc": lambda: tkc.kernels.attention_kvcache(q, k, v, seqlens),
            "tkc, paged": lambda: tkc.kernels.attention_kvcache(q, *pools, seqlens, block_table=table),
            "tkc, checked": checked,
            "tkc sm_80": lambda: tkc.kernels.attention_kvcache(q, k, v, seqlens, target="sm_80"),
            "tkc, the wave's split": wave_split,
        }
        cu_q = torch.arange(b + 1, device="cuda", dtype=torch.int32) * args.nq
        cu_k = torch.arange(b + 1, device="cuda", dtype=torch.int32) * n_max
        q_packed = q.transpose(1, 2).reshape(b * args.nq, h, d)
        k_packed, v_packed = k_cache.view(b * n_max, h_kv, d), v_cache.view(b * n_max, h_kv, d)

        def flash() -> torch.Tensor:
            o = torch.ops.aten._flash_attention_forward(q_packed, k_packed, v_packed, cu_q, cu_k, args.nq, n_max, 0.0,
                                                        False, False, seqused_k=seqlens)[0]
            return o.view(b, args.nq, h, d).transpose(1, 2)

        try:
            ref = flash()
            impls["flash varlen"] = flash
        except Exception as e:  # (this torch's op lacks seqused_k: tkc's two builds checked against each other)
            print(f"    flash varlen: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            ref = impls["tkc sm_80"]()
        mask = (torch.arange(n_max, device="cuda")[None, :] < seqlens[:, None])[:, None, None, :]
        k_heads, v_heads = (t.repeat_interleave(h // h_kv, 1) for t in (k, v))  # (expanded before timing)

        def masked_sdpa() -> torch.Tensor:
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k_heads, v_heads, attn_mask=mask)

        impls["SDPA mem-efficient, masked"] = masked_sdpa
        errors = {}
        for name, fn in list(impls.items()):
            try:
                errors[name] = rel_err(fn(), ref)
            except Exception as e:
                print(f"    {name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                del impls[name]
        times = compare(impls, args.rounds, args.launches)
        kv_bytes = sum(2 * n * h_kv * d * 2 for n in lengths)
        rate = {name: kv_bytes / (ms * 1e-3) / 1e9 for name, ms in times.items()}
        row = {"shape": shape, "Nq": args.nq, "mean length": sum(lengths) / b,
               **{f"{name} µs": times[name] * 1e3 for name in times}, **{f"{name} GB/s": rate[name] for name in rate},
               "tkc/flash": rate["tkc"] / rate.get("flash varlen", float("nan")),
               "paged/flash": rate.get("tkc, paged", float("nan")) / rate.get("flash varlen", float("nan")),
               "tkc/SDPA": rate["tkc"] / rate.get("SDPA mem-efficient, masked", float("nan")),
               "err": max(errors.get("tkc", 0.0), errors.get("tkc sm_80", 0.0), errors.get("tkc, paged", 0.0))}
        rows.append(row)
        print("  ".join(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
                        for key, value in row.items()), flush=True)
    names = ["tkc", "tkc, paged", "tkc, checked", "tkc sm_80", "tkc, the wave's split", "flash varlen", "SDPA mem-efficient, masked"]
    columns = ([("shape", "B×H×H_kv×N_max×D"), ("mean length", "mean length")]
               + [(f"{n} µs", f"{n} µs") for n in names] + [(f"{n} GB/s", f"{n} GB/s") for n in names]
               + [("tkc/flash", "tkc/flash"), ("paged/flash", "tkc paged/flash"), ("tkc/SDPA", "tkc/SDPA"),
                  ("err", "tkc err")])
    text = (f"attention_kvcache: {args.nq} query row(s) a head over caches filled to random lengths N_max/8..N_max, "
            f"bf16; GB/s of the K and V bytes each batch's length reads; median of {args.launches} launches × "
            f"{args.rounds} interleaved rounds, each call from the host (its host work included).\n\n"
            + table(rows, columns))
    print(text)
    record("attention-kvcache", env, text, rows)


if __name__ == "__main__":
    main()
