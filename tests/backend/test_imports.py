"""Each backend module imports on its own in a fresh process: backend/lowering.py imports tkc.passes, which loads
the lower-to-ptx pass, which needs the lowering — a cycle that only an import order the suite never takes shows."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["tkc.backend.lowering", "tkc.backend.lower_compute", "tkc.backend.lower_memory",
                                    "tkc.backend.lower_copies", "tkc.backend.addressing", "tkc.backend.lower_tma", "tkc.backend.lower_control", "tkc.backend.simulator",
                                    "tkc.passes.lower_to_ptx"])
def test_module_imports_first(module: str) -> None:
    result = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
