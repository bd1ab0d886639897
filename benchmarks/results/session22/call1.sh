#!/usr/bin/env bash
# Session 22, device call 1: the wgmma kernel's fp8 variant on the bf16 step order, its fp8 tiles widened by
# the producer warpgroup (the tree of commit fd8da35, run as "."; since reverted, its change is
# variants/fp8-producer-widening.patch), tested, then timed against .ab/main (its parent: the fp8 step order,
# each consumer widening its own block) with benchmarks/ab_trees.py; bf16 timed too (the producer's code
# changed).
#
#   bash benchmarks/results/session22/call1.sh run   # device: carry [".cache/tilecpp", ".ab"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=../session21/step.sh
. benchmarks/results/session21/step.sh

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    local gpu=(-m pytest -p no:cacheprovider -m gpu -n 0)
    local ab=(benchmarks/ab_trees.py .ab/main .)
    nvidia-smi --query-gpu=name,driver_version,clocks.current.sm --format=csv > "$OUT/0-info.log" 2>&1
    step 1-tests 200 . "$py" "${gpu[@]}" tests/test_cutlass_fp8.py tests/test_cutlass_backend.py
    step 2-ab-fp8 150 . "$py" "${ab[@]}" --fp8 --reps 2 --suites many-heads,mtp
    step 3-ab-bf16 150 . "$py" "${ab[@]}" --reps 2 --suites many-heads,mtp
    step 4-ab-fp8-paged 150 . bash -c "$py ${ab[*]} --fp8 --layout paged --page-size 64 --suites many-heads && $py ${ab[*]} --fp8 --layout paged --page-size 16 --suites many-heads"
    step 5-ab-bf16-paged64 90 . "$py" "${ab[@]}" --layout paged --page-size 64 --suites many-heads
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
