#!/usr/bin/env bash
# The test suite (CPU): sets up .venv if needed, then runs pytest on every core (pytest-xdist; `-n 0` after the
# command runs it in one process). GPU tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -n auto tests "$@"
