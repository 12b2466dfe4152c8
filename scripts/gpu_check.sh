#!/usr/bin/env bash
# On a CUDA machine: the GPU tests, compute-sanitizer on every kernel, then the benchmarks. Logs go to $OUT (or
# ./gpu-logs). With wheels in .whl/ (a machine without registry access), they are installed first.
#   bash scripts/gpu_check.sh [tests] [hopper] [sanitize] [memcheck] [profile] [sweep] [compile-time] [bench-quick | bench]
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
steps=${*:-tests sanitize bench-quick}
summary=""
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
for step in $steps; do
    case $step in
    tests)
        python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/tests.log" | tail -25
        summary+="tests: $(tail -1 "$OUT/tests.log")\n" ;;
    sanitize)
        for tool in memcheck racecheck synccheck; do
            timeout 600 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 7 python3 tests/gpu/sanitize.py > "$OUT/sanitize-$tool.log" 2>&1
            rc=$?
            summary+="compute-sanitizer $tool: exit $rc, $(grep -c '========= ' "$OUT/sanitize-$tool.log") report lines\n"
            tail -5 "$OUT/sanitize-$tool.log"
        done ;;
    memcheck)
        timeout 600 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 7 python3 tests/gpu/sanitize.py > "$OUT/memcheck.log" 2>&1
        summary+="compute-sanitizer memcheck: exit $?\n"
        grep -m 30 -E "Invalid|Address|of size|Program hit|at 0x|in " "$OUT/memcheck.log" | head -40 ;;
    profile)
        for kernel in ${PROFILE_KERNELS:-layernorm_kernel gemm_kernel attention_fwd}; do
            timeout 300 ncu --clock-control none --launch-skip 1 --launch-count 1 -k regex:$kernel --set full \
                python3 tests/gpu/profile_once.py > "$OUT/ncu-$kernel.txt" 2>&1
            grep -E "Duration|Registers Per|Issue Slots Busy|highest-utilized|Theoretical Occupancy" "$OUT/ncu-$kernel.txt" | head -8
            # where the warps wait, per issued instruction (largest first)
            timeout 300 ncu --clock-control none --launch-skip 1 --launch-count 1 -k regex:$kernel \
                --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
                python3 tests/gpu/profile_once.py > "$OUT/stalls-$kernel.txt" 2>&1
            grep -E "stalled" "$OUT/stalls-$kernel.txt" | sort -k3 -g -r | head -8
        done ;;
    sweep)
        python3 bench/sweep.py gemm 2>&1 | tee "$OUT/sweep-gemm.log"
        python3 bench/sweep.py attention 2>&1 | tee "$OUT/sweep-attention.log" ;;
    hopper)  # the sm_90a path: wgmma GEMM through gemm() and the kernel sweep of bench/wgmma_probe.py
        python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu -k "gemm or hopper" 2>&1 | tee "$OUT/tests-hopper.log" | tail -5
        summary+="hopper tests: $(tail -1 "$OUT/tests-hopper.log")\n"
        python3 bench/wgmma_probe.py 2>&1 | tee "$OUT/wgmma-probe.log" ;;
    compile-time)
        python3 bench/compile_time.py --repeats 2 --no-write 2>&1 | tee "$OUT/compile-time.log" | tail -4 ;;
    bench-quick)
        python3 bench/gemm.py --sizes 4096 --rounds 1 2>&1 | tee "$OUT/bench-gemm.log" | tail -6
        python3 bench/attention.py --seqlens 4096 --dims 128 --rounds 1 2>&1 | tee "$OUT/bench-attention.log" | tail -6
        python3 bench/layernorm.py --shapes 16384x4096 --rounds 1 2>&1 | tee "$OUT/bench-layernorm.log" | tail -6 ;;
    bench)
        python3 bench/gemm.py 2>&1 | tee "$OUT/bench-gemm.log" | tail -8
        python3 bench/attention.py 2>&1 | tee "$OUT/bench-attention.log" | tail -30
        python3 bench/layernorm.py 2>&1 | tee "$OUT/bench-layernorm.log" | tail -8
        rm -f "$OUT"/bench-*.log ;;  # the tables are in $OUT/*.md (a lent machine returns only a few files)
    esac
done
printf "$summary"
