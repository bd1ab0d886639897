#!/usr/bin/env bash
# Session 31, the H200 call after calls 4-5 (an H100): Triton's fp8 configs at 16 query rows on the H200
# (default n64 w4 s3 f against n32 w4 s4 f, which the H100 found 4-6% faster at 64 x 4096 x 16), then
# `quantized+fp8_ds_mla`, the oldest H200 report of a target (run_h200.sh; it replaces the committed one).
# With SWEEP_ONLY=1, the sweep alone.
#
#   bash benchmarks/results/session31/call6.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
OUT=${OUT:-$root/out}
mkdir -p "$OUT" device-logs
source benchmarks/results/session21/step.sh
step 1-triton-fp8-sweep 90 "$root" python3 benchmarks/sweep_triton_configs.py --shapes 64x4096x16,128x8192x16 \
    --formats fp8 --configs default,n32w4s4f,n32w4s5f,default
cp "$OUT/1-triton-fp8-sweep.log" device-logs/
grep -vi warn "$OUT/1-triton-fp8-sweep.log"
[ "${SWEEP_ONLY:-0}" = 1 ] && exit 0
BENCH_LIMIT=100 bash benchmarks/run_h200.sh quantized+fp8_ds_mla 2>&1 | grep -E "^===|passed|failed"
