#!/usr/bin/env bash
# Session 41, device call 3 (H200): main with two row tiles and the 16-byte widening: the cutlass fp8
# GPU tests, then the suites whose rows those changes move, the demo, and every backend's many-heads
# and mtp rows (session 40's H200 call ran them without tilecpp). Results in results.tar.gz.
#
#   bash benchmarks/results/session41/call3.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
step 1-cutlass-tests 100 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 4 -rfEs tests/test_cutlass_fp8.py
echo "cutlass tests: exit $step_rc, $(grep -o '\.' "$OUT/1-cutlass-tests.log" | wc -l) dots"
BENCH_LIMIT=60 bash benchmarks/run_h200.sh mtp+fp8 many-heads+fp8 quantized+fp8 demo many-heads mtp \
    > "$OUT/2-suites.log" 2>&1
grep -E "^=== " "$OUT/2-suites.log"
