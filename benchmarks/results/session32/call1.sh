#!/usr/bin/env bash
# Session 32, device call 1 (H200 only: exits at once on any other GPU, so that an H100 never
# overwrites an H200 report): session 31's call 6 (Triton's fp8 configs at 16 query rows, default
# n64 w4 s3 f against n32 w4 s4 f and n32 w4 s5 f), then the H200 reports older than session 31:
# `quantized+fp8_ds_mla`, `many-heads+fp8`, `deepseek:paged:64`, `mixed:paged:64`, `quantized+mxfp4`.
#
#   bash benchmarks/results/session32/call1.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp
OUT=${OUT:-$root/out}
mkdir -p "$OUT" device-logs
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "GPU: $gpu"
case "$gpu" in *H200*) ;; *) echo "not an H200: nothing run"; exit 3 ;; esac
source benchmarks/results/session21/step.sh
step 1-triton-fp8-sweep 120 "$root" python3 benchmarks/sweep_triton_configs.py --shapes 64x4096x16,128x8192x16 \
    --formats fp8 --configs default,n32w4s4f,n32w4s5f,default,n32w4s4f
cp "$OUT/1-triton-fp8-sweep.log" device-logs/session32-1-triton-fp8-sweep.log
grep -vi warn "$OUT/1-triton-fp8-sweep.log"
BENCH_LIMIT=100 bash benchmarks/run_h200.sh quantized+fp8_ds_mla many-heads+fp8 deepseek:paged:64 \
    mixed:paged:64 quantized+mxfp4 2>&1 | grep -E "^===|passed|failed"
