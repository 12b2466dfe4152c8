#!/usr/bin/env bash
# One short device call for a session's new kernels (a little device time left): their GPU tests (-k $1), compute-
# sanitizer memcheck on sanitize.py's functions ($2, comma-separated), then the commands after them, each under
# `timeout 150`. Logs under $OUT.   bash scripts/gpu_quick.sh "varlen or mixed_ring" packed_sequences,grouped_products 'python3 bench/x.py' ...
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
python3 -c "import xdist" 2>/dev/null && workers="-n 8" || workers=""
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider $workers tests/gpu -k "$1" > "$OUT/quick-tests.log" 2>&1
grep -E "^FAILED|Error" "$OUT/quick-tests.log" | head -10; echo "tests: $(tail -1 "$OUT/quick-tests.log")"
for fn in ${2//,/ }; do
    timeout 150 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 7 python3 -c \
        "import sys; sys.path.insert(0, 'tests/gpu'); import sanitize, torch; sanitize.$fn(); torch.cuda.synchronize()" \
        > "$OUT/quick-memcheck-$fn.log" 2>&1
    echo "memcheck $fn: exit $?, $(grep -c '========= ' "$OUT/quick-memcheck-$fn.log") report lines"
done
shift 2
i=0
for command in "$@"; do
    i=$((i + 1))
    timeout 150 bash -c "$command" > "$OUT/quick-$i.log" 2>&1; echo "== $command: exit $?"; grep -v Warn "$OUT/quick-$i.log" | tail -24
done
