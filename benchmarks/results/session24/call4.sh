#!/usr/bin/env bash
# Session 24, device call 4: the tilecpp split kernel that did not finish, in two trees: .ab/head (the
# kernel that skips an empty row with a branch: commit 2681bcb) and this
# tree (no branch: an empty row's pass runs no step and stores nothing); then tilecpp's GPU tests and the
# GPU tests that calls 2-3 did not reach.
#
#   bash benchmarks/results/session24/call4.sh run   # device: carry [".cache/tilecpp", ".ab/head"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=../session21/step.sh
. benchmarks/results/session21/step.sh

diagnose() {
    for c in "gap16 0" "gap128 0" "parity 256"; do
        for tree in .ab/head .; do
            echo "--- $tree: $c"
            (cd "$tree" && PYTHONPATH=. timeout 45 "$py" benchmarks/results/session24/tilecpp_case.py $c 2>&1 | grep -E "ran|Timeout|Error|piece_bounds")
        done
    done
}

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    nvidia-smi --query-gpu=name,driver_version,clocks.current.sm --format=csv > "$OUT/0-info.log" 2>&1
    export -f diagnose
    export py
    step 1-diagnose 150 . bash -c diagnose
    step 2-tests 120 . "$py" -m pytest -p no:cacheprovider -m gpu -n 0 -q -k "(tilecpp or reliability or triton_backend or mxfp4) and not B8H128S8192" tests
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
