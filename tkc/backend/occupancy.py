"""How many blocks of a kernel fit on one multiprocessor at once, from what ptxas reports: its registers a thread,
its threads a block (the PTX's `.maxntid`) and its shared memory (what the launch asks for, plus ptxas's static
shared memory). The rules of the CUDA occupancy calculator: registers are given to each warp in units of 256, the
driver keeps 1 KB of shared memory a block, and a multiprocessor holds at most 32 blocks and 2048 threads.

    $ tkc compile tkc/kernels/attention_bwd.py --kernel attention_bwd_dkdv_sm90 -D D=64 -D WARPS=4 -D STAGES=3 \
          -D CAUSAL=1 --resources > /dev/null
    tkc: `attention_bwd_dkdv_sm90` on sm_90a: 172 registers a thread, ..., 66608 bytes of shared memory; 2 blocks
    a multiprocessor on an H100 / H200 (registers allow 2, shared memory 3, threads 16); 3 would need at most 168
    registers a thread

A kernel a few registers above such a step runs at one block less a multiprocessor than it could: `blocks_per_sm`
(@tkc.kernel) asks ptxas to stay under it.
"""

from __future__ import annotations

from dataclasses import dataclass

REGISTER_UNIT = 256  # registers are allocated to a warp in multiples of this


@dataclass(frozen=True)
class Multiprocessor:
    """One multiprocessor's limits (those of the GPU a target is named for)."""

    gpu: str
    registers: int = 65536
    shared_bytes: int = 233472  # what the blocks on it may use in all (the carve-out at its largest)
    reserved_shared_bytes: int = 1024  # a block's share the driver keeps
    max_blocks: int = 32
    max_threads: int = 2048


MULTIPROCESSORS = {
    "sm_80": Multiprocessor("A100", shared_bytes=167936),  # 164 KB
    "sm_90": Multiprocessor("H100 / H200"),  # 228 KB
    "sm_90a": Multiprocessor("H100 / H200"),
}


@dataclass(frozen=True)
class Occupancy:
    blocks: int  # resident blocks a multiprocessor: the least of the three below
    by_registers: int
    by_shared_memory: int
    by_threads: int
    registers_for_one_more: int | None  # the most registers a thread that fit blocks + 1 (if registers limit)


def warp_registers(registers: int) -> int:
    """The registers a warp of threads of `registers` each is given."""
    return -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT


def occupancy(registers: int, threads: int, shared_bytes: int, target: str) -> Occupancy:
    """Blocks of `threads` threads using `registers` a thread and `shared_bytes` of shared memory that fit on one
    multiprocessor of `target`'s GPU at once."""
    sm = MULTIPROCESSORS[target]
    warps = -(-threads // 32)
    by_registers = sm.registers // warp_registers(max(registers, 1)) // warps
    by_shared = sm.shared_bytes // (shared_bytes + sm.reserved_shared_bytes)
    by_threads = min(sm.max_blocks, sm.max_threads // (32 * warps))
    blocks = min(by_registers, by_shared, by_threads)
    more = None
    if by_registers == blocks < min(by_shared, by_threads):
        per_warp = sm.registers // ((blocks + 1) * warps) // REGISTER_UNIT * REGISTER_UNIT
        more = per_warp // 32 if per_warp >= REGISTER_UNIT else None
    return Occupancy(blocks, by_registers, by_shared, by_threads, more)


def describe(occ: Occupancy, target: str) -> str:
    """`occ` as a phrase of --resources' report."""
    gpu = MULTIPROCESSORS[target].gpu
    text = (f"{occ.blocks} block{'s' if occ.blocks != 1 else ''} a multiprocessor on an {gpu} (registers allow "
            f"{occ.by_registers}, shared memory {occ.by_shared_memory}, threads {occ.by_threads})")
    if occ.registers_for_one_more is not None:
        text += f"; {occ.blocks + 1} would need at most {occ.registers_for_one_more} registers a thread"
    return text
