#!/usr/bin/env bash
# Session 40, device call 3 (any Hopper): call 2's suites again, with the Tile C++ cubins this time
# (call 2 carried only sm_90a builds; the tilecpp loader looks for sm_90, so tilecpp sat out and its
# tables were not kept). Most important first: a call cut short keeps every suite that finished.
#
#   bash benchmarks/results/session40/call3.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
BENCH_LIMIT=80 bash benchmarks/run_h200.sh many-heads mixed many-heads+fp8 mtp mtp+fp8 quantized+fp8 \
    deepseek+fp8 quantized+fp8_ds_mla mixed:paged:64 > "$OUT/2-suites.log" 2>&1
grep -E "^=== " "$OUT/2-suites.log"
