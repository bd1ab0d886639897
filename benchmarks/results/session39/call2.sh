#!/usr/bin/env bash
# Session 39, device call 2 (the warm machine of call 1): session 38's pipelined step order for a bf16
# cache (.ab/pipe, TILEGYM_WIDE_PIPELINED = 1) against main again, on this machine: profiler timeline of
# the many-heads and mixed suites in main, pipe, pipe, main (its GPU tests passed on an H100 in session 38).
#
#   bash benchmarks/results/session39/call2.sh   # device: carry [".cache/tilecpp", ".ab/pipe"], timeout 360
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
for tree in main pipe pipe main; do
    [ $((SECONDS + 70)) -lt 330 ] || break
    dir=$root; [ "$tree" != main ] && dir=$root/.ab/$tree
    step "3-tl-$tree" 70 "$dir" python3 benchmarks/timeline.py --backend cutlass --suites many-heads,mixed
    grep -E "period|Error" "$OUT/3-tl-$tree.log" | cut -c1-150 >> "$OUT/3-timeline.txt"
    echo "##### $tree" >> "$OUT/3-timeline.txt"
    cat "$OUT/3-tl-$tree.log" >> "$OUT/3-timeline-all.log" && rm -f "$OUT/3-tl-$tree.log"
done
grep -oE "^.*period [0-9.]+ us/call|#####.*|Error.*" "$OUT/3-timeline.txt"
