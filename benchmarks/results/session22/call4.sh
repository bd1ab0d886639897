#!/usr/bin/env bash
# Session 22, device call 4: every cache load of the cutlass kernels with an L2 evict-first hint (this tree)
# against .ab/main (HEAD: no hint), same process per table (benchmarks/ab_trees.py, the wgmma kernel), and the
# fp8 16-row kernel through the bench in each tree in turn; the cutlass GPU tests in this tree.
#
#   bash benchmarks/results/session22/call4.sh run   # device: carry [".cache/tilecpp", ".ab"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=../session21/step.sh
. benchmarks/results/session21/step.sh

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    local ab=(benchmarks/ab_trees.py .ab/main .)
    local fp8=(-m tilegym bench --suite quantized --kv-dtype fp8 --backends cutlass --no-plot)
    step 1-tests 200 . "$py" -m pytest -p no:cacheprovider -m gpu -n 0 -q tests/test_cutlass_fp8.py tests/test_cutlass_backend.py
    step 2-ab-bf16 150 . "$py" "${ab[@]}" --reps 2 --suites many-heads,deepseek,mtp
    step 3-ab-bf16-paged64 90 . "$py" "${ab[@]}" --layout paged --page-size 64 --suites many-heads
    step 4-ab-fp8 90 . "$py" "${ab[@]}" --fp8 --suites many-heads
    step 5-fp8-16rows-main 90 .ab/main "$py" "${fp8[@]}" --out-dir /tmp/q-main-1
    step 6-fp8-16rows-evict 90 . "$py" "${fp8[@]}" --out-dir /tmp/q-evict-1
    step 7-fp8-16rows-main 90 .ab/main "$py" "${fp8[@]}" --out-dir /tmp/q-main-2
    step 8-fp8-16rows-evict 90 . "$py" "${fp8[@]}" --out-dir /tmp/q-evict-2
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
