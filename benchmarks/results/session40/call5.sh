#!/usr/bin/env bash
# Session 40, device call 5 (not run this session: written for the next one; any Hopper): the 16-row fp8
# kernel with two row tiles (`variants/fp8-two-row-tiles.patch`), for 17-32 query rows of a per-tensor
# fp8 cache (16 heads x 2 new tokens, 32 heads), which today run the wgmma kernel's fp8 variant (H200,
# call 2: 92.8 us at 64 x 4096 x 16 with Q = 2, against 49.4 for Q = 1 and 83.3 for a bf16 cache).
# Its one-tile code moved too (same instructions in another order), so it is timed against main.
# Tree .ab/t2, from the repository root:
#   mkdir -p .ab/t2 && git archive HEAD | tar -x -C .ab/t2
#   (cd .ab/t2 && patch -p1 < ../../benchmarks/results/session40/variants/fp8-two-row-tiles.patch)
#   (cd .ab/t2 && TILEGYM_CACHE_DIR=$PWD/../../.cache/tilecpp PYTHONPATH=. python -m tilegym precompile --arch sm_90 --backend cutlass)
# Steps: 1. the tree's cutlass GPU tests (every one-tile case again; the two-tile cases switch it on);
# 2. one tile against main, profiler timeline of the fp8 `quantized` shapes: main, t2, t2, main;
# 3. the `mtp` suite with an fp8 cache in t2, two tiles off, on, on, off.
#
#   CALL_BUDGET=S bash benchmarks/results/session40/call5.sh   # carry [".cache/tilecpp", ".ab/t2"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
fits 150 && step 2-tests-t2 150 "$root/.ab/t2" python3 -m pytest -p no:cacheprovider -q -m gpu -rfEs -n 4 \
    tests/test_cutlass_fp8.py tests/test_cutlass_backend.py
if [ "${step_rc:-1}" -eq 0 ]; then
    for tree in main t2 t2 main; do fits 50 && cutlass_timeline "$tree" fp8 quantized 50; done
    for flag in "" --fp8-two-tiles --fp8-two-tiles ""; do fits 50 && cutlass_timeline t2 fp8 mtp 50 $flag; done
fi
grep -hE "period [0-9.]+ us/call|#####|Error" "$OUT/3-timeline.txt"
