#!/usr/bin/env bash
# Session 25, device call 2: tilecpp's segment cost swept on the mixed suite (profiler timeline), then
# through run_h200.sh every GPU test and the suites whose host columns the one-launch schedule changes
# (mixed, deepseek) or whose cutlass rows predate sessions 22-24 (mixed:paged:64), then many-heads.
#
#   bash benchmarks/results/session25/call2.sh run   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=../session21/step.sh
. benchmarks/results/session21/step.sh

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    export -f sweep
    export py
    step 1-tilecpp-sweep 80 . bash -c 'sweep tilecpp bf16 256 512 768 1024'
    BENCH_LIMIT=95 bash benchmarks/run_h200.sh tests mixed deepseek mixed:paged:64 many-heads > "$OUT/2-run.log" 2>&1
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
