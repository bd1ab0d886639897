#!/usr/bin/env bash
# Session 39, device call 2 (an H200 only, right after call 1 on the warm machine): the fp8 suites
# behind the README's fp8 rows and the selection table, every backend, with the library as committed
# (session 38's call2.sh): quantized+fp8, quantized+fp8_ds_mla, deepseek+fp8.
#
#   bash benchmarks/results/session39/call2.sh   # device: carry [".cache/tilecpp"], timeout 600
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
grep -q H200 "$OUT/0-gpu.log" || { echo "not an H200: suites skipped"; exit 0; }
BENCH_LIMIT=150 bash benchmarks/run_h200.sh quantized+fp8 quantized+fp8_ds_mla deepseek+fp8 > "$OUT/2-suites.log" 2>&1
grep -E "^=== |^\| " "$OUT/2-suites.log" | cut -c1-200 | tail -n 60
