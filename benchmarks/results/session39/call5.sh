#!/usr/bin/env bash
# Session 39, device call 5 (any Hopper; the session's last device time): call 3 first (the late P fence
# in the fp8 order, .ab/f8), then, with what is left, call 4's variant (.ab/wg1: WG1 issues P_A V_A,R
# behind S_B before waiting for S_B). .ab/wg1 builds without a ptxas serialisation warning but spills in
# the step loop (cuobjdump: 390 local loads/stores in SASS against main's 69, stack 224 B against 80),
# so a loss there says "not as built", not "not the idea".
#
#   CALL_BUDGET=S bash benchmarks/results/session39/call5.sh   # carry [".cache/tilecpp", ".ab/f8", ".ab/wg1"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
fits() { [ $((SECONDS + $1)) -lt "${CALL_BUDGET:-560}" ]; }  # CALL_BUDGET: seconds this call may use
# ab VARIANT KV TESTS...: VARIANT's GPU tests, then the timeline (cache KV) in main, VARIANT, VARIANT, main
ab() {
    local v=$1 kv=$2 suites=$3
    shift 3
    step_rc=1
    fits 120 && step "2-tests-$v" 120 "$root/.ab/$v" python3 -m pytest -p no:cacheprovider -p no:randomly -q -m gpu \
        -rfEs -x "$@"
    grep -E "passed|failed|FAILED|Error" "$OUT/2-tests-$v.log" | tail -n 4
    [ "$step_rc" -eq 0 ] || return 0
    for tree in main "$v" "$v" main; do
        fits 50 || break
        dir=$root; [ "$tree" != main ] && dir=$root/.ab/$tree
        step "3-tl" 50 "$dir" python3 benchmarks/timeline.py --backend cutlass --kv "$kv" --suites "$suites"
        grep -E "period|Error" "$OUT/3-tl.log" | cut -c1-150 >> "$OUT/3-timeline.txt"
        echo "##### $tree ($kv)" >> "$OUT/3-timeline.txt"
        cat "$OUT/3-tl.log" >> "$OUT/3-timeline-all.log" && rm -f "$OUT/3-tl.log"
    done
}
ab f8 fp8 many-heads tests/test_cutlass_fp8.py
ab wg1 bf16 many-heads,mixed tests/test_cutlass_backend.py
grep -oE "^.*period [0-9.]+ us/call|#####.*|Error.*" "$OUT/3-timeline.txt"
