"""@tkc.autotune on a CUDA GPU: every config timed with CUDA events on the call's own arguments, the one over the
shared-memory budget left out, the fastest launched once more on the restored accumulator (the answer is the
kernel's one launch), and the next call for the same shapes not tuned again."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tkc  # noqa: E402
from tkc.lang import block_idx, const, f32, gl, load, rt, st, store  # noqa: E402

pytestmark = pytest.mark.gpu


@tkc.autotune(configs=[{"ROWS": 16}, {"ROWS": 64}, {"ROWS": 1024}], restore=["Acc"])
@tkc.kernel(warps=1, min_target="sm_80")
def add_rows(X: gl[f32, 2], Acc: gl[f32, 2], ROWS: const = 16, COLS: const = 64):
    """Acc += X, ROWS rows a block through a shared tile (1024 rows of 64 floats: 256 KB, over any budget)."""
    i = block_idx()[0]
    rows = load(X, (i, 0), st[f32, ROWS, COLS])
    for r in range(ROWS // 16):
        tile = i * (ROWS // 16) + r
        store(Acc, load(Acc, (tile, 0), rt[f32, 16, COLS]) + load(rows, (r, 0), rt[f32, 16, COLS]), (tile, 0))


@pytest.mark.parametrize("target", ["sm_80", None])
def test_autotune_times_the_configs_and_keeps_the_answer(target: str | None) -> None:
    m = 8192
    x = torch.rand(m, 64, device="cuda")
    acc = torch.rand(m, 64, device="cuda")
    want = acc + x
    add_rows[lambda c: (-(-m // c["ROWS"]),)](x, acc, target=target)
    torch.cuda.synchronize()
    assert torch.equal(acc, want)  # tuning ran it many times; the accumulator was put back before the real launch
    (problem, results), = [(p, r) for p, r in add_rows.results.items() if p[2] == target]
    times = {config["ROWS"]: ms for config, ms in results}
    assert isinstance(times[16], float) and isinstance(times[64], float) and times[16] > 0 and times[64] > 0
    assert "shared memory over the" in times[1024]
    assert add_rows.best[problem]["ROWS"] in (16, 64)
    add_rows[lambda c: (-(-m // c["ROWS"]),)](x, acc, target=target)
    torch.cuda.synchronize()
    assert torch.equal(acc, want + x) and add_rows.results[problem] is results  # not tuned again
    assert "*" in add_rows.report()
