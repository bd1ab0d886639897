#!/usr/bin/env bash
# Session 21, device call 1: the GPU tests of the Triton backend after session 20's interpreter
# rounding change (.ab/main = HEAD), the wgmma kernel's refills as one TMA box per side
# (.ab/4d: a 4-D latent map [units, 8 tiles, rows, 64 columns]) timed against main and tested, and
# session 20's step timeline (.ab/trace, made by results/session20/step_trace.py prepare).
#
#   bash benchmarks/results/session21/call1.sh run   # device: carry [".cache/tilecpp", ".ab"]
# The trees: .ab/main from `git archive HEAD`, .ab/4d from the branch with the change, cubins by
# `python .ab/ab_split.py --precompile .ab/main .ab/4d` (this folder's ab_split.py copied to .ab/).
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=step.sh
. benchmarks/results/session21/step.sh

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    local gpu=(-m pytest -p no:cacheprovider -m gpu -n 0 -q)
    nvidia-smi --query-gpu=name,driver_version,clocks.current.sm --format=csv > "$OUT/0-info.log" 2>&1
    step 1-4d-tests 120 .ab/4d "$py" "${gpu[@]}" -x tests/test_cutlass_backend.py
    step 2-ab-dense 150 . "$py" .ab/ab_split.py --reps 2 --suites many-heads,mtp .ab/main .ab/4d
    step 3-ab-paged64 70 . "$py" .ab/ab_split.py --reps 1 --layout paged --page-size 64 --suites many-heads .ab/main .ab/4d
    step 4-trace 60 . "$py" benchmarks/results/session20/step_trace.py run
    step 5-triton-tests 150 .ab/main "$py" "${gpu[@]}" -k triton tests
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
