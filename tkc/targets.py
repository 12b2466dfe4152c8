"""The GPUs tkc compiles for, oldest first."""

from __future__ import annotations

from dataclasses import dataclass

from tkc.errors import TkcError


@dataclass(frozen=True)
class Target:
    name: str  # as in `.target` and `-arch`
    sm: int  # compute capability × 10
    shared_bytes: int  # the most shared memory one block may use (dynamic, opted in)

    def __str__(self) -> str:
        return self.name


SM_80 = Target("sm_80", 80, 163 * 1024)
SM_90A = Target("sm_90a", 90, 227 * 1024)
TARGETS = {t.name: t for t in (SM_80, SM_90A)}
DEFAULT_TARGET = SM_90A


def get_target(name: str | Target) -> Target:
    if isinstance(name, Target):
        return name
    if name not in TARGETS:
        raise TkcError(f"unknown target {name!r}; tkc compiles for {', '.join(TARGETS)}")
    return TARGETS[name]
