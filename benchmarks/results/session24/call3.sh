#!/usr/bin/env bash
# Session 24, device call 3: the tilecpp case whose test did not finish in call 2, alone at segment costs
# 0 and 256 tokens (40 s watchdog each); the GPU-marked tests file by file (that case deselected); the
# mixed and many-heads suites with the costs chosen from calls 1-2.
#
#   bash benchmarks/results/session24/call3.sh run   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=../session21/step.sh
. benchmarks/results/session21/step.sh

diagnose() {
    for cost in 0 256; do
        echo "--- segment cost $cost"
        timeout 60 "$py" benchmarks/results/session24/tilecpp_case.py "$cost" 2>&1 | cut -c1-600
    done
}

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    nvidia-smi --query-gpu=name,driver_version,clocks.current.sm --format=csv > "$OUT/0-info.log" 2>&1
    export -f diagnose
    export py
    step 1-diagnose 100 . bash -c diagnose
    local skip='not (tilecpp and B8H128S8192)'
    step 2-tests-cutlass 100 . "$py" -m pytest -p no:cacheprovider -m gpu -n 0 -q tests/test_cutlass_backend.py tests/test_cutlass_fp8.py
    step 3-tests-rest 170 . "$py" -m pytest -p no:cacheprovider -m gpu -n 0 -q -k "$skip" tests --ignore=tests/test_cutlass_backend.py --ignore=tests/test_cutlass_fp8.py
    BENCH_LIMIT=95 bash benchmarks/run_h200.sh mixed many-heads
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
