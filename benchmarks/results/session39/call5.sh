#!/usr/bin/env bash
# Session 39's two unrun step changes against main (any Hopper), from trees .ab/f8 and .ab/wg1 made by
# applying the patches in variants/ to a copy of the tree (cubins: `python -m tilegym precompile --arch
# sm_90a --backend cutlass` in each tree):
# - f8 (fp8-order-late-p-fence.patch): in the fp8 step order, WG1 issues P_B V_B,R (P_B from registers)
#   before fencing P_B's shared copy, as main's bf16 order now does for P_A.
# - wg1 (wg1-pv-behind-scores.patch): WG1 issues P_A V_A,R behind its own S_B before waiting for S_B.
#   As built it spills in the step loop (NOTES_cutlass.md, "Session 39"): fix that before timing it.
# For each: its GPU tests, then the profiler timeline in main, VARIANT, VARIANT, main. A step runs only
# if CALL_BUDGET (seconds, default 560) still covers its limit, so the call returns whole steps.
#
#   CALL_BUDGET=S bash benchmarks/results/session39/call5.sh   # carry [".cache/tilecpp", ".ab/f8", ".ab/wg1"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
fits() { [ $((SECONDS + $1)) -lt "${CALL_BUDGET:-560}" ]; }
# ab VARIANT KV SUITES TESTS...: VARIANT's GPU tests, then the timeline in main, VARIANT, VARIANT, main
ab() {
    local v=$1 kv=$2 suites=$3
    shift 3
    step_rc=1
    fits 120 && step "2-tests-$v" 120 "$root/.ab/$v" python3 -m pytest -p no:cacheprovider -p no:randomly -q -m gpu \
        -rfEs -x "$@"
    [ "$step_rc" -eq 0 ] || return 0
    for tree in main "$v" "$v" main; do
        fits 50 || break
        cutlass_timeline "$tree" "$kv" "$suites" 50
    done
}
ab f8 fp8 many-heads tests/test_cutlass_fp8.py
ab wg1 bf16 many-heads,mixed tests/test_cutlass_backend.py
grep -oE "^.*period [0-9.]+ us/call|#####.*|Error.*" "$OUT/3-timeline.txt"
