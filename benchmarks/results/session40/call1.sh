#!/usr/bin/env bash
# Session 40, device call 1 (any Hopper): two cutlass step changes against main, from trees under .ab/
# (each `git archive HEAD` of main with its patch from variants/ applied by `patch -p1`; cubins: `python -m tilegym precompile --arch sm_90a
# --backend cutlass` in each tree):
# - u: the warpgroup index is made warp-uniform (`__shfl_sync` of tid / 128), so ptxas keeps the
#   per-warpgroup shared-memory addresses and matmul descriptors in uniform registers: 6% fewer SASS
#   instructions in the bf16 kernel, and no spills left in its step loop (main: 30 stores, 39 loads).
# - wg1u: u plus session 39's wg1-pv-behind-scores.patch (WG1 issues P_A V_A,R behind S_B before
#   waiting for S_B), and the step range made warp-uniform too: its spills fall from 163/227 to 28/36.
# For each: its GPU tests, then the profiler timeline in main, VARIANT, VARIANT, main. A step runs only
# if CALL_BUDGET (seconds, default 560) still covers its limit, so the call returns whole steps.
#
#   CALL_BUDGET=S bash benchmarks/results/session40/call1.sh   # carry [".cache/tilecpp", ".ab/u", ".ab/wg1u"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
# tests VARIANT LIMIT TESTS...: VARIANT's GPU tests (step_rc 0 when they pass)
tests() {
    local v=$1 limit=$2
    shift 2
    step_rc=1
    fits "$limit" && step "2-tests-$v" "$limit" "$root/.ab/$v" python3 -m pytest -p no:cacheprovider -p no:randomly \
        -q -m gpu -rfEs -x "$@"
}
# ab VARIANT KV SUITES: the timeline in main, VARIANT, VARIANT, main
ab() {
    for tree in main "$1" "$1" main; do
        fits 50 || break
        cutlass_timeline "$tree" "$2" "$3" 50
    done
}
tests u 150 tests/test_cutlass_backend.py tests/test_cutlass_fp8.py
u_ok=$step_rc
[ "$u_ok" -eq 0 ] && ab u bf16 many-heads,mixed
tests wg1u 120 tests/test_cutlass_backend.py
[ "$step_rc" -eq 0 ] && ab wg1u bf16 many-heads,mixed
[ "$u_ok" -eq 0 ] && ab u fp8 many-heads
grep -oE "^.*period [0-9.]+ us/call|#####.*|Error.*" "$OUT/3-timeline.txt"
