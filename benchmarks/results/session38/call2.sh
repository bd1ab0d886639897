#!/usr/bin/env bash
# Session 38, device call 2 (an H200 only): the fp8 suites that the README's rows and the selection table
# use, with the library as committed (FP8_SNAP by default since session 37): `quantized+fp8`,
# `quantized+fp8_ds_mla` and `deepseek+fp8`, every backend (session 37's call3.sh step 2).
#
#   bash benchmarks/results/session38/call2.sh   # device: carry [".cache/tilecpp"], timeout 600
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
grep -q H200 "$OUT/0-gpu.log" || { echo "not an H200: suites skipped"; exit 0; }
BENCH_LIMIT=150 bash benchmarks/run_h200.sh quantized+fp8 quantized+fp8_ds_mla deepseek+fp8 > "$OUT/2-suites.log" 2>&1
grep -E "^=== |^--- |^\| " "$OUT/2-suites.log" | cut -c1-200 | tail -n 60
