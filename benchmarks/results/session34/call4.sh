#!/usr/bin/env bash
# Session 34, device call 4: the 16-row fp8 kernel's fused combine (Fp8Config.fused_combine), whose cubins
# call 3 lacked: its GPU tests (every fp8 case with it, its counters across launches), then the sweep of
# the default config against it, both orders in one process, per-tensor fp8 and fp8_ds_mla.
#
#   bash benchmarks/results/session34/call4.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp PYTHONUNBUFFERED=1
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
source benchmarks/results/session21/step.sh
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$OUT/0-gpu.log" 2>&1
cat "$OUT/0-gpu.log"
step 1-tests 120 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 8 -rfE tests/test_cutlass_fp8.py tests/test_cutlass_backend.py
grep -E "passed|failed" "$OUT/1-tests.log" | tail -n 3
step 2-fp8-fused 100 "$root" python3 benchmarks/sweep_cutlass_fp8.py --shapes 64x4096x16,128x8192x16,128x4096x16,1x32768x16 \
    --formats fp8,fp8_ds_mla --configs 2x1x2x4,2x1x2x4c,2x1x2x4c,2x1x2x4
grep -E "^## |^\| [0-9]|copy|Error" "$OUT/2-fp8-fused.log"
