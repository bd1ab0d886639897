#!/usr/bin/env bash
# Session 21, device call 4: the producer warpgroup for the fp8 step order too (.ab/fp8prod: 384
# threads for every wgmma variant, the fp8 consumers release their buffer sides), tested and timed
# against .ab/main (HEAD: the producer for bf16/fp16 only).
#
#   bash benchmarks/results/session21/call4.sh run   # device: carry [".cache/tilecpp", ".ab"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=step.sh
. benchmarks/results/session21/step.sh

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    local gpu=(-m pytest -p no:cacheprovider -m gpu -n 0)
    nvidia-smi --query-gpu=name,driver_version,clocks.current.sm --format=csv > "$OUT/0-info.log" 2>&1
    step 1-fp8prod-tests 150 .ab/fp8prod "$py" "${gpu[@]}" -x tests/test_cutlass_fp8.py tests/test_cutlass_backend.py
    step 2-ab-fp8 150 . "$py" .ab/ab_split.py --fp8 --reps 2 --suites many-heads .ab/main .ab/fp8prod
    step 3-ab-fp8-paged64 90 . "$py" .ab/ab_split.py --fp8 --reps 1 --layout paged --page-size 64 --suites many-heads .ab/main .ab/fp8prod
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
