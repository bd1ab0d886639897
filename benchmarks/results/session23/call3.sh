#!/usr/bin/env bash
# Session 23, device call 3: the cutlass GPU tests; the combine's rows per CTA, at most 4 (one per warp)
# against 32 (about one wave), on the many-heads and mixed suites, order alternating; then the suites whose cutlass rows
# this session's changes move (benchmarks/run_h200.sh).
#
#   bash benchmarks/results/session23/call3.sh run   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=../session21/step.sh
. benchmarks/results/session21/step.sh

combine_rows() {
    for rows in 4 32 32 4; do
        echo "--- at most $rows query rows per combine CTA"
        "$py" benchmarks/timeline.py --suites many-heads,mixed --combine-rows "$rows" 2>&1 | grep period
    done
}

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    nvidia-smi --query-gpu=name,driver_version,clocks.current.sm --format=csv > "$OUT/0-info.log" 2>&1
    step 1-tests 110 . "$py" -m pytest -p no:cacheprovider -m gpu -n 0 -q tests/test_cutlass_fp8.py tests/test_cutlass_backend.py
    export -f combine_rows
    export py
    step 2-combine-rows 130 . bash -c combine_rows
    BENCH_LIMIT=100 bash benchmarks/run_h200.sh deepseek many-heads mtp quantized quantized+fp8 mixed many-heads+fp8 mtp+fp8
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
