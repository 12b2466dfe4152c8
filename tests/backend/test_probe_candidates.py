"""bench/probe_candidates.py's D = 256 configurations (and D = 128's split rings), simulated on the CPU before any of
them runs on the GPU: each attention_sm90 build (a block taking two tiles, a length its steps do not divide) against
float64. One of them hung three device calls before the simulator was asked (ping-pong with P·V in its own step
and 2 stages)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def _candidates(d: int, causal: bool) -> dict[str, dict[str, int]]:
    from probe_candidates import candidates

    found = candidates(d, causal, 4096)
    if d < 256:
        return {name: cfg for name, cfg in found.items() if "rings apart" in name}
    from tkc.kernels.attention import sm90_config, sm90_constants

    own = sm90_constants(sm90_config(d, 1024, 1024, causal))  # short causal: the builds only it takes (not its grids)
    return {**found, **{f"{name} (N=1024)": cfg for name, cfg in candidates(d, causal, 1024).items()
                        if name not in found and sm90_constants(cfg) != own}}


@pytest.mark.parametrize("d, causal, name", [(d, c, name) for d in (128, 256) for c in (0, 1)
                                             for name in _candidates(d, bool(c))])
def test_candidate_simulates(d: int, causal: int, name: str) -> None:
    from hopper_kernels import simulated_attention_sm90_error

    from tkc.kernels.attention import sm90_constants

    constants = {"D": d, **sm90_constants(_candidates(d, bool(causal))[name]), "CAUSAL": causal}
    assert simulated_attention_sm90_error(constants, 200, seed=causal) < 2e-2
