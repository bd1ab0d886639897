#!/usr/bin/env bash
# Session 25, device call 3: tilecpp's segment cost, second round in the opposite order; a profile of
# plan building; then the mixed suite with the final costs and the paged reports left from before
# sessions 22-24.
#
#   bash benchmarks/results/session25/call3.sh run   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=../session21/step.sh
. benchmarks/results/session21/step.sh

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    export -f sweep
    export py
    step 1-tilecpp-sweep 80 . bash -c 'sweep tilecpp bf16 1024 768 512'
    step 2-plan-profile 60 . "$py" benchmarks/results/session25/plan_profile.py
    BENCH_LIMIT=120 bash benchmarks/run_h200.sh mixed deepseek:paged:64 > "$OUT/3-run.log" 2>&1
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
