#!/usr/bin/env bash
# Session 35, device call 3: the 16-row fp8 kernel's configs again now that its partials are fp16
# (the default 2 x 1 x 2 x 4 was chosen with float32 ones): the sweep's configs, and the default with
# fewer, longer pieces (fewest blocks per piece 4 and 16), default first and last, in one process.
#
#   bash benchmarks/results/session35/call3.sh   # device: carry [".cache/tilecpp"], timeout 300
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp PYTHONUNBUFFERED=1
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
source benchmarks/results/session21/step.sh
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$OUT/0-gpu.log" 2>&1
cat "$OUT/0-gpu.log"
step 1-fp8-configs 240 "$root" python3 benchmarks/sweep_cutlass_fp8.py --shapes 64x4096x16,128x8192x16 \
    --formats fp8,fp8_ds_mla --configs 2x1x2x4,4x2x1x4,5x2x1x4,4x3x1x4,5x3x1x4,2x1x2x4x4,2x1x2x4x16,2x1x2x4
grep -E "^## |^\| [0-9]|copy|Error" "$OUT/1-fp8-configs.log"
