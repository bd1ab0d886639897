#!/usr/bin/env bash
# Session 26, device call 1: the full GPU test suite with this tree's tilecpp split kernel (a plain loop
# over the piece's rows that passes over rows without blocks, instead of ct::irange), then a same-call
# A/B of the tilecpp backend on the profiler timeline (period per call): this tree ("new"), HEAD before
# the change (.ab/head, session 25) and session 23's tree (.ab/s23, commit 18fe693, before session 24's
# branch-free pass), on the deepseek suite; then quick, mixed and fp8 quantized in the other order.
#
#   bash benchmarks/results/session26/call1.sh   # device: carry [".cache/tilecpp", ".ab/s23", ".ab/head"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp
source benchmarks/results/session21/step.sh
# tl SUITE [ARGS]: the tilecpp timeline of SUITE in this tree and then in .ab/head, each labelled.
both() {
    for tree in "$root/.ab/head" "$root"; do
        echo "##### tree $tree"
        (cd "$tree" && PYTHONPATH=. python3 benchmarks/timeline.py --backend tilecpp "$@" 2>&1 | grep -E "period|Error|B[0-9]")
    done
}
export -f both
export root
step 1-tests 170 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 4 -rfE tests
step 2-deepseek-new 100 "$root" python3 benchmarks/timeline.py --backend tilecpp --suites deepseek
step 3-deepseek-head 100 "$root/.ab/head" python3 benchmarks/timeline.py --backend tilecpp --suites deepseek
step 4-deepseek-s23 100 "$root/.ab/s23" python3 benchmarks/timeline.py --backend tilecpp --suites deepseek
step 5-quick 100 "$root" bash -c "both --suites quick"
step 6-mixed 150 "$root" bash -c "both --suites mixed"
step 7-fp8 120 "$root" bash -c "both --suites quantized --kv fp8"
