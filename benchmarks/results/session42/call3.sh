#!/usr/bin/env bash
# Session 42, device call 3 (not run: too little device time was left; for a later session): only on an
# H200 (else it exits at once): the fp8_ds_mla suites (cutlass beside
# triton) and bf16 `many-heads`, for H200 figures of the fp8_ds_mla routes turned on after call 1 (an H100).
#
#   bash benchmarks/results/session42/call3.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
grep -q H200 "$OUT/0-gpu.log" || { echo "not an H200: nothing run"; exit 0; }
BENCH_LIMIT=45 bash benchmarks/run_h200.sh "many-heads+fp8_ds_mla@cutlass,triton" "mtp+fp8_ds_mla@cutlass,triton" \
    "quantized+fp8_ds_mla@cutlass,triton" "many-heads@cutlass" > "$OUT/1-suites.log" 2>&1
grep -E "^=== " "$OUT/1-suites.log"
