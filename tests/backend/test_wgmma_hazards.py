"""In the SASS ptxas makes of attention_sm90, no instruction writes the registers of a wgmma still running (its
accumulator or its A operand) or reads its accumulator: the hazards a PTX simulation cannot see (ptxas 13.0 once
gave P the queries' registers while P·V ran on). Read in straight lines: an HGMMA group is running from its issue
to the `WARPGROUP.DEPBAR.LE gsb0, N` that leaves fewer than it in flight; code after an unconditional branch starts
with nothing known to run. The configurations of attention() and the rotated tile loops (defer=3, 4); a planted
write and a planted read are found."""

from __future__ import annotations

import re

import pytest

from tkc.backend import ptxas
from tkc.compiler import compile_for_launch
from tkc.kernels import attention_sm90
from tkc.kernels.attention import sm90_config, sm90_constants

ALIGNS = {"Q": 16, "K": 16, "V": 16, "O": 16, "L": 4}
_INSTRUCTION = re.compile(r"\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9._]*)\s*(.*?);")
_NO_DESTINATION = ("ST", "RED", "ATOM", "SYNCS", "BAR", "BRA", "EXIT", "WARPGROUP", "UTMA", "RET", "CALL", "NOP",
                   "WARPSYNC", "MEMBAR", "FENCE", "DEPBAR")


def _registers(operand: str, opcode: str) -> set[int]:
    """The registers an operand names (R20.64 and 64-bit ops: a pair)."""
    m = re.match(r"\[?-?\|?R(\d+)(\.64)?", operand.strip())
    if not m:
        return set()
    first = int(m.group(1))
    return set(range(first, first + (2 if m.group(2) or "WIDE" in opcode or opcode.endswith(".64") else 1)))


def running_wgmma_hazards(sass: str) -> list[str]:
    running: list[list[tuple[set[int], set[int]]]] = []  # committed groups: (accumulator, A) per HGMMA
    open_group: list[tuple[set[int], set[int]]] = []
    found = []
    for line in sass.splitlines():
        m = _INSTRUCTION.search(line)
        if not m:
            continue
        guarded, opcode, operands = m.group(1), m.group(2), [o for o in m.group(3).split(",") if o.strip()]
        if opcode.startswith("HGMMA"):
            n = int(re.match(r"HGMMA\.64x(\d+)x16", opcode).group(1))  # type: ignore[union-attr]
            acc = min(_registers(operands[0], opcode))
            a = _registers(operands[1], opcode)
            open_group.append((set(range(acc, acc + n // 2)), set(range(min(a), min(a) + 4)) if a else set()))
            if "gsb0" in m.group(3):
                running.append(open_group)
                open_group = []
            continue
        if opcode.startswith("WARPGROUP.DEPBAR"):
            left = int(re.search(r"0x([0-9a-f]+)", m.group(3)).group(1), 16)  # type: ignore[union-attr]
            running = running[len(running) - left:] if left else []
            continue
        if opcode == "BRA" and not guarded:
            running, open_group = [], []
            continue
        regs = [_registers(o, opcode) for o in operands]
        written = set() if opcode.startswith(_NO_DESTINATION) or not regs else regs[0]
        read = set().union(*(regs[1:] if written else regs)) if regs else set()
        for acc, a in [g for group in [*running, open_group] for g in group]:
            if written & (acc | a) or read & acc:
                found.append(line.strip())
    return found


CONFIGS = {f"attention() D={d} N={n} causal={c}": {"D": d, **sm90_constants(sm90_config(d, n, n, bool(c))), "CAUSAL": c}
           for d in (64, 128) for n in (1024, 4096) for c in (0, 1)}
CONFIGS |= {f"defer={defer} D={d} causal={c}": {"D": d, "KEYS": 128, "WARPS": 8, "DEFER": defer, "PRODUCER": 1,
                                                 "Q_REGS": 1, "CAUSAL": c}
            for defer in (3, 4) for d in (64, 128) for c in (0, 1)}


def _sass(constants: dict) -> str:
    return ptxas.disassemble(compile_for_launch(attention_sm90, "sm_90a", {**constants, "LSE": 1}, ALIGNS).ptx, "sm_90a")


@pytest.mark.skipif(ptxas.find_ptxas() is None or ptxas.find_nvdisasm() is None, reason="ptxas/nvdisasm not installed")
@pytest.mark.parametrize("name", list(CONFIGS))
def test_nothing_touches_a_running_wgmmas_registers(name: str) -> None:
    assert not running_wgmma_hazards(_sass(CONFIGS[name]))


@pytest.mark.skipif(ptxas.find_ptxas() is None or ptxas.find_nvdisasm() is None, reason="ptxas/nvdisasm not installed")
def test_a_planted_write_and_read_are_found() -> None:
    lines = _sass(CONFIGS["defer=4 D=128 causal=0"]).splitlines()
    at = next(i for i, line in enumerate(lines) if "HGMMA" in line)
    acc = int(re.search(r"HGMMA\S*\s+R(\d+)", lines[at]).group(1))  # type: ignore[union-attr]
    for planted in (f"FMUL R{acc + 3}, R1, R2", f"FMUL R1, R{acc + 3}, R2"):
        sass = "\n".join([*lines[:at + 1], f"        /*0000*/                   {planted} ;", *lines[at + 1:]])
        assert running_wgmma_hazards(sass) == [f"/*0000*/                   {planted} ;"]
