#!/usr/bin/env bash
# One device call: the GPU tests, the kernel probes, the benchmarks of record (tables to $OUT for bench/collect.py),
# host-time breakdown, compute-sanitizer. Logs under $OUT.   bash scripts/gpu_session.sh [steps...]
# steps: tests probe probe-attention bench bench-scaled-mm probe-fp8 probe-cluster bench-attention bench-attention-variants bench-attention-focus
#        bench-attention-backward probe-attention-backward fused-backward
#        compile-time bench-layernorm host tile-cost store-cost d64 exp2 ncu-attention ncu-gemm ncu-variant softmax-parts fold candidates
#        layernorm-blocks layernorm-probe cache-hints dependent-launch launch-floor line-info ncu-source skinny skinny-check few-rows-clusters gqa norms clusters4 d96 d256 d256-probe decode
#        d256-tests d256-bench bwd-ab d256-anatomy forward-candidates d256-short-causal dq-rings dkdv-rings dkdv-by-product dkdv-by-product-defer dkdv-defer ncu-dkdv-256 defer-check last-block few-rows norm-backward small-batch rotary rotary-probe rows-at grouped-gemm mixed-ring varlen sanitize
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
# The GPU tests selected by $2 (-k) into $OUT/$1-tests.log, then compute-sanitizer's three tools on tests/gpu/sanitize.py's
# function $3 (their logs $OUT/$1-<tool>.log), each tool for at most $4 seconds.
tests_and_sanitizers() {
    python3 -c "import xdist" 2>/dev/null && workers="-n 8" || workers=""
    timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider $workers tests/gpu -k "$2" > "$OUT/$1-tests.log" 2>&1
    grep -E "^FAILED|Error" "$OUT/$1-tests.log" | head -10; echo "tests: $(tail -1 "$OUT/$1-tests.log")"
    for tool in memcheck racecheck synccheck; do
        timeout "$4" compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 7 python3 -c \
            "import sys; sys.path.insert(0, 'tests/gpu'); import sanitize, torch; sanitize.$3(); torch.cuda.synchronize()" \
            > "$OUT/$1-$tool.log" 2>&1
        echo "compute-sanitizer $tool: exit $?, $(grep -c '========= ' "$OUT/$1-$tool.log") report lines"
    done
}
for step in ${*:-tests probe bench sanitize}; do
    case $step in
    tests)  # with pytest-xdist (in .whl/ where fetched: see README), 8 processes: every GPU test in about a minute
        python3 -c "import xdist" 2>/dev/null && workers="-n 8" || workers=""
        timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider $workers tests/gpu > "$OUT/tests.log" 2>&1
        grep -E "^FAILED|Error" "$OUT/tests.log" | head -10; echo "tests: $(tail -1 "$OUT/tests.log")" ;;
    probe)
        timeout 200 python3 bench/wgmma_probe.py --what gemm --size ${GEMM_SIZE:-4096} > "$OUT/probe.log" 2>&1; tail -30 "$OUT/probe.log" ;;
    probe-attention)
        timeout 200 python3 bench/wgmma_probe.py --what attention > "$OUT/probe-attention.log" 2>&1
        tail -20 "$OUT/probe-attention.log" ;;
    bench)
        timeout 260 python3 bench/gemm.py > "$OUT/bench-gemm.log" 2>&1; tail -10 "$OUT/bench-gemm.log" ;;
    bench-scaled-mm)  # fp8 GEMM with scales beside torch._scaled_mm (cuBLASLt), Triton and bf16 cuBLAS
        timeout 400 python3 bench/scaled_mm.py > "$OUT/bench-scaled-mm.log" 2>&1; tail -14 "$OUT/bench-scaled-mm.log" ;;
    probe-fp8)  # scaled_mm_kernel configurations beside scaled_mm() and cuBLASLt (bench/probe_fp8.py; PROBE_ARGS="--only W8")
        timeout 400 python3 bench/probe_fp8.py ${PROBE_ARGS:-} > "$OUT/probe-fp8.log" 2>&1; tail -24 "$OUT/probe-fp8.log" ;;
    probe-cluster)  # 2-block clusters with B multicast beside gemm() / scaled_mm() and cuBLAS(Lt) (bench/probe_cluster.py)
        timeout 500 python3 bench/probe_cluster.py ${PROBE_ARGS:-} > "$OUT/probe-cluster.log" 2>&1; tail -40 "$OUT/probe-cluster.log" ;;
    clusters4)  # clusters of four (B a quarter each) and 2×2 (A to a row of tiles, B to a column) beside the shipped
        timeout 500 python3 bench/probe_cluster.py --only 'cluster(4|2x2)|cluster2 producer$' \
            > "$OUT/probe-clusters4.log" 2>&1; tail -40 "$OUT/probe-clusters4.log" ;;
    bench-attention)
        timeout 400 python3 bench/attention.py --rounds 5 > "$OUT/bench-attention.log" 2>&1; tail -28 "$OUT/bench-attention.log" ;;
    bench-attention-variants)  # attention() beside attention_sm90 with ping-pong / overlap, at the issue's sizes
        timeout 500 python3 bench/attention.py --variants --rounds 5 > "$OUT/bench-attention.log" 2>&1
        tail -20 "$OUT/bench-attention.log" ;;
    bench-attention-focus)  # attention() and its variants at chosen sizes, more rounds: FOCUS="--dims 128 --causal 0 --seqlens 4096"
        timeout 300 python3 bench/attention.py --variants --rounds 9 ${FOCUS:-} > "$OUT/bench-attention-focus.log" 2>&1
        tail -8 "$OUT/bench-attention-focus.log" ;;
    bench-attention-backward)  # the backward beside SDPA's (flash, cuDNN, mem-efficient): BWD_ARGS="--seqlens 1024"
        timeout 400 python3 bench/attention_backward.py ${BWD_ARGS:-} > "$OUT/bench-attention-backward.log" 2>&1
        tail -26 "$OUT/bench-attention-backward.log" ;;
    probe-attention-backward)  # each backward kernel's gradients and time, sm_80 and sm_90a builds (PROBE_ARGS)
        timeout 300 python3 bench/probe_attention_backward.py ${PROBE_ARGS:-} > "$OUT/probe-attention-backward.log" 2>&1
        grep -v -e Warning -e "return Variable" "$OUT/probe-attention-backward.log" | cut -c1-230 ;;
    compile-time)  # cold compiles of the shipped kernels and the cache hit of issue 4's bound (printed; RESULTS by hand)
        timeout 200 python3 bench/compile_time.py --repeats 2 --no-write > "$OUT/compile-time.log" 2>&1
        tail -14 "$OUT/compile-time.log" ;;
    bench-layernorm)
        timeout 200 python3 bench/layernorm.py ${LAYERNORM_ARGS:-} > "$OUT/bench-layernorm.log" 2>&1; tail -9 "$OUT/bench-layernorm.log" ;;
    norms)  # rmsnorm() and the norms without a residual: GPU tests, then bench/layernorm.py --rms (Triton's RMS too)
        timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu -k "rmsnorm" > "$OUT/norms-tests.log" 2>&1
        grep -E "^FAILED|Error" "$OUT/norms-tests.log" | head -10; echo "tests: $(tail -1 "$OUT/norms-tests.log")"
        timeout 200 python3 bench/layernorm.py --rms > "$OUT/bench-rmsnorm.log" 2>&1; tail -9 "$OUT/bench-rmsnorm.log" ;;
    rotary)  # rotary(): GPU tests, compute-sanitizer on its kernel alone, then bench/rotary.py (x as (B, H, N, D), then a (B, N, H, D) view)
        tests_and_sanitizers rotary rotary rotary_embedding 120
        timeout 300 python3 bench/rotary.py ${ROTARY_ARGS:-} > "$OUT/bench-rotary.log" 2>&1; tail -9 "$OUT/bench-rotary.log"
        timeout 300 python3 bench/rotary.py --bshd ${ROTARY_ARGS:-} > "$OUT/bench-rotary-bshd.log" 2>&1; tail -8 "$OUT/bench-rotary-bshd.log" ;;
    rows-at)  # loads / stores / atomic adds by row numbers (rows_at) and rotary's positions=: GPU tests, compute-sanitizer, bench/rotary.py --positions
        tests_and_sanitizers rows-at "rows_by_row_numbers or rotary_positions" "rows_by_row_numbers(); sanitize.rotary_embedding" 150
        timeout 200 python3 bench/rotary.py --positions ${ROTARY_ARGS:-} > "$OUT/bench-rotary-positions.log" 2>&1; tail -9 "$OUT/bench-rotary-positions.log" ;;
    grouped-gemm)  # grouped_gemm (a mixture of experts' layers): GPU tests, compute-sanitizer, bench/grouped_gemm.py (rows sorted, gathered, the weights' gradient, gathered x's gradient)
        tests_and_sanitizers grouped-gemm "grouped_gemm" grouped_products 200
        timeout 300 python3 bench/grouped_gemm.py ${GROUPED_ARGS:-} > "$OUT/bench-grouped-gemm.log" 2>&1; tail -9 "$OUT/bench-grouped-gemm.log"
        timeout 300 python3 bench/grouped_gemm.py --gather ${GROUPED_ARGS:-} > "$OUT/bench-grouped-gemm-gather.log" 2>&1; tail -9 "$OUT/bench-grouped-gemm-gather.log"
        timeout 300 python3 bench/grouped_gemm.py --wgrad ${GROUPED_ARGS:-} > "$OUT/bench-grouped-gemm-wgrad.log" 2>&1; tail -9 "$OUT/bench-grouped-gemm-wgrad.log"
        timeout 300 python3 bench/grouped_gemm.py --dx ${GROUPED_ARGS:-} > "$OUT/bench-grouped-gemm-dx.log" 2>&1; tail -9 "$OUT/bench-grouped-gemm-dx.log" ;;
    mixed-ring)  # mixed_ring=1's kernels (gathered rows / the weights' gradient on a TMA ring with cp.async): GPU tests, compute-sanitizer, probe_grouped.py --gather / --wgrad beside MIXED=0
        tests_and_sanitizers mixed-ring "mixed_ring" grouped_products 200
        timeout 250 python3 bench/probe_grouped.py --gather > "$OUT/probe-grouped-gather.log" 2>&1; grep -v Warn "$OUT/probe-grouped-gather.log" | tail -40
        timeout 200 python3 bench/probe_grouped.py --wgrad > "$OUT/probe-grouped-wgrad.log" 2>&1; grep -v Warn "$OUT/probe-grouped-wgrad.log" | tail -36 ;;
    varlen)  # attention_varlen: GPU tests, compute-sanitizer, bench/attention_varlen.py (VARLEN_ARGS)
        tests_and_sanitizers varlen "varlen" packed_sequences 200
        timeout 300 python3 bench/attention_varlen.py ${VARLEN_ARGS:-} > "$OUT/bench-varlen.log" 2>&1; grep -v Warn "$OUT/bench-varlen.log" | tail -16
        timeout 300 python3 bench/attention_varlen.py --backward ${VARLEN_ARGS:-} > "$OUT/bench-varlen-backward.log" 2>&1; grep -v Warn "$OUT/bench-varlen-backward.log" | tail -16 ;;
    rotary-probe)  # rotary_kernel's HEADS × WARPS beside a copy and Triton (bench/probe_rotary.py; PROBE_ARGS)
        timeout 300 python3 bench/probe_rotary.py ${PROBE_ARGS:-} > "$OUT/probe-rotary.log" 2>&1; grep -v Warning "$OUT/probe-rotary.log" | tail -40 ;;
    skinny)  # gemm() on skinny products beside smaller tiles and cuBLAS (bench/probe_skinny.py; PROBE_ARGS="--trans-b 1")
        timeout 400 python3 bench/probe_skinny.py ${PROBE_ARGS:-} > "$OUT/skinny.log" 2>&1; grep -E "^M=|gemm\(\)" "$OUT/skinny.log" | paste - - ;;
    skinny-check)  # gemm() alone beside cuBLAS at 1-32 rows, N = K = 4096 / 8192, both ways of B (event-timed and graph)
        for tb in 1 0; do
            timeout 150 python3 bench/probe_skinny.py --trans-b $tb --m 1 16 32 --nk 4096 8192 --only '^$' > "$OUT/skinny-check-$tb.log" 2>&1
            grep -E "^M=|gemm\(\)" "$OUT/skinny-check-$tb.log" | paste - - | sed -e 's/  */ /g'
        done ;;
    few-rows-clusters)  # the one-launch few-rows GEMMs (distributed shared memory): GPU tests, sanitizers, timings
        tests_and_sanitizers frc in_clusters few_rows_in_clusters 90
        for tb in 1 0; do  # cuBLAS, gemm() (two kernels) and the one-launch candidates, event-timed and in a graph
            timeout 150 python3 bench/probe_skinny.py --trans-b $tb --m 1 16 32 64 --nk 4096 8192 \
                --only '^FR(C|32|C32|C64)? W8 BK=128 (5|4)st' > "$OUT/frc-skinny-$tb.log" 2>&1
            grep -E "^M=|gemm\(\)|FRC|5st x" "$OUT/frc-skinny-$tb.log" | sed -e 's/  */ /g' | head -60
        done ;;
    gqa)  # grouped-query attention: GPU tests, sanitizers, forward and backward beside SDPA (enable_gqa), H 32, H_kv 8
        tests_and_sanitizers gqa grouped grouped_query_attention 120
        timeout 300 python3 bench/attention.py --heads 32 --kv-heads 8 --seqlens 1024 4096 16384 --rounds 3 \
            > "$OUT/bench-attention-gqa.log" 2>&1; tail -12 "$OUT/bench-attention-gqa.log"
        timeout 200 python3 bench/attention_backward.py --heads 32 --kv-heads 8 --seqlens 4096 \
            > "$OUT/bench-attention-backward-gqa.log" 2>&1; tail -8 "$OUT/bench-attention-backward-gqa.log" ;;
    blocks)  # backward kernels one block a multiprocessor more (BLOCKS, `tkc compile --resources`) beside the shipped constants
        P="timeout 200 python3 bench/probe_attention_backward.py --causal 0 1 --configs"
        $P '["sm90",{"STAGES":3},{"STAGES":3}]' '["sm90",{"STAGES":3},{"STAGES":2,"BLOCKS":2}]' --no-mma-sync \
            --shapes 2,16,4096,96 > "$OUT/blocks-96.log" 2>&1
        $P '["sm_80",{"QUERIES":64},{"KEYS":64,"BLOCKS":3}]' --shapes 2,16,4096,64 > "$OUT/blocks-64.log" 2>&1
        cat "$OUT/blocks-96.log" "$OUT/blocks-64.log" | grep backward | sed -e 's/dq [0-9.e-]* dk [0-9.e-]* dv/dv/' | cut -c1-220 ;;
    d256-probe)  # D = 256's dK/dV kernel (HALVES) beside other constants (the shipped first), B=2 H=16 N=4096
        # (48-query steps: two stages and one exchange buffer fit 209 KB; the last step ragged at N = 4096; DEFER=1: dV
        # and dK in the next step under the exchange)
        dq='{"WARPS":4,"KEYS":64,"STAGES":2}' halves='"WARPS":8,"HALVES":1'
        timeout 300 python3 bench/probe_attention_backward.py --causal 0 1 --no-mma-sync --shapes 2,16,4096,256 --configs \
            "[\"sm90\",{$halves,\"QUERIES\":32,\"STAGES\":3,\"PRODUCER\":1},$dq]" \
            "[\"sm90\",{$halves,\"QUERIES\":48,\"STAGES\":2,\"PRODUCER\":2,\"EXCHANGE_BUFFERS\":1},$dq]" \
            "[\"sm90\",{$halves,\"QUERIES\":32,\"STAGES\":3,\"PRODUCER\":1,\"DEFER\":1},$dq]" \
            "[\"sm90\",{$halves,\"QUERIES\":32,\"STAGES\":3,\"PRODUCER\":1,\"DEFER\":1},{\"WARPS\":4,\"KEYS\":64,\"STAGES\":2,\"DEFER\":1}]" \
            "[\"sm90\",{$halves,\"QUERIES\":32,\"STAGES\":3,\"PRODUCER\":2,\"DEFER\":1},$dq]" \
            "[\"sm90\",{$halves,\"QUERIES\":48,\"STAGES\":2,\"PRODUCER\":2,\"EXCHANGE_BUFFERS\":1,\"DEFER\":1},$dq]" \
            > "$OUT/d256-probe.log" 2>&1; grep backward "$OUT/d256-probe.log" | sed -e 's/.*backward sm90 //' -e 's/dq [0-9.e-]* dk [0-9.e-]* dv/dv/' | cut -c1-240 ;;
    d256-anatomy)  # where D = 256's forward goes: bench/attention_anatomy.py at 64-key steps (full, no softmax, no P·V,
        # no exp2), Q·Kᵀ's A from shared memory, from registers (QREG=1), half from each (QREG=2): is its traffic the limit?
        for qreg in 0 1 2; do
            timeout 120 python3 bench/attention_anatomy.py --d 256 --keys 64 -D STAGES=2 -D PRODUCER=2 -D DEFER=1 \
                -D QREG=$qreg > "$OUT/d256-anatomy-$qreg.log" 2>&1; echo "QREG=$qreg"; tail -4 "$OUT/d256-anatomy-$qreg.log"
        done ;;
    forward-candidates)  # attention_sm90 candidates beside attention() at N = 4096 (each simulated on the CPU first:
        # tests/backend/test_probe_candidates.py): D = 256 (K and V rings apart, three stages of 48 keys, half of Q in
        # registers with three stages of 64, ping-pong, staggered), then D = 128 (rings apart, three stages and two)
        for d in 256 128; do  # (a call's 600 s: 370 for D = 256's 22 builds and timings, 190 for D = 128's)
            timeout $((d == 256 ? 370 : 190)) python3 -u bench/probe_candidates.py --dims $d --seqlens 4096 --rounds 3 \
                > "$OUT/candidates-$d.log" 2>&1
            grep -v -e "^  flash" -e Warning -e "return Var" "$OUT/candidates-$d.log" | tail -30
        done ;;
    d256-short-causal)  # D = 256 causal at N = 1024 (0.93x cuDNN): 80-key steps with a lean producer, 1 or 4 tiles a block
        timeout 200 python3 -u bench/probe_candidates.py --dims 256 --causal 1 --seqlens 1024 2048 --rounds 5 \
            --only "producer|a block" > "$OUT/d256-short-causal.log" 2>&1
        grep -v -e "^  flash" -e Warning -e "return Var" "$OUT/d256-short-causal.log" | tail -14 ;;
    dq-rings)  # the dQ kernel with K and V in rings apart and / or a producer warpgroup beside the shipped, N=4096
        # (RESULTS "the dQ kernel's rings apart — 2026-12-06"; each build simulated by tests/backend/test_simulate.py)
        P="timeout 230 python3 bench/probe_attention_backward.py --causal 0 1 --no-mma-sync --shapes"
        K='{"WARPS":8,"HALVES":1,"STAGES":3,"QUERIES":32,"PRODUCER":1}' Q='"WARPS":4,"KEYS":64,"STAGES":2'
        W8='"WARPS":8,"KEYS":32,"PRODUCER":1,"SPLIT_RING":1'  # two consumer warpgroups (128 queries), 32-key steps
        $P 2,16,4096,256 --configs "[\"sm90\",$K,{$Q}]" "[\"sm90\",$K,{$Q,\"PRODUCER\":1}]" \
            "[\"sm90\",$K,{$Q,\"PRODUCER\":1,\"SPLIT_RING\":1}]" "[\"sm90\",$K,{$W8,\"STAGES\":3}]" \
            "[\"sm90\",$K,{$W8,\"STAGES\":2}]" > "$OUT/dq-rings-256.log" 2>&1
        $P 2,16,4096,128 --configs '["sm90",{"STAGES":3},{"STAGES":3}]' '["sm90",{"STAGES":3},{"STAGES":3,"SPLIT_RING":1}]' \
            > "$OUT/dq-rings-128.log" 2>&1
        grep -h backward "$OUT"/dq-rings-*.log | sed -e 's/.*D=\([0-9]*\) causal=\([01]\) backward sm90 {[^}]*} /\1 c\2 /' | cut -c1-220 ;;
    dkdv-rings)  # the dK/dV kernel with Q and dO in rings apart (step k - 1's stages released once step k's Sᵀ is in),
        # with or without a producer, beside the shipped, N=4096 (RESULTS "early releases in one ring — 2026-12-06": one
        # ring released so was 4-11 % faster at D = 64, slower at 128; each build simulated by tests/backend/test_simulate.py;
        # D = 256 also with a lean producer, PRODUCER=2: consumers 240 registers, no spills, simulated)
        P="timeout 170 python3 bench/probe_attention_backward.py --causal 0 1 --no-mma-sync --shapes"
        K='"WARPS":4,"STAGES":3' H='"WARPS":8,"HALVES":1,"QUERIES":32,"STAGES":3,"PRODUCER":1'
        $P 2,16,4096,64 --configs "[\"sm90\",{$K,\"BLOCKS\":3},{\"STAGES\":3}]" \
            "[\"sm90\",{$K,\"BLOCKS\":3,\"SPLIT_RING\":1},{\"STAGES\":3}]" \
            "[\"sm90\",{$K,\"BLOCKS\":2,\"PRODUCER\":1,\"SPLIT_RING\":1},{\"STAGES\":3}]" \
            "[\"sm90\",{$K,\"BLOCKS\":3},{\"STAGES\":3}]" > "$OUT/dkdv-rings-64.log" 2>&1
        $P 2,16,4096,128 --configs '["sm90",{"STAGES":3},{"STAGES":3}]' '["sm90",{"STAGES":3,"SPLIT_RING":1},{"STAGES":3}]' \
            '["sm90",{"STAGES":3,"PRODUCER":1,"SPLIT_RING":1},{"STAGES":3}]' '["sm90",{"STAGES":3},{"STAGES":3}]' \
            > "$OUT/dkdv-rings-128.log" 2>&1
        $P 2,16,4096,256 --configs "[\"sm90\",{$H},{\"WARPS\":4,\"KEYS\":64,\"STAGES\":2,\"PRODUCER\":1,\"SPLIT_RING\":1}]" \
            "[\"sm90\",{$H,\"SPLIT_RING\":1},{\"WARPS\":4,\"KEYS\":64,\"STAGES\":2,\"PRODUCER\":1,\"SPLIT_RING\":1}]" \
            "[\"sm90\",{$H,\"PRODUCER\":2},{\"WARPS\":4,\"KEYS\":64,\"STAGES\":2,\"PRODUCER\":1,\"SPLIT_RING\":1}]" \
            "[\"sm90\",{$H,\"PRODUCER\":2,\"SPLIT_RING\":1},{\"WARPS\":4,\"KEYS\":64,\"STAGES\":2,\"PRODUCER\":1,\"SPLIT_RING\":1}]" \
            > "$OUT/dkdv-rings-256.log" 2>&1
        grep -h backward "$OUT"/dkdv-rings-*.log | sed -e 's/.*D=\([0-9]*\) causal=\([01]\) backward sm90 /\1 c\2 /' \
            -e 's/dq [0-9.e-]* dk [0-9.e-]* dv [0-9.e-]*;//' | cut -c1-220 ;;
    dkdv-by-product)  # D = 256's dK/dV with HALVES=2 (warpgroup 0 all of Sᵀ, 1 all of dPᵀ, passed whole through one
        # shared tile) beside HALVES=1 (shipped until 2026-12-06), N=4096 and 1024 (each build simulated: test_simulate.py)
        P="timeout 400 python3 bench/probe_attention_backward.py --causal 0 1 --no-mma-sync --shapes 2,16,4096,256 8,16,1024,256"
        H='"WARPS":8,"HALVES":1,"QUERIES":32,"STAGES":3,"PRODUCER":1' Q='{"WARPS":4,"KEYS":64,"STAGES":2,"PRODUCER":1,"SPLIT_RING":1}'
        H2='"WARPS":8,"HALVES":2'
        $P --configs "[\"sm90\",{$H},$Q]" "[\"sm90\",{$H2,\"QUERIES\":32,\"STAGES\":3,\"PRODUCER\":1},$Q]" \
            "[\"sm90\",{$H2,\"QUERIES\":32,\"STAGES\":4,\"PRODUCER\":1},$Q]" \
            "[\"sm90\",{$H2,\"QUERIES\":48,\"STAGES\":2,\"PRODUCER\":1},$Q]" \
            "[\"sm90\",{$H2,\"QUERIES\":64,\"STAGES\":2,\"PRODUCER\":2,\"EXCHANGE_BUFFERS\":1},$Q]" \
            "[\"sm90\",{$H},$Q]" > "$OUT/dkdv-by-product.log" 2>&1
        grep backward "$OUT/dkdv-by-product.log" | sed -e "s/.*N=\([0-9]*\) D=256 causal=\([01]\).*'HALVES': \([12]\), 'QUERIES': \([0-9]*\), 'STAGES': \([0-9]\)[^}]*}[^}]*}: \(dq [^;]*\);.*dkdv \([0-9]*\).*/N=\1 c\2 H\3 Q\4 S\5 \6 dkdv \7/" ;;
    dkdv-by-product-defer)  # the shipped D = 256 dK/dV (HALVES=2, 64-query steps) beside it with DEFER=1 (dV and dK
        # products issued behind the next step's Sᵀ / dPᵀ, under the exchange; 96 / 24 bytes of spills at 64 / 48 queries)
        P="timeout 300 python3 bench/probe_attention_backward.py --causal 0 1 --no-mma-sync --shapes 2,16,4096,256 8,16,1024,256"
        S='"WARPS":8,"HALVES":2,"QUERIES":64,"STAGES":2,"PRODUCER":2,"EXCHANGE_BUFFERS":1'
        Q='{"WARPS":4,"KEYS":64,"STAGES":2,"PRODUCER":1,"SPLIT_RING":1}'
        $P --configs "[\"sm90\",{$S},$Q]" "[\"sm90\",{$S,\"DEFER\":1},$Q]" \
            "[\"sm90\",{\"WARPS\":8,\"HALVES\":2,\"QUERIES\":48,\"STAGES\":2,\"PRODUCER\":2,\"EXCHANGE_BUFFERS\":1,\"DEFER\":1},$Q]" \
            "[\"sm90\",{$S},$Q]" > "$OUT/dkdv-by-product-defer.log" 2>&1
        grep backward "$OUT/dkdv-by-product-defer.log" | sed -e "s/.*N=\([0-9]*\) D=256 causal=\([01]\) backward sm90 {'RAGGED': [01], \([^}]*\)}[^}]*}: \(dq [^;]*\);.*dkdv \([0-9]*\).*/N=\1 c\2 \3 \4 dkdv \5/" -e "s/'WARPS': 8, 'HALVES': 2, //" ;;
    defer-check)  # DEFER=1's dK/dV builds: GPU tests and compute-sanitizer (tests/gpu/sanitize.py deferred_dkdv)
        tests_and_sanitizers defer dkdv_deferred deferred_dkdv 120 ;;
    dkdv-defer)  # D = 64 / 128 backward kernels with DEFER=1 (dV, dK or dQ in the next step) beside the shipped, N=4096
        P="timeout 300 python3 bench/probe_attention_backward.py --causal 0 1 --no-mma-sync --configs"
        $P '["sm90",{"STAGES":3},{"STAGES":3}]' '["sm90",{"STAGES":3,"QUERIES":32,"DEFER":1},{"STAGES":3}]' \
            '["sm90",{"STAGES":4,"QUERIES":32,"DEFER":1},{"STAGES":3}]' '["sm90",{"STAGES":3,"QUERIES":32},{"STAGES":3}]' \
            '["sm90",{"WARPS":4,"STAGES":3,"QUERIES":32,"DEFER":1},{"STAGES":3}]' \
            '["sm90",{"STAGES":3},{"STAGES":3,"DEFER":1}]' \
            --shapes 2,16,4096,128 > "$OUT/dkdv-defer-128.log" 2>&1
        $P '["sm90",{"WARPS":4,"STAGES":3,"BLOCKS":3},{"STAGES":3}]' \
            '["sm90",{"WARPS":4,"STAGES":3,"BLOCKS":2,"DEFER":1},{"STAGES":3}]' \
            '["sm90",{"WARPS":4,"STAGES":3,"BLOCKS":3},{"STAGES":3,"DEFER":1}]' --shapes 2,16,4096,64 > "$OUT/dkdv-defer-64.log" 2>&1
        cat "$OUT/dkdv-defer-128.log" "$OUT/dkdv-defer-64.log" | grep backward | sed -e 's/.*backward sm90 //' -e 's/dq [0-9.e-]* dk [0-9.e-]* dv/dv/' | cut -c1-220 ;;
    bwd-ab)  # the backward's shipped builds (CONFIG_SM90) at D in $DIMS (64 128 256) from this tree and from the tree
        # under .prev/ (an export of an earlier commit: `git archive REV tkc | tar -x -C .prev`, carried), each with its
        # own compile cache, twice in turn, N = 4096
        declare -A cfg=([64]='["sm90",{"WARPS":4,"STAGES":3,"BLOCKS":3},{"STAGES":3}]'
            [128]='["sm90",{"STAGES":3},{"STAGES":3}]'
            [256]='["sm90",{"WARPS":8,"HALVES":1,"QUERIES":32,"STAGES":3,"PRODUCER":1},{"WARPS":4,"KEYS":64,"STAGES":2,"PRODUCER":1,"SPLIT_RING":1}]')
        for d in ${DIMS:-64 128 256}; do
            for round in 1 2; do
                for tree in .prev .; do
                    PYTHONPATH=/tmp/site:$PWD/$tree TKC_CACHE_DIR=/tmp/tkc-cache-ab${tree//\//} timeout 150 python3 \
                        bench/probe_attention_backward.py --causal 0 1 --no-mma-sync --shapes 2,16,4096,$d --configs "${cfg[$d]}" \
                        > "$OUT/bwd-ab-$d-$round${tree//\//}.log" 2>&1
                    grep backward "$OUT/bwd-ab-$d-$round${tree//\//}.log" | sed -e "s/.*causal=\([01]\) backward sm90 .*}: /D=$d c\1 $tree /" \
                        -e 's/dq [0-9.e-]* dk [0-9.e-]* dv/dv/' | cut -c1-200
                done
            done
        done ;;
    d96)  # head dim 96 on Hopper (wgmma kernels): GPU tests, sanitizers, forward (with variants) and backward beside SDPA
        tests_and_sanitizers d96 "96 or head_dims" head_dim_96 150
        timeout 300 python3 bench/attention.py --dims 96 --seqlens 1024 4096 16384 --variants --rounds 3 \
            > "$OUT/bench-attention-d96.log" 2>&1; tail -14 "$OUT/bench-attention-d96.log"
        timeout 200 python3 bench/attention_backward.py --dims 96 --seqlens 1024 4096 16384 \
            > "$OUT/bench-attention-backward-d96.log" 2>&1; tail -10 "$OUT/bench-attention-backward-d96.log" ;;
    d256|d256-tests|d256-bench)  # head dim 256: GPU tests, sanitizers, the forward (with variants) and the backward beside SDPA
        [ $step != d256-bench ] && tests_and_sanitizers d256 "256 and attention" head_dim_256 150
        [ $step = d256-tests ] && continue
        timeout 300 python3 bench/attention.py --dims 256 --seqlens 1024 4096 16384 --variants --rounds 3 \
            > "$OUT/bench-attention-d256.log" 2>&1; tail -14 "$OUT/bench-attention-d256.log"
        timeout 200 python3 bench/attention_backward.py --dims 256 --seqlens 1024 4096 16384 \
            > "$OUT/bench-attention-backward-d256.log" 2>&1; tail -10 "$OUT/bench-attention-backward-d256.log" ;;
    decode)  # decoding (a query or a few a head over a KV cache): GPU tests, sanitizers, attention_decode vs attention_sm90 vs SDPA
        tests_and_sanitizers decode decode decode_attention 90
        timeout 300 python3 bench/probe_decode.py ${PROBE_ARGS:-} > "$OUT/decode.log" 2>&1; grep -v Warning "$OUT/decode.log" | tail -60 ;;
    last-block)  # one launch whose last block finishes the sum (arrive_last): decoding's last-part variant beside the
        # clusters / two launches, gemm() with FEW_ROWS_LAST_BLOCK and FEW_ROWS_IN_CLUSTERS "eager" beside cuBLAS
        # (event-timed and from a graph), then the GPU tests and sanitizers on last_block
        timeout 150 python3 bench/probe_decode.py --kernels --variants "last part" > "$OUT/decode-last.log" 2>&1
        grep -v Warning "$OUT/decode-last.log" | tail -40 | cut -c1-160
        # the sm_80 path (A100s: no clusters), where the last part weighing would make the two kernels one launch
        # (as shipped "eager" up to LAST_BLOCK_BYTES of K and V: 16384 keys, 67 MB, at the edge; 32768 and 131072 above it)
        timeout 120 python3 bench/probe_decode.py --target sm_80 --variants "last part" --rounds 3 \
            --shapes 1,32,8,1,8192 1,32,8,1,16384 1,32,8,1,32768 1,32,8,1,131072 8,32,8,1,8192 > "$OUT/decode-last-sm80.log" 2>&1
        grep -v Warning "$OUT/decode-last-sm80.log" | grep -v "^  \(flash\|mem\)" | tail -20 | cut -c1-160
        for tb in 1 0; do
            timeout 100 python3 bench/probe_skinny.py --trans-b $tb --m 1 16 32 --nk 4096 8192 --only '^$' > "$OUT/skinny-last-$tb.log" 2>&1
            grep -E "^M=|gemm\(\)|cuBLAS" "$OUT/skinny-last-$tb.log" | sed -e "s/  */ /g" | cut -c1-150
        done
        tests_and_sanitizers last-block "last or one_launch" last_block 100 ;;
    few-rows)  # gemm() / scaled_mm() of a few rows as shipped (one launch by the last run eagerly) beside two kernels,
        # the clusters and cuBLAS(Lt), event-timed and from a graph; then their GPU tests
        for tb in 1 0; do
            timeout 100 python3 bench/probe_skinny.py --trans-b $tb --m 1 16 32 --nk 4096 8192 --only '^$' > "$OUT/few-rows-$tb.log" 2>&1
            grep -E "^M=|gemm\(\)|cuBLAS" "$OUT/few-rows-$tb.log" | sed -e "s/  */ /g" | cut -c1-150
        done
        timeout 150 python3 bench/probe_fp8.py --sizes --only '^$' > "$OUT/few-rows-fp8.log" 2>&1; grep -v Warning "$OUT/few-rows-fp8.log" | tail -24
        timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/gpu -k "gemm or scaled or few_rows or skinny or decode or last" > "$OUT/few-rows-tests.log" 2>&1
        grep -E "^FAILED|Error" "$OUT/few-rows-tests.log" | head -10; echo "tests: $(tail -1 "$OUT/few-rows-tests.log")" ;;
    norm-backward)  # layernorm's / rmsnorm's backward: GPU tests, sanitizers, then bench/layernorm_backward.py (and --rms)
        tests_and_sanitizers norm-backward norm_backward norms_backward 200
        for rms in "" --rms; do
            timeout 200 python3 bench/layernorm_backward.py $rms > "$OUT/bench-norm-backward$rms.log" 2>&1; tail -9 "$OUT/bench-norm-backward$rms.log"
        done ;;
    small-batch)  # attention() at B·N = 1024 / 2048 beside configurations for few tiles (bench/probe_small_batch.py)
        timeout 300 python3 bench/probe_small_batch.py > "$OUT/small-batch.log" 2>&1; grep -E "^D=|attention\(\)|  cuDNN" "$OUT/small-batch.log" | head -40 ;;
    dependent-launch)  # layernorm's dependent-launch opt-in back to back and behind a GEMM (bench/probe_dependent_launch.py)
        timeout 200 python3 bench/probe_dependent_launch.py > "$OUT/dependent-launch.log" 2>&1; tail -6 "$OUT/dependent-launch.log" ;;
    launch-floor)  # an empty kernel on 1 / one wave / layernorm's blocks beside layernorm() and a copy (bench/probe_launch_floor.py)
        timeout 200 python3 bench/probe_launch_floor.py > "$OUT/launch-floor.log" 2>&1; tail -7 "$OUT/launch-floor.log" ;;
    host)
        timeout 200 python3 bench/host_breakdown.py > "$OUT/host.log" 2>&1; head -32 "$OUT/host.log" ;;
    tile-cost)  # what a query tile costs beyond its key steps (bench/probe_tile_cost.py)
        timeout 300 python3 bench/probe_tile_cost.py > "$OUT/tile-cost.log" 2>&1; tail -14 "$OUT/tile-cost.log" ;;
    store-cost)  # the same with and without the output store (bench/probe_store.py)
        timeout 300 python3 bench/probe_store.py > "$OUT/store-cost.log" 2>&1; tail -14 "$OUT/store-cost.log" ;;
    d64)  # attention() at D=64 N=1024 beside other pipeline depths and grids (bench/probe_d64.py)
        timeout 200 python3 bench/probe_d64.py > "$OUT/d64.log" 2>&1; tail -22 "$OUT/d64.log" ;;
    exp2)  # attention() beside EXP2_POLY=N (every N-th exp2 on the FMA pipe): bench/probe_exp2.py
        timeout 300 python3 bench/probe_exp2.py > "$OUT/exp2.log" 2>&1; tail -40 "$OUT/exp2.log" ;;
    ncu-attention)  # where attention_sm90's cycles go (stalls, pipes, issue) at D=64/128, N=1024: ncu sections
        for dn in "64 1024" "128 1024" "64 4096"; do
            timeout 150 ncu --kernel-name attention_sm90 --launch-skip 2 --launch-count 1 --section SpeedOfLight \
                --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats \
                --section WarpStateStats --metrics "regex:^(sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active|sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active|smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio)$" \
                python3 bench/probe_ncu.py $dn > "$OUT/ncu-${dn// /-}.txt" 2>&1
            if grep -q "==ERROR==" "$OUT/ncu-${dn// /-}.txt"; then  # this ncu refuses the metric regex: sections only
                head -3 "$OUT/ncu-${dn// /-}.txt"
                timeout 150 ncu --kernel-name attention_sm90 --launch-skip 2 --launch-count 1 --section SpeedOfLight \
                    --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats \
                    --section WarpStateStats python3 bench/probe_ncu.py $dn > "$OUT/ncu-${dn// /-}.txt" 2>&1
            fi
            grep -E "Issue Slots Busy|No Eligible|Issued Warp|Warp Cycles Per Issued|Stall|Pipe|Duration" \
                "$OUT/ncu-${dn// /-}.txt" | head -14
        done ;;
    ncu-gemm)  # gemm() (or NCU_CFG's gemm_sm90_kernel) and cuBLAS on NCU_GEMM="M N K trans_b": DRAM, L2, SM throughput
        set -- ${NCU_GEMM:-128 8192 8192 1}
        timeout 200 ncu --kernel-name "regex:gemm|nvjet|xmma|cutlass|sm90" --launch-count 6 --section SpeedOfLight \
            --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct \
            python3 bench/probe_ncu_gemm.py "$@" ${NCU_CFG:+"$NCU_CFG"} > "$OUT/ncu-gemm-$1-$2-$3-$4${NCU_CFG:+-cfg}.txt" 2>&1
        grep -E "^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Compute \(SM\)|dram__bytes|lts__t_bytes|hit_rate|==ERROR==" \
            "$OUT/ncu-gemm-$1-$2-$3-$4${NCU_CFG:+-cfg}.txt" | cut -c1-150 | head -80 ;;
    ncu-variant)  # the same ncu sections for attention_sm90 with NCU_CFG (JSON) at D=64 N=1024 not causal
        timeout 150 ncu --kernel-name attention_sm90 --launch-skip 2 --launch-count 1 --section SpeedOfLight \
            --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
            --metrics "regex:^(sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active|sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active|smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio)$" \
            python3 bench/probe_ncu.py 64 1024 0 "$NCU_CFG" > "$OUT/ncu-variant.txt" 2>&1
        grep -E "Duration|Issue Slots Busy|Eligible Warps|pipe_(xu|tensor_cycles)|stalled_(wait|long|gmma|barrier|short|mio|dispatch)" \
            "$OUT/ncu-variant.txt" | head -20 ;;
    line-info)  # the PTX's line info through the JIT: Nsight Compute's source view of layernorm_kernel at layernorm.py's lines
        timeout 200 ncu --kernel-name layernorm_kernel --launch-count 1 --section SourceCounters --import-source yes \
            -f -o "$OUT/line-info" python3 -c "import torch; from tkc.kernels import layernorm
