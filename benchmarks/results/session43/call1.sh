#!/usr/bin/env bash
# Session 43, device call 1 (no device machine was lent in session 43; run in session 44 on an H100:
# results/session44/call1-h100/): the query ahead of the first KV copies, in both cutlass kernels (`variants/query-first.patch`).
# Tree .ab/qf, from the repository root:
#   mkdir -p .ab/qf && git archive HEAD | tar -x -C .ab/qf
#   (cd .ab/qf && patch -p1 < ../../benchmarks/results/session43/variants/query-first.patch)
#   (cd .ab/qf && TILEGYM_CACHE_DIR=$PWD/../../.cache/tilecpp PYTHONPATH=. python -m tilegym precompile --arch sm_90 --backend cutlass)
# (and main's cubins: `python -m tilegym precompile --arch sm_90 --backend cutlass` at the root).
# Steps: 1. the tree's cutlass GPU tests (~125 s on an H100 in session 42); 2. if they pass, profiler
# timelines in the order main, qf, qf, main: the fp8 `quantized` shapes (the 16-row fp8 kernel at 16
# heads; the wgmma fp8 variant at 128 heads, whose SASS the patch leaves as it is) and the bf16
# `many-heads` and `mtp` shapes (the wgmma kernel's producer waits for the first query copies).
#
#   CALL_BUDGET=S bash benchmarks/results/session43/call1.sh   # carry [".cache/tilecpp", ".ab/qf"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
fits 200 && step 1-tests-qf 200 "$root/.ab/qf" python3 -m pytest -p no:cacheprovider -q -m gpu -rfEs -n 4 \
    tests/test_cutlass_fp8.py tests/test_cutlass_backend.py
tail -n 3 "$OUT/1-tests-qf.log"
if [ "${step_rc:-1}" -eq 0 ]; then
    for tree in main qf qf main; do fits 45 && cutlass_timeline "$tree" fp8 quantized 45; done
    for tree in main qf qf main; do fits 60 && cutlass_timeline "$tree" bf16 many-heads,mtp 60; done
fi
grep -hE "period [0-9.]+ us/call|#####|Error" "$OUT/3-timeline.txt" | cut -c1-60
