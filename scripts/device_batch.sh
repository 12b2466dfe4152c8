#!/usr/bin/env bash
# Ad-hoc device batches: the wheels installed as gpu_session.sh does, then the commands given (each a string),
# their output to $OUT/batch-N.log and its tail here.   bash scripts/device_batch.sh "cmd 1" "cmd 2" ...
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
i=0
for cmd in "$@"; do
    i=$((i + 1))
    echo "== $cmd"
    bash -c "$cmd" > "$OUT/batch-$i.log" 2>&1
    echo "rc=$?"; grep -v -e Warning -e "^  warnings" "$OUT/batch-$i.log" | tail -${TAIL:-30}
done
