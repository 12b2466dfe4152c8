"""Runs the FileCheck tests of tests/filecheck through lit (how to run one file: tests/filecheck/README.md).

lit, `tkc` and `filecheck` are taken from the bin directory of the running Python, so a fresh venv tests its own
checkout; the test skips, saying what to install, when one of them is missing.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
SUITE = Path(__file__).parent / "filecheck"
INSTALL = "install the test extra: pip install -e '.[test]'"


def _lit() -> list[str] | None:
    if importlib.util.find_spec("lit") is None:
        return None
    script = shutil.which("lit", path=str(BIN))
    if script is not None:
        return [script]
    # lit has no __main__ module, so `python -m lit` does not work: call its entry point
    return [sys.executable, "-c", "import sys; from lit.main import main; sys.exit(main())"]


def test_filecheck_suite() -> None:
    lit = _lit()
    if lit is None:
        pytest.skip(f"lit is not installed for {sys.executable}: {INSTALL}")
    for tool in ("filecheck", "tkc"):
        if shutil.which(tool, path=str(BIN)) is None:
            pytest.skip(f"`{tool}` is not in {BIN}: {INSTALL}")
    result = subprocess.run([*lit, "-q", "-v", str(SUITE)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"lit failed:\n{result.stdout}\n{result.stderr}"
