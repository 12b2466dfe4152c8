"""How fast global memory takes a warp's 16×64 f32 tile, by each way tkc writes one: atomic_add as TMA reductions
(sm_90a, 16-byte aligned rows), as red.global.add.v2.f32 (sm_90a, rows 8-byte aligned only), as
red.global.add.f32 (sm_80), and plain stores (st.global) for scale. Every warp of
8 blocks a multiprocessor writes REPEAT times into its own tile of a 17 MB tensor (L2-resident; no two warps share
an element), so what is timed is the write path's throughput. The attention backward's fused kernel (dQ by
atomics) reduces ~0.5 GB at D=128 N=4096 (RESULTS "attention backward, dQ by atomics").

    python bench/probe_reductions.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import time_ms  # noqa: E402

import tkc  # noqa: E402
from tkc.lang import atomic_add, block_idx, const, f32, gl, load, rt, store, warp_id  # noqa: E402

REPEAT = 16


@tkc.kernel(warps=4, min_target="sm_80")
def add_tiles(X: gl[f32, 2], Y: gl[f32, 2], REPEAT: const = 16):
    tile = block_idx()[0] * 4 + warp_id()
    x = load(X, (tile, 0), rt[f32, 16, 64])
    for _ in range(REPEAT):
        atomic_add(Y, x, (tile, 0))


@tkc.kernel(warps=4, min_target="sm_80")
def store_tiles(X: gl[f32, 2], Y: gl[f32, 2], REPEAT: const = 16):
    tile = block_idx()[0] * 4 + warp_id()
    x = load(X, (tile, 0), rt[f32, 16, 64])
    for i in range(REPEAT):
        store(Y, x + i, (tile, 0))


def main() -> None:
    blocks = 8 * torch.cuda.get_device_properties(0).multi_processor_count
    rows = blocks * 64
    x = torch.randn(rows, 64, device="cuda")
    gbytes = blocks * 4 * REPEAT * 16 * 64 * 4 / 1e9
    cases = {
        "atomic_add, TMA reductions (sm_90a)": (add_tiles, 64, {"target": "sm_90a"}),
        "atomic_add, red.global.add.v2.f32 (sm_90a, 8-byte rows)": (add_tiles, 66, {"target": "sm_90a"}),
        "atomic_add, red.global.add.f32 (sm_80)": (add_tiles, 64, {"target": "sm_80"}),
        "store, st.global (sm_90a)": (store_tiles, 64, {"target": "sm_90a"}),
    }
    for name, (kernel, pitch, options) in cases.items():
        y = torch.zeros(rows, pitch, device="cuda")[:, :64]
        run = lambda: kernel[(blocks,)](x, y, REPEAT=REPEAT, **options)  # noqa: E731
        run()
        torch.cuda.synchronize()
        if kernel is add_tiles:
            ok = torch.allclose(y, x * REPEAT, rtol=1e-5, atol=1e-4)
        else:
            ok = torch.equal(y, x + (REPEAT - 1))
        ms = time_ms(run)
        print(f"{name:58s} {ms * 1e3:8.1f} µs  {gbytes / ms * 1e3 / 1e3:6.2f} TB/s  {'ok' if ok else 'WRONG'}",
              flush=True)


if __name__ == "__main__":
    main()
