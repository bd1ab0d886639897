#!/usr/bin/env bash
# Session 26, device call 2: tilecpp with pages of 64, the page id read a step ahead (.ab/p1) against
# this tree (profiler timeline, quick suite, order this, p1, p1, this); then the dense suites with call 1's
# tilecpp kernel (every backend, as the reports are).
#
#   bash benchmarks/results/session26/call2.sh   # device: carry [".cache/tilecpp", ".ab/p1"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp
source benchmarks/results/session21/step.sh
paged() {
    for tree in "$root" "$root/.ab/p1" "$root/.ab/p1" "$root"; do
        echo "##### tree $tree"
        (cd "$tree" && PYTHONPATH=. python3 benchmarks/timeline.py --backend tilecpp --layout paged --page-size 64 \
            --suites quick 2>&1 | grep -E "period|Error|B[0-9]")
    done
}
export -f paged
export root
step 1-paged-p1 150 "$root" bash -c paged
BENCH_LIMIT=110 bash benchmarks/run_h200.sh deepseek many-heads mixed mtp quantized quantized+fp8 > "$OUT/2-run.log" 2>&1
echo "suites: exit $?"
