#!/usr/bin/env bash
# Session 22, device call 5: the L2 hint as kept (evict_first for the cache loads of a CTA alone, evict_normal
# for a cluster pair, whose partner re-reads the blocks): the cutlass GPU tests, a same-process A/B at 64-128
# heads against .ab/main (no hint), then the suites whose cutlass rows it changes (benchmarks/run_h200.sh).
#
#   bash benchmarks/results/session22/call5.sh run   # device: carry [".cache/tilecpp", ".ab"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=../session21/step.sh
. benchmarks/results/session21/step.sh

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    nvidia-smi --query-gpu=name,driver_version,clocks.current.sm --format=csv > "$OUT/0-info.log" 2>&1
    step 1-tests 120 . "$py" -m pytest -p no:cacheprovider -m gpu -n 0 -q tests/test_cutlass_fp8.py tests/test_cutlass_backend.py
    step 2-ab-bf16 80 . "$py" benchmarks/ab_trees.py .ab/main . --reps 2 --suites many-heads
    BENCH_LIMIT=100 bash benchmarks/run_h200.sh deepseek many-heads mtp quantized quantized+fp8 mixed many-heads+fp8 mtp+fp8
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