x = torch.randn(4096, 1024, device='cuda', dtype=torch.bfloat16); w = torch.randn(1024, device='cuda', dtype=torch.bfloat16)
layernorm(x, x, w, w); torch.cuda.synchronize()" > "$OUT/line-info.log" 2>&1
        ncu --import "$OUT/line-info.ncu-rep" --page source --csv --print-source cuda > "$OUT/line-info.csv" 2>&1
        rm -f "$OUT/line-info.ncu-rep"; tail -2 "$OUT/line-info.log"; echo "$(wc -l < "$OUT/line-info.csv") lines"
        grep -m8 -E "row_total|load\(|store\(" "$OUT/line-info.csv" | cut -c1-200 ;;
    ncu-source)  # attention() at D=64 N=1024 not causal: stall samples per SASS instruction (NCU_ARGS="128 1024" for others)
        timeout 200 ncu --clock-control none --kernel-name attention_sm90 --launch-skip 2 --launch-count 1 \
            --section SourceCounters --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
            -f -o "$OUT/ncu-source" python3 bench/probe_ncu.py ${NCU_ARGS:-64 1024} > "$OUT/ncu-source.log" 2>&1
        ncu --import "$OUT/ncu-source.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu-source.csv" 2>&1
        ncu --import "$OUT/ncu-source.ncu-rep" --page details > "$OUT/ncu-details.txt" 2>&1
        rm -f "$OUT/ncu-source.ncu-rep"; tail -2 "$OUT/ncu-source.log"; wc -l "$OUT/ncu-source.csv"
        grep -E "Issue Slots Busy|Eligible Warps|No Eligible|Warp Cycles Per Issued" "$OUT/ncu-details.txt" | head -6 ;;
    ncu-dkdv-256)  # D = 256's shipped dK/dV kernel (B=1 H=16 N=2048, not causal): stalls per SASS instruction, pipes
        C='["sm90",{"WARPS":8,"HALVES":2,"QUERIES":64,"STAGES":2,"PRODUCER":2,"EXCHANGE_BUFFERS":1},{"WARPS":4,"KEYS":64,"STAGES":2,"PRODUCER":1,"SPLIT_RING":1}]'
        timeout 300 ncu --clock-control none --kernel-name attention_bwd_dkdv_sm90 --launch-skip 1 --launch-count 1 \
            --section SourceCounters --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
            --section SpeedOfLight --metrics "regex:^(sm__pipe_tensor_op_gmma_cycles_active\.avg\.pct_of_peak_sustained_active|smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio)$" \
            -f -o "$OUT/ncu-dkdv" python3 bench/probe_attention_backward.py --no-mma-sync --shapes 1,16,2048,256 \
            --configs "$C" > "$OUT/ncu-dkdv.log" 2>&1
        ncu --import "$OUT/ncu-dkdv.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu-dkdv.csv" 2>&1
        ncu --import "$OUT/ncu-dkdv.ncu-rep" --page details > "$OUT/ncu-dkdv-details.txt" 2>&1
        ncu --import "$OUT/ncu-dkdv.ncu-rep" --page raw --csv > "$OUT/ncu-dkdv-raw.csv" 2>&1
        rm -f "$OUT/ncu-dkdv.ncu-rep"; tail -2 "$OUT/ncu-dkdv.log"; wc -l "$OUT/ncu-dkdv.csv"
        grep -E "Duration|Issue Slots Busy|Eligible Warps|No Eligible|Warp Cycles Per Issued|Compute \(SM\)" "$OUT/ncu-dkdv-details.txt" | head -8 ;;
    softmax-parts)  # what the row sum, row max, exp2 and O's rescale each cost attention() (bench/probe_softmax.py)
        timeout 200 python3 bench/probe_softmax.py > "$OUT/softmax-parts.log" 2>&1; tail -20 "$OUT/softmax-parts.log" ;;
    fold)  # row sums folded into P·V (P·[V | 1]) beside attention() at D=64 N=1024 (bench/probe_fold.py)
        timeout 200 python3 bench/probe_fold.py > "$OUT/fold.log" 2>&1; tail -16 "$OUT/fold.log" ;;
    candidates)  # attention() beside candidate configurations at N = 1024 and 4096 (bench/probe_candidates.py; its arguments: CANDIDATES="--dims 64")
        timeout 400 python3 bench/probe_candidates.py ${CANDIDATES:-} > "$OUT/candidates.log" 2>&1; grep -v "^  flash" "$OUT/candidates.log" | tail -70 ;;
    layernorm-blocks)  # layernorm_kernel beside its variants and copies of its traffic at 16384×1024 (bench/probe_layernorm.py; PROBE_ARGS="--all")
        timeout 200 python3 bench/probe_layernorm.py ${PROBE_ARGS:-} > "$OUT/layernorm-blocks.log" 2>&1; tail -10 "$OUT/layernorm-blocks.log" ;;
    cache-hints)  # layernorm_kernel's PTX with cache hints on its loads and stores (bench/probe_cache_hints.py; PROBE_ARGS="--dim 2048")
        timeout 200 python3 bench/probe_cache_hints.py ${PROBE_ARGS:-} > "$OUT/cache-hints.log" 2>&1; tail -12 "$OUT/cache-hints.log" ;;
    layernorm-probe)
        timeout 200 python3 bench/host_breakdown.py --profile layernorm > "$OUT/layernorm-probe.log" 2>&1
        sed -n '/16384×/,/cProfile/p' "$OUT/layernorm-probe.log" ;;
    fused-backward)  # attention_bwd_sm90 as it is, deferred, two dS buffers, without its reductions, dkdv alone (bench/probe_fused_backward.py)
        for v in fused defer ds2 defer-ds2 noreduce dkdv; do
            TKC_CACHE_DIR=/tmp/tkc-cache-$v timeout 150 python3 bench/probe_fused_backward.py $v ${PROBE_ARGS:-} > "$OUT/fused-$v.log" 2>&1
            grep -E "µs|Error" "$OUT/fused-$v.log"
        done ;;
    sanitize)
        for tool in memcheck racecheck synccheck; do
            timeout 150 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 7 python3 tests/gpu/sanitize.py > "$OUT/sanitize-$tool.log" 2>&1
            echo "compute-sanitizer $tool: exit $?, $(grep -c '========= ' "$OUT/sanitize-$tool.log") report lines"
        done ;;
    esac
done
# At most 8 files come back from $OUT: past that, the logs travel as one archive (the .md / .json sections that
# bench/collect.py reads stay files).
if [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
    (cd "$OUT" && tar czf logs.tar.gz --remove-files ./*.log ./*.txt 2>/dev/null)
    echo "logs packed: $OUT/logs.tar.gz"
fi
