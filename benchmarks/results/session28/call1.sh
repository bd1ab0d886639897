#!/usr/bin/env bash
# Session 28, device call 1: session 27's prepared A/B (the tilecpp fp8 kernel with its P . V operand
# widened from the transposed fp8 tile, `session27/variants/...patch`, built into .ab/f1 as
# session27/call2.sh's header says) on the dense and pages-of-64 quantized shapes, then the suites
# session 27's call 3 listed (the tilecpp kernels of this tree).
#
#   bash benchmarks/results/session28/call1.sh   # device: carry [".cache/tilecpp", ".ab/f1"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp
source benchmarks/results/session21/step.sh
ab() { timeline_trees "$root" "$root/.ab/f1" "$root/.ab/f1" "$root" -- --kv fp8 --suites quantized "$@"; }
export -f ab timeline_trees
export root
step 1-fp8-dense 150 "$root" bash -c ab
step 2-fp8-paged64 120 "$root" bash -c 'ab --layout paged --page-size 64'
BENCH_LIMIT=100 bash benchmarks/run_h200.sh mixed:paged:64 quantized:paged:64 deepseek+fp8 many-heads+fp8 \
    mtp+fp8 > "${OUT:?}/run.log" 2>&1
echo "run: exit $?"
