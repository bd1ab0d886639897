#!/usr/bin/env bash
# Session 27, device call 2 (not run yet: the session's device time ran out): the tilecpp fp8 kernel
# with its P . V operand widened from the transposed fp8 tile (variants/fp8-pv-widened-from-transposed-
# tile.patch: 0 bytes of stack in the 16 x 64 dense build and 8 with pages of 64, against 208 and 208
# in this tree; 344 F2FP conversions per step body instead of 216) against this tree: profiler timeline,
# quantized suite, dense and pages of 64, order this, f1, f1, this.
#
# Here, first:
#   rm -rf .ab/f1 && mkdir -p .ab/f1 && git archive HEAD tilegym benchmarks | tar -x -C .ab/f1
#   patch -d .ab/f1 -p1 < benchmarks/results/session27/variants/fp8-pv-widened-from-transposed-tile.patch
#   (cd .ab/f1 && TILEGYM_CACHE_DIR=$PWD/../../.cache/tilecpp PYTHONPATH=. \
#       ../../.venv/bin/python -m tilegym precompile --arch sm_90 --backend tilecpp)
#   bash benchmarks/results/session27/call2.sh   # device: carry [".cache/tilecpp", ".ab/f1"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp
source benchmarks/results/session21/step.sh
ab() { timeline_trees "$root" "$root/.ab/f1" "$root/.ab/f1" "$root" -- --kv fp8 --suites quantized "$@"; }
export -f ab timeline_trees
export root
step 1-fp8-dense 200 "$root" bash -c ab
step 2-fp8-paged64 200 "$root" bash -c 'ab --layout paged --page-size 64'
