#!/usr/bin/env bash
# The next device call's work in order of worth, each step only while the call's 590 s allow it (the device is
# scarce: one call may be all a session gets). On an H200 first issue 4's layernorm bar (launch floor, bench); then
# the GPU tests of what no GPU has run yet (paged attention_kvcache, keep_rows in decoding, the varlen backward's
# one zero-tail launch, the mixed ring), compute-sanitizer memcheck on decoding, and the benchmarks that re-time
# them. Logs under $OUT; a line a step, the tables last.      bash scripts/gpu_first_call.sh
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
start=$SECONDS
left() { echo $((590 - (SECONDS - start))); }
step() {  # step NAME SECONDS COMMAND...: run when SECONDS remain, under that timeout
    local name=$1 need=$2; shift 2
    if [ "$(left)" -lt "$need" ]; then echo "== $name: skipped ($(left) s left)"; return; fi
    timeout "$need" "$@" > "$OUT/first-$name.log" 2>&1
    echo "== $name: exit $? ($((SECONDS - start)) s)"
}
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); echo "$gpu"
if grep -q H200 <<< "$gpu"; then
    step launch-floor 120 python3 bench/probe_launch_floor.py
    step layernorm 200 python3 bench/layernorm.py
fi
python3 -c "import xdist" 2>/dev/null && workers="-n 8" || workers=""
step tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider $workers tests/gpu -k "kvcache or decode or varlen or mixed_ring"
step memcheck 120 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 7 python3 -c \
    "import sys; sys.path.insert(0, 'tests/gpu'); import sanitize, torch; sanitize.decode_attention(); torch.cuda.synchronize()"
step kvcache 150 python3 bench/attention_kvcache.py
step varlen-backward 150 python3 bench/attention_varlen.py --backward
for name in launch-floor layernorm tests memcheck kvcache varlen-backward; do
    [ -f "$OUT/first-$name.log" ] || continue
    echo "---- $name"; grep -E "^FAILED|Error|=====" "$OUT/first-$name.log" | head -8; grep -v Warn "$OUT/first-$name.log" | tail -12
done
