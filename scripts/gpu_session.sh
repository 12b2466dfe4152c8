#!/usr/bin/env bash
# One device call for the sm_90a GEMM work: GPU tests of the Hopper path, the kernel probe, the GEMM benchmark of
# record (tables to $OUT for bench/collect.py), then a profile if time is left. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-logs}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD TKC_CACHE_DIR=/tmp/tkc-cache PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/gpu -k "gemm or hopper or producer" > "$OUT/tests-hopper.log" 2>&1
echo "hopper tests: $(tail -1 "$OUT/tests-hopper.log")"
timeout 200 python3 bench/wgmma_probe.py --what gemm > "$OUT/probe.log" 2>&1; tail -25 "$OUT/probe.log"
timeout 260 python3 bench/gemm.py > "$OUT/bench-gemm.log" 2>&1; tail -8 "$OUT/bench-gemm.log"
