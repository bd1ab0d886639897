#!/usr/bin/env bash
# Session 36, device call 1 (H200 wanted):
# (Loads-only and math-only diagnostic trees were prepared as well and dropped for device time.)
# 1. the fp8 kernel's configs at long rows, fp16 partials (session 35 compared only 2x1x2 and 4x2x1):
#    do three warpgroups sharing a ring (4x3x1) still win where segments are long, as they did with
#    float32 partials (128 x 8192 x 16), and does that put fp8_ds_mla over 80% there? With snapped pieces
#    (the config's 6th field, host only: equal rows cut into whole segments, L / k) as well: session 22
#    found 4x3x1 far behind where pieces cut rows into short segments. Then the snapped pieces' GPU test.
# 2. the `deepseek+fp8` suite, every backend (the selection table's fp8 rows date
#    from 2026-12-02, before the fp16 partials and the per-call config).
#
#   bash benchmarks/results/session36/call1.sh   # device: carry [".cache/tilecpp"], timeout 600
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
step 1-fp8-long 130 "$root" python3 benchmarks/sweep_cutlass_fp8.py \
    --shapes 128x8192x16,128x4096x16,64x8192x16 --formats fp8,fp8_ds_mla \
    --configs 2x1x2x4,2x1x2x4x0x0.04,4x3x1x4,4x3x1x4x0x0.04,4x2x1x4x0x0.04
grep -E "^## |^\| [0-9]|copy|Error" "$OUT/1-fp8-long.log"
step 1b-snap-tests 50 "$root" python3 -m pytest -p no:cacheprovider -m gpu -rfEs tests/test_cutlass_fp8.py -k snapped
# The suites' reports feed the selection table, which is built from H200 runs only.
grep -q H200 "$OUT/0-gpu.log" || { echo "not an H200: suites skipped"; exit 0; }
BENCH_LIMIT=110 bash benchmarks/run_h200.sh deepseek+fp8 > "$OUT/6-suites.log" 2>&1
grep -E "^=== " "$OUT/6-suites.log"
