#!/usr/bin/env bash
# Session 39, device call 3 (any Hopper): the late P fence of call 1 (now main's bf16 order) in the fp8
# step order too. There WG1 stores P_B, fences, then issues P_B V_B,R with P_B from registers; .ab/f8
# issues that matmul first and fences after it, before telling WG0 that P_B is in shared memory.
# Steps: .ab/f8's GPU tests of the wgmma kernel (fp8 and bf16 files); then the profiler timeline of the
# many-heads suite with an fp8 cache in main, f8, f8, main; then main's bf16 tests (its kernels changed
# in this session: the late fence of call 1, and the early query's switch removed).
#
#   bash benchmarks/results/session39/call3.sh   # device: carry [".cache/tilecpp", ".ab/f8"], timeout 600
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
fits() { [ $((SECONDS + $1)) -lt "${CALL_BUDGET:-560}" ]; }  # CALL_BUDGET: seconds this call may use
step_rc=1
fits 150 && step 2-tests-f8 150 "$root/.ab/f8" python3 -m pytest -p no:cacheprovider -p no:randomly -q -m gpu -rfEs -x \
    tests/test_cutlass_fp8.py tests/test_cutlass_backend.py
grep -E "passed|failed|FAILED|Error" "$OUT/2-tests-f8.log" | tail -n 6
f8_ok=$step_rc
for tree in main f8 f8 main; do
    [ "$tree" = f8 ] && [ "$f8_ok" -ne 0 ] && continue
    fits 70 || break
    dir=$root; [ "$tree" != main ] && dir=$root/.ab/$tree
    step "3-tl-$tree" 70 "$dir" python3 benchmarks/timeline.py --backend cutlass --kv fp8 --suites many-heads
    grep -E "period|Error" "$OUT/3-tl-$tree.log" | cut -c1-150 >> "$OUT/3-timeline.txt"
    echo "##### $tree" >> "$OUT/3-timeline.txt"
    cat "$OUT/3-tl-$tree.log" >> "$OUT/3-timeline-all.log" && rm -f "$OUT/3-tl-$tree.log"
done
grep -oE "^.*period [0-9.]+ us/call|#####.*|Error.*" "$OUT/3-timeline.txt"
fits 120 && step 1-tests-main 120 "$root" python3 -m pytest -p no:cacheprovider -p no:randomly -q -m gpu -rfEs \
    tests/test_cutlass_backend.py
tail -n 2 "$OUT/1-tests-main.log"
