#!/usr/bin/env bash
# Session 37, device call 3: the library as committed (float32 partials, FP8_SNAP by default).
# 1. The new GPU tests on main's kernels (they ran in call 1 on the fp16-partials tree only), and the
#    snapped pieces' test.
# 2. On an H200 only: the fp8 suites the README's rows and the selection table use: `quantized+fp8`,
#    `quantized+fp8_ds_mla` (128 x 8192 x 16 now takes snapped pieces) and `deepseek+fp8` (its last
#    H200 run was 2026-12-02), every backend.
#
#   bash benchmarks/results/session37/call3.sh   # device: carry [".cache/tilecpp"], timeout 600
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
step 1-tests 90 "$root" python3 -m pytest -p no:cacheprovider -p no:randomly -m gpu -rfEs \
    tests/test_cutlass_backend.py tests/test_cutlass_fp8.py -k "magnitude or far_from_unit or snapped"
tail -n 3 "$OUT/1-tests.log"
grep -q H200 "$OUT/0-gpu.log" || { echo "not an H200: suites skipped"; exit 0; }
BENCH_LIMIT=150 bash benchmarks/run_h200.sh quantized+fp8 quantized+fp8_ds_mla deepseek+fp8 > "$OUT/2-suites.log" 2>&1
grep -E "^=== |^--- |^\| " "$OUT/2-suites.log" | cut -c1-200 | tail -n 60
