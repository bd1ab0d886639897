#!/usr/bin/env bash
# Session 35, device call 5: call 4 found 4 x 2 x 1 x 4 13-15% ahead of the default 2 x 1 x 2 x 4 where
# the call has few blocks (1 x 32768, 4 x 1024), about 2% ahead at 4096 and 16384 blocks, 2-4% behind at
# 8192. Here: where between, and mixed lengths (the sweep's BxUSxH shapes), order A B B A, fp8; then
# the cutlass GPU tests with the library choosing 4 x 2 x 1 x 4 at <= 32 blocks per SM (fp8_config).
#
#   bash benchmarks/results/session35/call5.sh   # device: carry [".cache/tilecpp"], timeout 300
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp PYTHONUNBUFFERED=1
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
source benchmarks/results/session21/step.sh
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$OUT/0-gpu.log" 2>&1
cat "$OUT/0-gpu.log"
step 1-fp8-ab 150 "$root" python3 benchmarks/sweep_cutlass_fp8.py \
    --shapes 2x16384x16,16x4096x16,8x8192x16,16x8192x16,96x4096x16,64xU8192x16,128xU4096x16,32xU8192x16,8xU16384x16 \
    --formats fp8 --configs 2x1x2x4,4x2x1x4,4x2x1x4,2x1x2x4
grep -E "^## |^\| [0-9]|copy|Error" "$OUT/1-fp8-ab.log"
step 2-tests 110 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 8 -rfE tests/test_cutlass_fp8.py tests/test_cutlass_backend.py
grep -E "passed|failed" "$OUT/2-tests.log" | tail -n 3
