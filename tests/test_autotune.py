"""@tkc.autotune on the CPU: the launches stand in (tkc.runtime.launch.run records them) and so do the timings
(autotune._time_ms answers from a table), so that what is tuned, chosen, kept, skipped and reported is checked here;
tests/gpu/test_autotune_gpu.py times real launches."""

from __future__ import annotations

from typing import Any

import pytest

import tkc
from tkc.errors import TkcError
from tkc.lang import *  # noqa: F403
from tkc.runtime import autotune as autotune_module
from tkc.runtime import launch

torch = pytest.importorskip("torch")


@tkc.kernel(warps=4, min_target="sm_80")
def scale_rows(X: gl[f32, 2], Y: gl[f32, 2], ROWS: const = 64, COLS: const = 64, STAGES: const = 2):
    store(Y, load(X, (block_idx()[0], 0), rt[f32, ROWS, COLS]) * 2.0, (block_idx()[0], 0))


class Stand:
    """Stand-ins for the launch and the timer: launches are recorded; a config's time comes from `ms` (by ROWS),
    and one with ROWS in `broken` fails to compile."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, ms: dict[int, float], broken: tuple[int, ...] = ()):
        self.launches: list[tuple[tuple[int, int, int], dict[str, Any]]] = []
        self.timed: list[int] = []

        def run(kernel, grid, args, constants, target=None, pipeline=None, common_only=False):
            if constants.get("ROWS") in broken:
                raise TkcError(f"shared memory over the sm_90a budget (ROWS={constants['ROWS']})")
            self.launches.append((grid, dict(constants)))
            args[1].add_(1)  # the kernel writes Y: restore= puts it back
            return True

        def time_ms(run_once, rounds, launches):
            run_once()
            self.timed.append(self.launches[-1][1]["ROWS"])
            return ms[self.launches[-1][1]["ROWS"]]

        monkeypatch.setattr(launch, "run", run)
        monkeypatch.setattr(autotune_module, "_time_ms", time_ms)


def tuned(**options: Any):
    return tkc.autotune(configs=[{"ROWS": 64}, {"ROWS": 128, "STAGES": 3}, {"ROWS": 256}], **options)(scale_rows)


def test_the_fastest_config_runs_and_stays_chosen_per_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each config is timed once for a new key (its grid from the config), the fastest launches; the next call with
    the same key launches it straight away; another shape tunes again."""
    stand = Stand(monkeypatch, {64: 0.3, 128: 0.1, 256: 0.2})
    k = tuned()
    x, y = torch.zeros(1024, 64), torch.zeros(1024, 64)
    k[lambda c: (1024 // c["ROWS"],)](x, y)
    assert stand.timed == [64, 128, 256]
    assert stand.launches[-1] == ((8, 1, 1), {"ROWS": 128, "STAGES": 3})
    k[lambda c: (1024 // c["ROWS"] // (c["COLS"] // 64),)](x, y)  # every constant, defaults too
    assert stand.timed == [64, 128, 256] and stand.launches[-1] == ((8, 1, 1), {"ROWS": 128, "STAGES": 3})
    k[lambda c: (512 // c["ROWS"],)](torch.zeros(512, 64), torch.zeros(512, 64))
    assert stand.timed == [64, 128, 256] * 2
    report = k.report()
    assert report.count("tkc autotune `scale_rows` (X 1024×64 torch.float32, Y 1024×64 torch.float32)") == 1
    assert "*    0.1000 ms  {'ROWS': 128, 'STAGES': 3}" in report


def test_the_calls_constants_join_the_key_and_the_config_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Constants given at the call are part of the key and reach every launch; a config's own values override
    them."""
    stand = Stand(monkeypatch, {64: 0.3, 128: 0.1, 256: 0.2})
    k = tuned(key=["X"])
    x, y = torch.zeros(256, 64), torch.zeros(256, 64)
    k[(4,)](x, y, COLS=64, STAGES=4)
    assert stand.launches[-1] == ((4, 1, 1), {"COLS": 64, "STAGES": 3, "ROWS": 128})
    k[(4,)](x, y, COLS=64, STAGES=4)
    k[(4,)](x, torch.zeros(1, 1), COLS=64, STAGES=4)  # Y is not in the key
    assert stand.timed == [64, 128, 256]
    k[(4,)](x, y, COLS=64, STAGES=2)
    assert stand.timed == [64, 128, 256] * 2


def test_a_config_that_does_not_build_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A config that does not compile here is skipped with its error in the report; if none builds, the first
    config's error is raised."""
    stand = Stand(monkeypatch, {64: 0.3, 128: 0.1, 256: 0.2}, broken=(128,))
    k = tuned()
    x, y = torch.zeros(256, 64), torch.zeros(256, 64)
    k[(1,)](x, y)
    assert stand.launches[-1][1] == {"ROWS": 256}
    assert "not run: shared memory over the sm_90a budget (ROWS=128)" in k.report()
    Stand(monkeypatch, {}, broken=(64, 128, 256))
    with pytest.raises(TkcError, match=r"ROWS=64\)"):
        tuned()[(1,)](x, y)


def test_restored_tensors_are_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors named in `restore` hold the call's values again before each config's runs and before the real
    launch: the real launch sees what the caller passed."""
    Stand(monkeypatch, {64: 0.3, 128: 0.1, 256: 0.2})
    y = torch.full((256, 64), 5.0)
    k = tuned(restore=["Y"])
    k[(1,)](torch.zeros(256, 64), y)
    assert float(y[0, 0]) == 6.0  # one add after the restore: the real launch's
    k2 = tuned()
    y2 = torch.full((256, 64), 5.0)
    k2[(1,)](torch.zeros(256, 64), y2)
    assert float(y2[0, 0]) == 9.0  # three tuning launches and the real one, nothing put back


@pytest.mark.parametrize("options, message", [
    ({"configs": [{"ROWS": 64}, {"ROW": 128}]}, r"config 1 \({'ROW': 128}\) sets 'ROW'; the kernel's constants are "
                                                r"ROWS, COLS, STAGES"),
    ({"configs": []}, "no configs to choose from"),
    ({"configs": [{"ROWS": 64}], "key": ["Z"]}, r"key names `Z`, which is not one of its run-time parameters \(X, Y\)"),
    ({"configs": [{"ROWS": 64}], "restore": ["x"]}, "restore names `x`"),
])
def test_a_wrong_decorator_is_one_clear_error_at_the_kernel(options: dict[str, Any], message: str) -> None:
    with pytest.raises(TkcError, match=message) as caught:
        tkc.autotune(**options)(scale_rows)
    assert caught.value.loc is not None and caught.value.loc.file == __file__


def test_the_kernels_own_methods_stay_reachable() -> None:
    k = tuned()
    assert "tile.store" in str(k.build(ROWS=64)) and k.name == "scale_rows"
    with pytest.raises(TkcError, match="above @tkc.kernel"):
        tkc.autotune(configs=[{}])(lambda: None)
