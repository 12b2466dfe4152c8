"""A stage the consumers read with ldmatrix (attention_sm90's queries, Q_REGS=1) and give back for the next TMA load:
the simulator reports a TMA load issued into bytes an ldmatrix may not have read yet (nothing has used its
registers, and its warp ran no `fence.proxy.async`): on the H200 a stage released right after its ldmatrix and
refilled was read wrong (defer=3, RESULTS 2026-12-03). The lowering fences such releases: attention() survives warps
handed over every few instructions, and without the fence the simulation fails."""

from __future__ import annotations

import numpy as np
import pytest
from reference import attention_ref, poisoned, random_bf16, rel_err

from tkc.backend import lower_tma
from tkc.backend.simulator import SimulationError, simulate
from tkc.compiler import lower_kernel
from tkc.kernels import attention_sm90
from tkc.kernels.attention import sm90_blocks, sm90_config, sm90_constants

ALIGNS = {"Q": 16, "K": 16, "V": 16, "O": 16, "L": 4}


def _run(d: int, causal: int, seed: int = 0, batch: int = 2, heads: int = 3, n: int = 300, **changes: int) -> None:
    cfg = {**sm90_config(d, n, n, bool(causal)), **changes}
    constants = {"D": d, **sm90_constants(cfg), "CAUSAL": causal, "LSE": 1}
    rng = np.random.default_rng(seed)
    q, k, v = (random_bf16(rng, batch, heads, n, d) for _ in range(3))
    args = [q, k, v, poisoned(batch, heads, n, d), poisoned(batch, heads, n, dtype=np.float32), d**-0.5]
    module = lower_kernel(attention_sm90, "sm_90a", constants, aligns=ALIGNS)
    simulate(module, "attention_sm90", args, (sm90_blocks(batch, heads, n, cfg["WARPS"], 3),), order="sliced", seed=seed)
    assert rel_err(args[3], attention_ref(q, k, v, causal=bool(causal), scale=d**-0.5)) < 2e-2


@pytest.mark.parametrize("d, causal", [(128, 0), (128, 1), (64, 0)])
def test_attention_survives_fine_interleaving(d: int, causal: int) -> None:
    _run(d, causal)


def test_a_release_without_the_proxy_fence_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """DEFER=1 releases the queries' stage right after their ldmatrix (DEFER=3, attention()'s at D=128, only after
    the first Q·Kᵀ has read the registers: ordered by then)."""
    monkeypatch.setattr(lower_tma, "_read_by_generic_loads", lambda fn: set())
    with pytest.raises(SimulationError, match="ldmatrix"):
        _run(128, 0, DEFER=1)
