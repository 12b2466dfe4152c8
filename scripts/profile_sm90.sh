#!/usr/bin/env bash
# ncu on an sm_90a kernel (bench/profile_sm90.py): summary metrics, stall reasons, and the SASS lines where warps
# stall most (source page of a SourceCounters report). Run on the GPU machine; logs under $OUT.
#   bash scripts/profile_sm90.sh gemm ["PRODUCER STAGES GRID" ...]
#   bash scripts/profile_sm90.sh attention ["D CAUSAL KEYS WARPS PINGPONG DEFER PRODUCER Q_REGS TILES" ...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-logs}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
export TKC_CACHE_DIR=${TKC_CACHE_DIR:-/tmp/tkc-cache}
what=${1:-gemm}; shift
kernel=$([ "$what" = gemm ] && echo gemm_sm90 || echo attention_sm90)
for cfg in "${@:-}"; do
    tag=$what-${cfg// /-}
    echo "== $what $cfg"
    timeout 200 ncu --clock-control none --launch-skip 1 --launch-count 1 -k regex:$kernel \
        --section SourceCounters --section WarpStateStats --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__inst_issued.avg.pct_of_peak_sustained_active,gpu__time_duration.sum \
        -o "$OUT/rep-$tag" -f python3 bench/profile_sm90.py $what $cfg > "$OUT/ncu-$tag.log" 2>&1
    ncu -i "$OUT/rep-$tag.ncu-rep" --page details --print-units base 2>/dev/null | grep -E "duration|hmma|gmma|pipe_xu|issued|Stall|stall" | head -18
    ncu -i "$OUT/rep-$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/sass-$tag.csv" 2>/dev/null
    python3 - "$OUT/sass-$tag.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
header = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)  # after a "Kernel Name" row
if header is None:
    sys.exit()
data = [dict(zip(rows[header], r)) for r in rows[header + 1:] if len(r) == len(rows[header])]
key = "Warp Stall Sampling (All Samples)"
total = sum(float(r.get(key) or 0) for r in data) or 1.0
for r in sorted(data, key=lambda r: -float(r.get(key) or 0))[:25]:
    print(f"{100 * float(r.get(key) or 0) / total:5.1f}%  {r.get('Address', '')}  {r.get('Source', '')[:110]}")
PY
    rm -f "$OUT/rep-$tag.ncu-rep"
done
