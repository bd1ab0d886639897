#!/usr/bin/env bash
# Session 43, device call 2 (not run: no device machine was lent this session; for a later one): H200
# only, it exits at once elsewhere. Session 42's call 3 (the fp8_ds_mla suites, cutlass beside triton,
# and bf16 `many-heads` with cutlass) plus `mtp+fp8` (its committed H200 report's cutlass Q = 2 row
# predates the 16-row fp8 kernel's two row tiles), with the library as committed.
#
#   bash benchmarks/results/session43/call2.sh   # carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
grep -q H200 "$OUT/0-gpu.log" || { echo "not an H200: nothing run"; exit 0; }
BENCH_LIMIT=50 bash benchmarks/run_h200.sh "many-heads+fp8_ds_mla@cutlass,triton" "mtp+fp8_ds_mla@cutlass,triton" \
    "quantized+fp8_ds_mla@cutlass,triton" "many-heads@cutlass" "mtp+fp8@cutlass,triton" > "$OUT/1-suites.log" 2>&1
grep -E "^=== " "$OUT/1-suites.log"
