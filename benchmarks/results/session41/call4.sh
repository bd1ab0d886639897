#!/usr/bin/env bash
# Session 41, device call 4 (any Hopper): two row tiles for fp8_ds_mla (17-32 query rows; before, cutlass
# refused them and `auto` took triton): the cutlass fp8 GPU tests (the new fp8_ds_mla two-tile cases
# among them), then the `mtp` suite with an fp8_ds_mla cache, cutlass beside triton.
#
#   bash benchmarks/results/session41/call4.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
step 1-cutlass-fp8-tests 100 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 4 -rfEs tests/test_cutlass_fp8.py
BENCH_LIMIT=60 bash benchmarks/run_h200.sh "mtp+fp8_ds_mla@cutlass,triton" > "$OUT/2-suites.log" 2>&1
grep -E "^=== " "$OUT/2-suites.log"
grep -E "^\| (cutlass|triton) " benchmarks/results/mtp-fp8_ds_mla/*.md | cut -d'|' -f2-7,13-15,24
