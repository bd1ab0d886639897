#!/usr/bin/env bash
# Session 40, device call 2 (any Hopper; the README's tables are the H200's, an H100's results go to a
# session folder): the suites whose cutlass rows the warp-uniform warpgroup
# index changes (call 1 on an H100: 10-15% faster at 128 heads), then session 38's fp8 suites that the
# README and the selection table still lack; every backend, the library as committed.
#
#   bash benchmarks/results/session40/call2.sh   # device: carry [".cache/tilecpp"], timeout 600
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
BENCH_LIMIT=90 bash benchmarks/run_h200.sh many-heads mixed many-heads+fp8 mtp mtp+fp8 \
    quantized+fp8 quantized+fp8_ds_mla deepseek+fp8 mixed:paged:64 > "$OUT/2-suites.log" 2>&1
grep -E "^=== |^--- |^\| " "$OUT/2-suites.log" | cut -c1-200 | tail -n 80
