"""The occupancy arithmetic of `tkc compile --resources` against cases worked by hand (and measured: the D=64
dK/dV kernel's step from 172 to 168 registers, RESULTS 2026-12-05 19:04)."""

from __future__ import annotations

import pytest

from tkc.backend.occupancy import describe, occupancy, warp_registers


def test_registers_are_given_a_warp_in_units_of_256() -> None:
    assert warp_registers(168) == 5376 and warp_registers(172) == 5632 and warp_registers(1) == 256


@pytest.mark.parametrize("registers, threads, shared, target, blocks, by, more", [
    (172, 128, 65584, "sm_90a", 2, "registers", 168),   # attention_bwd_dkdv_sm90 D=64 causal: 11 warps' registers
    (168, 128, 65584, "sm_90a", 3, "both", None),        # ... with BLOCKS=3
    (40, 64, 128, "sm_80", 25, "registers", 32),         # layernorm_kernel D=1024: 51 warps' registers
    (255, 256, 163840, "sm_90a", 1, "both", None),       # a wgmma kernel of 160 KB
    (16, 64, 0, "sm_90a", 32, "threads", None),          # small blocks: at most 32 a multiprocessor
    (16, 1024, 0, "sm_80", 2, "threads", None),          # 2048 threads a multiprocessor
    (64, 128, 100 * 1024, "sm_80", 1, "shared", None),   # the A100's 164 KB: one block of 100 KB
])
def test_occupancy(registers: int, threads: int, shared: int, target: str, blocks: int, by: str,
                   more: int | None) -> None:
    occ = occupancy(registers, threads, shared, target)
    assert occ.blocks == blocks and occ.registers_for_one_more == more
    limits = {"registers": occ.by_registers, "shared": occ.by_shared_memory, "threads": occ.by_threads}
    if by == "both":
        assert occ.by_registers == occ.by_shared_memory == blocks
    else:
        assert limits[by] == blocks and all(n > blocks for name, n in limits.items() if name != by)
    if more is not None:  # the hint is right: that many registers fit one block more, one step more does not
        assert occupancy(more, threads, shared, target).blocks > blocks
        assert occupancy(more + 1, threads, shared, target).blocks == blocks


def test_describe() -> None:
    text = describe(occupancy(172, 128, 65584, "sm_90a"), "sm_90a")
    assert text == ("2 blocks a multiprocessor on an H100 / H200 (registers allow 2, shared memory 3, threads 16); "
                    "3 would need at most 168 registers a thread")
    assert describe(occupancy(255, 256, 163840, "sm_90a"), "sm_90a").startswith("1 block a multiprocessor")
