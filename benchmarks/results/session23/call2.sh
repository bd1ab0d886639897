#!/usr/bin/env bash
# Session 23, device call 2: the one-wave combine (several query rows per CTA), the snapped schedule of
# cluster pairs, and the split kernel of a CTA alone as a programmatic dependent launch, against
# .ab/main (session 22's HEAD), each tree in its own process (the combine and the schedule are not
# swapped by ab_trees.py), order alternating; then the cutlass GPU tests on this tree.
#
#   bash benchmarks/results/session23/call2.sh run   # device: carry [".cache/tilecpp", ".ab"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=../session21/step.sh
. benchmarks/results/session21/step.sh

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    local timeline=$PWD/benchmarks/timeline.py
    nvidia-smi --query-gpu=name,driver_version,clocks.current.sm --format=csv > "$OUT/0-info.log" 2>&1
    step 1-tests 110 . "$py" -m pytest -p no:cacheprovider -m gpu -n 0 -q tests/test_cutlass_fp8.py tests/test_cutlass_backend.py
    step 2-main-a 80 .ab/main "$py" "$timeline" --suites deepseek,mixed
    step 3-new-a 80 . "$py" "$timeline" --suites deepseek,mixed
    step 4-new-b 80 . "$py" "$timeline" --suites deepseek,mixed
    step 5-main-b 80 .ab/main "$py" "$timeline" --suites deepseek,mixed
    step 6-fp8-main 50 .ab/main "$py" "$timeline" --kv fp8 --suites quantized
    step 7-fp8-new 50 . "$py" "$timeline" --kv fp8 --suites quantized
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
