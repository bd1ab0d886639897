#!/usr/bin/env bash
# Session 32, device call 2 (any Hopper GPU: an A/B within one process, nothing kept as a report):
# Triton's fp8 kernel at 16 query rows with its scores by fp8 MMA on the tile as it lies in shared
# memory (configs ending in `m`; S^T = K Q^T, the query split into two e4m3 parts, only V widened)
# against the default (n64 w4 s3 f, byte pairs for both operands) and session 31's candidates.
# The `m` configs exist only with variants/triton-fp8-mma-scores.patch applied (`git apply`); the
# variant lost (NOTES_triton.md, "Session 32") and is not in the tree.
#
#   bash benchmarks/results/session32/call2.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
source benchmarks/results/session21/step.sh
{ nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv; python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"; } > "$OUT/0-gpu.log" 2>&1
cat "$OUT/0-gpu.log"
step 1-triton-fp8-mma 420 "$root" python3 benchmarks/sweep_triton_configs.py --shapes 64x4096x16,128x8192x16 \
    --formats fp8 --configs default,n64w8s3mp1,n64w8s2mp1,n64w4s2mp1,n64w4s3mp1,n64w8s3fp1,n32w4s4f,default
grep -vi warn "$OUT/1-triton-fp8-mma.log" | tail -40
