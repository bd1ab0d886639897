#!/usr/bin/env bash
# Session 39, device call 1 (any Hopper). Two pieces of session 38's plan in one call:
# - on an H200 only, first: the fp8 suites behind the README's fp8 rows and the selection table
#   (session 38's call2.sh: quantized+fp8, quantized+fp8_ds_mla, deepseek+fp8, every backend);
# - then the early query copy (.ab/q, TILEGYM_EARLY_QUERY = 1) against main: its wgmma-kernel GPU tests,
#   then the profiler timeline of the many-heads and mixed suites in q, main, main, q (an A/B that a
#   drift over the call cannot fake in one direction).
# Each step runs only if the call's 560 s still cover its limit, so the call returns whole steps.
#
#   bash benchmarks/results/session39/call1.sh   # device: carry [".cache/tilecpp", ".ab/q"], timeout 600
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
fits() { [ $((SECONDS + $1)) -lt 560 ]; }
if grep -q H200 "$OUT/0-gpu.log"; then
    BENCH_LIMIT=120 bash benchmarks/run_h200.sh quantized+fp8 quantized+fp8_ds_mla deepseek+fp8 > "$OUT/4-suites.log" 2>&1
    grep -E "^=== |^\| " "$OUT/4-suites.log" | cut -c1-200 | tail -n 40
fi
fits 120 && step 2-tests-q 120 "$root/.ab/q" python3 -m pytest -p no:cacheprovider -p no:randomly -q -m gpu -rfEs -x \
    tests/test_cutlass_backend.py
echo "tests rc $step_rc"
if [ "${step_rc:-1}" -eq 0 ]; then
    for tree in q main main q; do
        fits 70 || break
        dir=$root; [ "$tree" != main ] && dir=$root/.ab/$tree
        step "3-tl-$tree" 70 "$dir" python3 benchmarks/timeline.py --backend cutlass --suites many-heads,mixed
        grep -E "period|Error" "$OUT/3-tl-$tree.log" | cut -c1-150 >> "$OUT/3-timeline.txt"
        echo "##### $tree" >> "$OUT/3-timeline.txt"
        cat "$OUT/3-tl-$tree.log" >> "$OUT/3-timeline-all.log" && rm -f "$OUT/3-tl-$tree.log"
    done
    grep -oE "^.*period [0-9.]+ us/call|#####.*|Error.*" "$OUT/3-timeline.txt"
fi
