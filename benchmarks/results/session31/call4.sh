#!/usr/bin/env bash
# Session 31, device call 4 (meant for the H200; it ran on an H100): Triton's fp8 per-tensor configs at 16 query rows since the byte
# pairs (session 14 swept only 4-warp configs with them): 8 warps, longer steps, more stages, against
# the default n64 w4 s3 f, each checked against float64.
#
#   bash benchmarks/results/session31/call4.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
source benchmarks/results/session21/step.sh
step 1-triton-fp8-sweep 280 "$root" python3 benchmarks/sweep_triton_configs.py --shapes 64x4096x16,128x8192x16 \
    --formats fp8 --configs default,n64w8s2f,n64w8s3f,n128w8s2f,n128w4s2f,n64w4s4f,n32w4s4f,n32w8s3f,n64w8s3fp1,n128w8s2fp1
cat "$OUT/1-triton-fp8-sweep.log"
