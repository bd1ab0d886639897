#!/usr/bin/env bash
# Session 24, device call 2: every GPU-marked test with the segment costs set from call 1, then the sweep
# continued past call 1's best costs (cutlass bf16 in both orders, cutlass fp8, tilecpp).
#
#   bash benchmarks/results/session24/call2.sh run   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=../session21/step.sh
. benchmarks/results/session21/step.sh

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    nvidia-smi --query-gpu=name,driver_version,clocks.current.sm --format=csv > "$OUT/0-info.log" 2>&1
    step 1-tests 300 . "$py" -m pytest -p no:cacheprovider -m gpu -n 0 -q tests
    export -f sweep
    export py
    step 2-cutlass 120 . bash -c 'sweep cutlass bf16 256 384 512 640 && sweep cutlass bf16 640 512 384 256'
    step 3-cutlass-fp8 40 . bash -c 'sweep cutlass fp8 256 384 512'
    step 4-tilecpp 50 . bash -c 'sweep tilecpp bf16 256 384 512'
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
