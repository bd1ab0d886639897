#!/usr/bin/env bash
# Session 21, device call 2: the wgmma kernel's bf16/fp16 loads issued by a third, producer warpgroup
# (.ab/prod: setmaxnreg 240 / 24, consumers release each (buffer, side) on an mbarrier; on top of
# .ab/4d's one TMA box per side), tested and timed against .ab/main and .ab/4d.
#
#   bash benchmarks/results/session21/call2.sh run   # device: carry [".cache/tilecpp", ".ab"]
# Trees and cubins as in call1.sh, plus .ab/prod from the producer branch.
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=step.sh
. benchmarks/results/session21/step.sh

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    local gpu=(-m pytest -p no:cacheprovider -m gpu -n 0 -q)
    nvidia-smi --query-gpu=name,driver_version,clocks.current.sm --format=csv > "$OUT/0-info.log" 2>&1
    step 1-prod-tests 150 .ab/prod "$py" "${gpu[@]}" -x tests/test_cutlass_backend.py tests/test_layouts.py -k "cutlass"
    step 2-ab-dense 200 . "$py" .ab/ab_split.py --reps 2 --suites many-heads,mtp .ab/main .ab/4d .ab/prod
    step 3-ab-paged64 90 . "$py" .ab/ab_split.py --reps 1 --layout paged --page-size 64 --suites many-heads .ab/main .ab/prod
    step 4-ab-paged16 90 . "$py" .ab/ab_split.py --reps 1 --layout paged --page-size 16 --suites many-heads .ab/main .ab/prod
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
