#!/usr/bin/env bash
# Session 24, device call 1: every GPU-marked test (the schedule's pieces now have explicit bounds in every
# backend), then the schedule's segment cost swept on the mixed-length suite with the profiler timeline:
# cutlass (bf16, two rounds in opposite orders; fp8), triton and tilecpp, costs in tokens.
#
#   bash benchmarks/results/session24/call1.sh run   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=../session21/step.sh
. benchmarks/results/session21/step.sh

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    nvidia-smi --query-gpu=name,driver_version,clocks.current.sm --format=csv > "$OUT/0-info.log" 2>&1
    step 1-tests 200 . "$py" -m pytest -p no:cacheprovider -m gpu -n 0 -q tests
    export -f sweep
    export py
    step 2-cutlass 170 . bash -c 'sweep cutlass bf16 0 128 256 384 && sweep cutlass bf16 384 256 128 0'
    step 3-cutlass-fp8 60 . bash -c 'sweep cutlass fp8 0 128 256'
    step 4-triton-tilecpp 150 . bash -c 'sweep triton bf16 0 64 128 256 && sweep tilecpp bf16 0 64 128 256'
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
