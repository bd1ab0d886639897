#!/usr/bin/env bash
# Session 35, device call 4: call 3 found 4 x 2 x 1 x 4 (two warpgroups sharing four stages, one CTA
# per SM) 1.5-2.4% ahead of the default at 64 x 4096 x 16 and 128 x 8192 x 16 fp8: both again on the
# shapes where pieces cut rows short (the reason the default won on the H200), order A B B A.
#
#   bash benchmarks/results/session35/call4.sh   # device: carry [".cache/tilecpp"], timeout 300
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp PYTHONUNBUFFERED=1
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
source benchmarks/results/session21/step.sh
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$OUT/0-gpu.log" 2>&1
cat "$OUT/0-gpu.log"
step 1-fp8-ab 240 "$root" python3 benchmarks/sweep_cutlass_fp8.py \
    --shapes 64x4096x16,128x8192x16,128x4096x16,64x8192x16,32x8192x16,1x32768x16,4x1024x16 \
    --formats fp8,fp8_ds_mla --configs 2x1x2x4,4x2x1x4,4x2x1x4,2x1x2x4
grep -E "^## |^\| [0-9]|copy|Error" "$OUT/1-fp8-ab.log"
