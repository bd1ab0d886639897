#!/usr/bin/env bash
# Session 35, device call 2: every GPU test (the test helpers now reject mismatched shapes, and the fp8
# fused combine is gone), then, on an H200 only, the fp8 suites the README's targets quote.
#
#   bash benchmarks/results/session35/call2.sh   # device: carry [".cache/tilecpp"], timeout 600
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp PYTHONUNBUFFERED=1 PYTHONPATH=$root
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
source benchmarks/results/session21/step.sh
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$OUT/0-gpu.log" 2>&1
cat "$OUT/0-gpu.log"
step 1-gpu-tests 300 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 8 -rfE tests
grep -E "passed|failed" "$OUT/1-gpu-tests.log" | tail -n 3
if grep -q H200 "$OUT/0-gpu.log"; then
    BENCH_LIMIT=120 bash benchmarks/run_h200.sh quantized+fp8 quantized+fp8_ds_mla
else
    echo "not an H200: the fp8 suites are skipped"
fi
