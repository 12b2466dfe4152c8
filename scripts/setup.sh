#!/usr/bin/env bash
# Create .venv (once) with tkc and its test tools. Reuses a torch that the machine already has (a GPU image);
# otherwise installs torch 2.13.0 (on the CPU-only dev/CI machines this is the CPU build on local disk).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv --system-site-packages .venv
fi
py=.venv/bin/python
$py -m pip install -q --upgrade pip
if ! $py -c 'import torch, sys; v = tuple(map(int, torch.__version__.split("+")[0].split(".")[:2])); sys.exit(v < (2, 11))' 2>/dev/null; then
    $py -m pip install -q torch==2.13.0
fi
$py -m pip install -q -e '.[test]'
