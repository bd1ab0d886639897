#!/usr/bin/env bash
# Session 39, device call 4 (any Hopper): WG1 issues P_A V_A,R before waiting for its score matmuls.
# In main's bf16 order WG1 waits for S_B, takes its row maxima, then waits for (m_A, P_A) and issues
# P_A V_A,R; only then does its softmax of block B start, and WG0's P_B V_B,L waits for that softmax
# (session 21's step trace: ~850 cycles from S_B done to P_A V_A,R issued, ~1550 to P_B published).
# .ab/wg1 issues P_A V_A,R as soon as (m_A, P_A) is there, queued behind S_B, then waits for S_B alone
# (wgmma wait_group 1) and goes on with the softmax of block B.
# Steps: .ab/wg1's wgmma-kernel GPU tests; the profiler timeline of the many-heads and mixed suites in
# main, wg1, wg1, main; then, if time is left, session 39's call 3 (the late fence in the fp8 order).
#
#   CALL_BUDGET=S bash benchmarks/results/session39/call4.sh   # carry [".cache/tilecpp", ".ab/wg1", ".ab/f8"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
fits() { [ $((SECONDS + $1)) -lt "${CALL_BUDGET:-560}" ]; }  # CALL_BUDGET: seconds this call may use
step_rc=1
fits 100 && step 2-tests-wg1 100 "$root/.ab/wg1" python3 -m pytest -p no:cacheprovider -p no:randomly -q -m gpu -rfEs -x \
    tests/test_cutlass_backend.py
grep -E "passed|failed|FAILED|Error" "$OUT/2-tests-wg1.log" | tail -n 6
wg1_ok=$step_rc
for tree in main wg1 wg1 main; do
    [ "$wg1_ok" -ne 0 ] && break
    fits 60 || break
    dir=$root; [ "$tree" != main ] && dir=$root/.ab/$tree
    step "3-tl-$tree" 60 "$dir" python3 benchmarks/timeline.py --backend cutlass --suites many-heads,mixed
    grep -E "period|Error" "$OUT/3-tl-$tree.log" | cut -c1-150 >> "$OUT/3-timeline.txt"
    echo "##### $tree" >> "$OUT/3-timeline.txt"
    cat "$OUT/3-tl-$tree.log" >> "$OUT/3-timeline-all.log" && rm -f "$OUT/3-tl-$tree.log"
done
grep -oE "^.*period [0-9.]+ us/call|#####.*|Error.*" "$OUT/3-timeline.txt"
left=$(( ${CALL_BUDGET:-560} - SECONDS ))
if [ "$left" -gt 200 ]; then  # (the device returns at most 8 files: the fp8 part's GPU log is dropped)
    CALL_BUDGET=$left OUT=$OUT/f8 bash benchmarks/results/session39/call3.sh
    rm -f "$OUT/f8/0-gpu.log"
fi
