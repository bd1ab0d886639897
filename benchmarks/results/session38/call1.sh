#!/usr/bin/env bash
# Session 38, device call 1 (any Hopper): two changes to the wgmma kernel, each against main in one call.
# - .ab/pipe (TILEGYM_WIDE_PIPELINED = 1): a bf16 cache in the pipelined step order (the fp8 order,
#   FlashMLA's shape: each warpgroup issues its next score matmuls behind its last P V of the step) while
#   the producer warpgroup still issues every load. Sessions 16 and 20 measured that order 2-10% slower
#   with bf16, but then the consumers issued their own TMA refills (~1000 cycles each on the chain).
# - .ab/q (TILEGYM_EARLY_QUERY = 1): the next segment's query copied once both warpgroups are past their
#   last score matmuls, overlapping the output stores, instead of after them (FlashMLA does the same).
# In this order (a call cut short by the device budget still returns whole steps):
# - .ab/pipe's cutlass GPU tests of the wgmma kernel (test_cutlass_backend.py), then the profiler timeline
#   of the many-heads and mixed suites (bf16) in main, pipe, pipe, main;
# - main's kernels: session 37's new magnitude tests and the snapped-pieces test (its call3.sh step 1);
# - .ab/q's tests, then the timeline in q, main, q.
#
#   bash benchmarks/results/session38/call1.sh   # device: carry [".cache/tilecpp", ".ab/pipe", ".ab/q"], timeout 600
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
timelines() {  # TREE...: the profiler timeline in each tree in turn, period lines to 3-timeline.txt
    for tree in "$@"; do
        i=$((i + 1))
        dir=$root; [ "$tree" != main ] && dir=$root/.ab/$tree
        step "3-timeline-$i-$tree" 70 "$dir" python3 benchmarks/timeline.py --backend cutlass --suites many-heads,mixed
        grep -E "period|Error" "$OUT/3-timeline-$i-$tree.log" | cut -c1-150 >> "$OUT/3-timeline.txt"
        echo "##### $tree" >> "$OUT/3-timeline.txt"
        # $OUT brings back at most 8 files: the timeline logs go into one.
        cat "$OUT/3-timeline-$i-$tree.log" >> "$OUT/3-timeline-all.log" && rm -f "$OUT/3-timeline-$i-$tree.log"
    done
}
tests() {  # VARIANT: the wgmma kernel's GPU tests in .ab/VARIANT
    step "2-tests-$1" 120 "$root/.ab/$1" python3 -m pytest -p no:cacheprovider -p no:randomly -q -m gpu -rfEs -x \
        tests/test_cutlass_backend.py
    grep -E "passed|failed|FAILED|Error" "$OUT/2-tests-$1.log" | tail -n 6
    # A variant that failed or hung is not timed. (Session 38 first tested the summary line, which the
    # repository's pytest options leave out: the timelines were skipped although every test passed.)
    [ "$step_rc" -eq 0 ]
}
i=0
# The pipelined order first (the larger expected effect), then the early query, so that a call cut short
# by the device budget still returns a whole comparison.
tests pipe && timelines main pipe pipe main
step 1-tests-main 90 "$root" python3 -m pytest -p no:cacheprovider -p no:randomly -q -m gpu -rfEs \
    tests/test_cutlass_backend.py tests/test_cutlass_fp8.py -k "magnitude or far_from_unit or snapped"
tail -n 2 "$OUT/1-tests-main.log"
tests q && timelines q main q
grep -oE "^.*period [0-9.]+ us/call|#####.*|Error.*" "$OUT/3-timeline.txt"
