"""The README's main command (scripts/demo.sh): its CPU part runs and passes here, as the CI's test command does
not run the script itself."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "scripts" / "demo.sh"


def test_the_demo_interprets_attention_correctly() -> None:
    """The demo's first Python step: attention_fwd interpreted on the CPU against float64 (its grid once went
    stale when the kernel's grid order changed, and the demo printed NaN)."""
    first = re.findall(r"python - <<'PY'\n(.*?)\nPY\n", DEMO.read_text(), re.S)[0]
    result = subprocess.run([sys.executable, "-"], input=first, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "relative error vs float64 reference" in result.stdout
