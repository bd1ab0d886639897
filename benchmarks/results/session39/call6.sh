#!/usr/bin/env bash
# Session 39, device call 6 (any Hopper), for the ~150 s left: call 5's first half in the other order.
# The fp8-cache profiler timeline of the many-heads suite in main, f8, f8, main comes first (.ab/f8: the
# late P fence in the fp8 order), then .ab/f8's fp8 GPU tests. A timing counts only if they pass.
#
#   CALL_BUDGET=S bash benchmarks/results/session39/call6.sh   # carry [".cache/tilecpp", ".ab/f8"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
fits() { [ $((SECONDS + $1)) -lt "${CALL_BUDGET:-560}" ]; }  # CALL_BUDGET: seconds this call may use
for tree in main f8 f8 main; do
    fits 35 || break
    dir=$root; [ "$tree" != main ] && dir=$root/.ab/$tree
    step "3-tl" 35 "$dir" python3 benchmarks/timeline.py --backend cutlass --kv fp8 --suites many-heads
    grep -E "period|Error" "$OUT/3-tl.log" | cut -c1-150 >> "$OUT/3-timeline.txt"
    echo "##### $tree (fp8)" >> "$OUT/3-timeline.txt"
    cat "$OUT/3-tl.log" >> "$OUT/3-timeline-all.log" && rm -f "$OUT/3-tl.log"
done
grep -oE "^.*period [0-9.]+ us/call|#####.*|Error.*" "$OUT/3-timeline.txt"
left=$(( ${CALL_BUDGET:-560} - SECONDS - 5 ))
[ "$left" -gt 20 ] && step 2-tests-f8 "$left" "$root/.ab/f8" python3 -m pytest -p no:cacheprovider -p no:randomly -q -m gpu \
    -rfEs -x tests/test_cutlass_fp8.py
tail -n 3 "$OUT/2-tests-f8.log"
