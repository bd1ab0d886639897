#!/usr/bin/env bash
# Session 25, device call 1: the host time of a schedule refresh (one Triton launch against the torch ops)
# and of an eager call without a plan; then every GPU-marked test, four workers, with per-test durations.
#
#   bash benchmarks/results/session25/call1.sh run   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=../session21/step.sh
. benchmarks/results/session21/step.sh

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    nvidia-smi --query-gpu=name,driver_version,clocks.current.sm --format=csv > "$OUT/0-info.log" 2>&1
    step 1-refresh-host 90 . "$py" benchmarks/results/session25/refresh_host.py
    step 2-tests 420 . "$py" -m pytest -p no:cacheprovider -m gpu -n 4 -q --durations=40 tests
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
