#!/usr/bin/env bash
# Session 40, device call 6 (not run this session: written for the next one; any Hopper): the wgmma
# kernel's fp8 variant widening its tiles in 16-byte pieces (`variants/fp8-widen-16-byte-pieces.patch`):
# each thread reads two 16-byte pieces of a staged fp8 tile instead of four 8-byte ones and splits each
# word into halves by a move instead of shifts, so the variant's SASS has 3% fewer instructions (bf16
# pair build 10216 -> 9904; 292 -> 33 shifts, 144 8-byte shared loads -> 72 16-byte ones), still no
# spills in the step loop. fp8 at 128 heads is 1.30x slower than bf16 (H200, session 40 call 2).
# Tree .ab/w16, from the repository root:
#   mkdir -p .ab/w16 && git archive HEAD | tar -x -C .ab/w16
#   (cd .ab/w16 && patch -p1 < ../../benchmarks/results/session40/variants/fp8-widen-16-byte-pieces.patch)
#   (cd .ab/w16 && TILEGYM_CACHE_DIR=$PWD/../../.cache/tilecpp PYTHONPATH=. python -m tilegym precompile --arch sm_90 --backend cutlass)
# Steps: the tree's GPU tests of the fp8 variant, then the profiler timeline of the fp8 `many-heads` and
# `mtp` shapes in main, w16, w16, main.
#
#   CALL_BUDGET=S bash benchmarks/results/session40/call6.sh   # carry [".cache/tilecpp", ".ab/w16"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
fits 120 && step 2-tests-w16 120 "$root/.ab/w16" python3 -m pytest -p no:cacheprovider -q -m gpu -rfEs -n 4 \
    tests/test_cutlass_fp8.py -k "many_query_rows or grow_along"
if [ "${step_rc:-1}" -eq 0 ]; then
    for tree in main w16 w16 main; do fits 80 && cutlass_timeline "$tree" fp8 many-heads,mtp 80; done
fi
grep -hE "period [0-9.]+ us/call|#####|Error" "$OUT/3-timeline.txt"
