#!/usr/bin/env bash
# Session 39, device call 1 (any Hopper): two changes to the wgmma kernel's bf16 step against main.
# - .ab/q (TILEGYM_EARLY_QUERY = 1, session 38): the next segment's query copied once both warpgroups
#   are past their last score matmuls, overlapping the output stores. Its GPU tests passed on an H100
#   in session 38; not timed yet.
# - .ab/fence (this session): WG0 issues its P_A V_A,L (P_A from registers) before the proxy fence that
#   makes P_A's shared copy visible to WG1's matmul, as FlashMLA's split kernel orders it (its SASS,
#   NOTES_cutlass.md "Session 39"); main fences (MEMBAR) first, then issues.
# Steps: .ab/fence's wgmma-kernel GPU tests; then the profiler timeline of the many-heads and mixed suites
# in main, q, fence, fence, q, main (a drift over the call cannot favour one tree). A step runs only if
# the call's 560 s still cover its limit, so the call returns whole steps.
#
#   bash benchmarks/results/session39/call1.sh   # device: carry [".cache/tilecpp", ".ab/q", ".ab/fence"], timeout 600
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
fits() { [ $((SECONDS + $1)) -lt 560 ]; }
step 2-tests-fence 120 "$root/.ab/fence" python3 -m pytest -p no:cacheprovider -p no:randomly -q -m gpu -rfEs -x \
    tests/test_cutlass_backend.py
grep -E "passed|failed|FAILED|Error" "$OUT/2-tests-fence.log" | tail -n 6
fence_ok=$step_rc
for tree in main q fence fence q main; do
    [ "$tree" = fence ] && [ "$fence_ok" -ne 0 ] && continue
    fits 70 || break
    dir=$root; [ "$tree" != main ] && dir=$root/.ab/$tree
    step "3-tl-$tree" 70 "$dir" python3 benchmarks/timeline.py --backend cutlass --suites many-heads,mixed
    grep -E "period|Error" "$OUT/3-tl-$tree.log" | cut -c1-150 >> "$OUT/3-timeline.txt"
    echo "##### $tree" >> "$OUT/3-timeline.txt"
    # $OUT brings back at most 8 files: the timeline logs go into one.
    cat "$OUT/3-tl-$tree.log" >> "$OUT/3-timeline-all.log" && rm -f "$OUT/3-tl-$tree.log"
done
grep -oE "^.*period [0-9.]+ us/call|#####.*|Error.*" "$OUT/3-timeline.txt"
