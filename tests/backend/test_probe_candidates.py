"""bench/probe_candidates.py's D = 256 configurations (and D = 128's split rings), simulated on the CPU before any of
them runs on the GPU: each attention_sm90 build (a block taking two tiles, a length its steps do not divide) against
float64. One of them hung three device calls before the simulator was asked (ping-pong with P·V in its own step
and 2 stages)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from reference import attention_ref, poisoned, random_bf16, rel_err

from tkc.backend.simulator import simulate
from tkc.compiler import lower_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def _candidates(d: int, causal: bool) -> dict[str, dict[str, int]]:
    from probe_candidates import candidates

    found = candidates(d, causal, 4096)
    return found if d == 256 else {name: cfg for name, cfg in found.items() if "rings apart" in name}


@pytest.mark.parametrize("d, causal, name", [(d, c, name) for d in (128, 256) for c in (0, 1)
                                             for name in _candidates(d, bool(c))])
def test_candidate_simulates(d: int, causal: int, name: str) -> None:
    from tkc.kernels import attention_sm90
    from tkc.kernels.attention import sm90_constants

    batch, heads, n = 1, 2, 200
    constants = {"D": d, **sm90_constants(_candidates(d, bool(causal))[name]), "CAUSAL": causal}
    rng = np.random.default_rng(causal)
    q, k, v = (random_bf16(rng, batch, heads, n, d) for _ in range(3))
    args = [q, k, v, poisoned(batch, heads, n, d), poisoned(batch, heads, n, dtype=np.float32), d**-0.5]
    module = lower_kernel(attention_sm90, "sm_90a", constants, aligns={"Q": 16, "K": 16, "V": 16, "O": 16, "L": 4})
    simulate(module, "attention_sm90", args, (2,), order="shuffled")
    assert rel_err(args[3], attention_ref(q, k, v, causal=bool(causal), scale=d**-0.5)) < 2e-2
