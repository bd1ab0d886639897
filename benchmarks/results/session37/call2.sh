#!/usr/bin/env bash
# Session 37, device call 2 (an H200 for the suites): session 36's call 1, unchanged in purpose.
# 1. The 16-row fp8 kernel's configs at long equal rows with fp16 partials: does 4 x 3 x 1 (three
#    warpgroups sharing a ring) win with snapped pieces (the config's 6th field) as it did with float32
#    partials at 128 x 8192 x 16? Then the snapped pieces' GPU test.
# 2. On an H200 only: the `deepseek+fp8` suite, every backend (the selection table's fp8 rows date from
#    2026-12-02), and the `many-heads` and `mixed` suites (the wgmma kernel's fp16 partials).
# It ran (an H100, so step 2 was skipped) from the tree of call 1, whose wgmma kernel and combine wrote
# fp16 partials (variants/cutlass-fp16-partials.patch); the 16-row fp8 kernel is the library's.
#
#   bash benchmarks/results/session37/call2.sh   # device: carry [".cache/tilecpp"], timeout 600
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
step 1-fp8-long 120 "$root" python3 benchmarks/sweep_cutlass_fp8.py \
    --shapes 128x8192x16,128x4096x16,64x8192x16 --formats fp8,fp8_ds_mla \
    --configs 2x1x2x4,2x1x2x4x0x0.04,4x3x1x4,4x3x1x4x0x0.04
grep -E "^## |^\| [0-9]|copy|Error" "$OUT/1-fp8-long.log"
step 1b-snap-tests 40 "$root" python3 -m pytest -p no:cacheprovider -m gpu -rfEs tests/test_cutlass_fp8.py -k snapped
tail -n 2 "$OUT/1b-snap-tests.log"
# The suites' reports feed the selection table and the README, which use H200 runs only.
grep -q H200 "$OUT/0-gpu.log" || { echo "not an H200: suites skipped"; exit 0; }
BENCH_LIMIT=120 bash benchmarks/run_h200.sh deepseek+fp8 many-heads mixed > "$OUT/6-suites.log" 2>&1
grep -E "^=== " "$OUT/6-suites.log"
