"""A first look at wgmma from the DSL next to cuBLAS at one size (not the benchmark of record):
tkc.kernels.gemm_sm90_kernel with one or two consumer warpgroups (a TMA + mbarrier ring where the operands are
16-byte aligned), without and with a producer warpgroup (PRODUCER=1: specialize-warps, setmaxnreg).

    python bench/wgmma_probe.py [--size 4096] [--n 4096] [--what gemm attention]   (small GEMMs: --size 2048)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import checked_time, time_ms  # noqa: E402

from tkc.kernels import gemm_sm90_kernel  # noqa: E402
from tkc.kernels.attention import launch_sm90  # noqa: E402


# attention_sm90 variants the probe compares: the shipped one, ping-pong, the early Q·Kᵀ (overlap), both
ATTENTION_CONFIGS = {
    128: [{"KEYS": 128, "WARPS": 8}, {"KEYS": 128, "WARPS": 8, "PINGPONG": 1},
          {"KEYS": 128, "WARPS": 8, "OVERLAP": 1, "STAGES": 2}, {"KEYS": 64, "WARPS": 8, "OVERLAP": 1},
          {"KEYS": 64, "WARPS": 8, "PINGPONG": 1, "OVERLAP": 1}],
    64: [{"KEYS": 64, "WARPS": 8}, {"KEYS": 64, "WARPS": 8, "PINGPONG": 1}, {"KEYS": 64, "WARPS": 8, "OVERLAP": 1},
         {"KEYS": 128, "WARPS": 8, "OVERLAP": 1}, {"KEYS": 64, "WARPS": 8, "PINGPONG": 1, "OVERLAP": 1}],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--what", nargs="+", default=["gemm", "attention"])
    parser.add_argument("--config", action="append", default=[], metavar="D:NAME=V,NAME=V",
                        help="attention variants to time instead of the default list, e.g. 128:KEYS=128,PINGPONG=1")
    args = parser.parse_args()
    if args.config:
        ATTENTION_CONFIGS.clear()
        for spec in args.config:
            d, _, settings = spec.partition(":")
            cfg = {"WARPS": 8, **{k: int(v) for k, v in (kv.split("=") for kv in settings.split(",") if kv)}}
            ATTENTION_CONFIGS.setdefault(int(d), []).append(cfg)
    if "gemm" in args.what:
        gemm(args.size)
    if "attention" in args.what:
        attention(args.n)


def attention(n: int) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h = max(1, 16384 // n), 16
    for d in ATTENTION_CONFIGS:
        for causal in (0, 1):
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            o = torch.empty_like(q)
            lse = torch.empty(1, 1, 1, device="cuda")  # LSE=0: not written
            flops = 4 * b * h * n * n * d / (2 if causal else 1)
            peers = {}
            for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
                with sdpa_kernel(backend):
                    peers[name] = time_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)))
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
            print(f"D={d} causal={causal}: flash {flops / peers['flash'] / 1e9:.0f}, cuDNN {flops / peers['cuDNN'] / 1e9:.0f} TFLOP/s")
            for cfg in ATTENTION_CONFIGS[d]:
                label = f"  D={d} causal={causal} " + " ".join(f"{k}={v}" for k, v in cfg.items())
                run = lambda cfg=cfg: launch_sm90(q, k, v, o, lse, d**-0.5, cfg, causal=bool(causal))  # noqa: E731
                try:
                    ms, err = checked_time(run, o, ref)
                    print(f"{label}: {flops / ms / 1e9:.0f} TFLOP/s ({peers['flash'] / ms:.2f}x flash, "
                          f"{peers['cuDNN'] / ms:.2f}x cuDNN), err {err:.1e}", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"{label}: {type(e).__name__}: {str(e)[:200]}")


def gemm(n: int) -> None:
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    bt = b.t().contiguous()
    ref = a.float() @ b.float()
    cublas = time_ms(lambda: torch.matmul(a, b))
    print(f"cuBLAS {2 * n**3 / cublas / 1e9:.0f} TFLOP/s")
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for trans_b in (0, 1):
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for warps, bn, bk, stages, producer, persistent, tma_store in (
                (8, 256, 64, 4, 0, 0, 0), (8, 256, 64, 3, 1, 1, 0), (8, 256, 64, 3, 1, 1, 1), (8, 256, 64, 3, 0, 1, 1),
                (12, 256, 64, 4, 0, 1, 0), (12, 256, 64, 3, 0, 1, 0), (12, 256, 64, 4, 0, 0, 0),
                (12, 192, 64, 4, 1, 1, 0), (8, 256, 128, 2, 1, 1, 0),
                # small GEMMs (2048³: 128 tiles of 128×256 leave one wave of one block an SM): smaller tiles, two or
                # three blocks an SM (shared memory 98 / 97 / 73 / 81 KB a block; 90, 90, 90, 154 registers a thread)
                (8, 128, 64, 2, 0, 0, 1), (8, 128, 64, 3, 0, 0, 0), (4, 128, 64, 3, 0, 0, 0), (4, 256, 64, 2, 0, 0, 0)):
            tiles = -(-n // (16 * warps)) * -(-n // bn)
            grid = (min(tiles, sms) if persistent else tiles,)
            run = lambda: gemm_sm90_kernel[grid](a, bt if trans_b else b, c, TRANS_B=trans_b, BN=bn, BK=bk,  # noqa: E731
                                                  WARPS=warps, STAGES=stages, PRODUCER=producer,
                                                  TMA_STORE=tma_store, target="sm_90a")
            label = (f"TRANS_B={trans_b} WARPS={warps} BN={bn} BK={bk} STAGES={stages} PRODUCER={producer} "
                     f"TMA_STORE={tma_store} grid={grid[0]}")
            try:
                ms, err = checked_time(run, c, ref)
                print(f"{label}: {2 * n**3 / ms / 1e9:.0f} TFLOP/s ({cublas / ms:.2f}x cuBLAS), err {err:.1e}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"{label}: {type(e).__name__}: {str(e)[:200]}")
    # fewer blocks than multiprocessors: if the blocks contend for L2 bandwidth, each gets faster as they thin out
    for blocks in (sms, sms // 2, sms // 4):
        run = lambda: gemm_sm90_kernel[(blocks,)](a, b, c, BN=256, BK=64, WARPS=8, STAGES=3, PRODUCER=1,  # noqa: E731
                                                  target="sm_90a")
        ms, err = checked_time(run, c, ref)
        print(f"{blocks} blocks: {2 * n**3 / ms / 1e9:.0f} TFLOP/s, {2 * n**3 / ms / 1e9 / blocks:.2f} per block")


if __name__ == "__main__":
    main()
