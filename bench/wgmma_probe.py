"""A first look at wgmma from the DSL (tests/hopper_kernels.warpgroup_gemm: one warpgroup per 64×BN tile, cp.async
pipeline, no TMA or warp specialization yet) next to cuBLAS at one size; not the benchmark of record.

    python bench/wgmma_probe.py [--size 4096]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from common import rel_err, time_ms  # noqa: E402
from hopper_kernels import warpgroup_gemm  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=4096)
    n = parser.parse_args().size
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    bt = b.t().contiguous()
    ref = a.float() @ b.float()
    cublas = time_ms(lambda: torch.matmul(a, b))
    print(f"cuBLAS {2 * n**3 / cublas / 1e9:.0f} TFLOP/s")
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for trans_b in (0, 1):
        for bn, bk, stages in ((128, 64, 3), (256, 64, 3), (256, 64, 4), (128, 64, 4), (256, 32, 4)):
            run = lambda: warpgroup_gemm[(n // 64, n // bn)](a, bt if trans_b else b, c, TRANS_B=trans_b, BN=bn,  # noqa: E731
                                                              BK=bk, STAGES=stages, target="sm_90a")
            try:
                c.fill_(float("nan"))
                run()
                err = rel_err(c, ref)
                ms = time_ms(run)
                print(f"TRANS_B={trans_b} BN={bn} BK={bk} stages={stages}: {2 * n**3 / ms / 1e9:.0f} TFLOP/s "
                      f"({cublas / ms:.2f}x cuBLAS), err {err:.1e}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"TRANS_B={trans_b} BN={bn} BK={bk} stages={stages}: {type(e).__name__}: {str(e)[:200]}")


if __name__ == "__main__":
    main()
