#!/usr/bin/env bash
# Ad-hoc device batches: the wheels installed as gpu_session.sh does, then the commands given (each a string),
# their output to $OUT/batch-N.log and its tail here.   bash scripts/device_batch.sh "cmd 1" "cmd 2" ...
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-logs}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD TKC_CACHE_DIR=/tmp/tkc-cache PYTHONUNBUFFERED=1
i=0
for cmd in "$@"; do
    i=$((i + 1))
    echo "== $cmd"
    bash -c "$cmd" > "$OUT/batch-$i.log" 2>&1
    echo "rc=$?"; grep -v -e Warning -e "^  warnings" "$OUT/batch-$i.log" | tail -${TAIL:-30}
done
