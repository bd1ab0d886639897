#!/usr/bin/env bash
# Session 36, device call 2: call 1 cut down to what the device time left allows (~300 s after failed
# starts): the fp8 kernel's default against three warpgroups sharing a ring, with and without snapped
# pieces (Fp8Config.snap, host only), at long equal rows; then the snapped pieces' GPU test.
#
#   bash benchmarks/results/session36/call2.sh   # device: carry [".cache/tilecpp"], timeout 200
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
step 1-fp8-long 110 "$root" python3 benchmarks/sweep_cutlass_fp8.py \
    --shapes 128x8192x16,128x4096x16 --formats fp8,fp8_ds_mla \
    --configs 2x1x2x4,2x1x2x4x0x0.04,4x3x1x4x0x0.04,4x3x1x4
grep -E "^## |^\| [0-9]|copy|Error" "$OUT/1-fp8-long.log"
step 2-snap-tests 50 "$root" python3 -m pytest -p no:cacheprovider -m gpu -rfEs tests/test_cutlass_fp8.py -k snapped
tail -n 3 "$OUT/2-snap-tests.log"
