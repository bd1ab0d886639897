#!/usr/bin/env bash
# Session 19, device call 2: the lazy frame (.ab/lazy: O rescaled only when a row's max rises by more
# than 2^8) tested and timed against main, and the no-loads diagnostic taken apart (which part of a
# step holds the wgmma kernel when nothing is loaded). Trees from make_trees.py.
#
#   bash benchmarks/results/session19/next_call.sh prepare   # CPU machine: trees and cubins
#   bash benchmarks/results/session19/next_call.sh run       # device: carry [".cache/tilecpp", ".ab"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=benchmarks/results/session19
py=${PYTHON:-python3}
diag=(.ab/noloads .ab/noloads-noscale .ab/noloads-noexp .ab/noloads-nopv .ab/noloads-nos)

prepare() {
    "$py" "$here/make_trees.py" || return 1
    export TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    PYTHONPATH=. "$py" .ab/ab_split.py --precompile .ab/lazy "${diag[@]:1}"
    (cd .ab/lazy && PYTHONPATH=. "$py" -m tilegym precompile --arch sm_90 --backend cutlass | tail -n 1)
}

step() {  # NAME SECONDS DIR COMMAND...
    local name=$1 limit=$2 dir=$3
    shift 3
    echo "=== $name ($dir, limit ${limit}s)"
    local start=$SECONDS
    (cd "$dir" && PYTHONPATH=. timeout --kill-after=5 "$limit" "$@") > "$OUT/$name.log" 2>&1
    echo "=== $name: exit $? after $((SECONDS - start))s ($(tail -n 1 "$OUT/$name.log"))"
}

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    local gpu=(-m pytest -p no:cacheprovider -m gpu -n 0 -q)
    step 1-main-grow-test 40 .ab/main "$py" "${gpu[@]}" tests/test_cutlass_backend.py -k grow
    step 2-lazy-tests 150 .ab/lazy "$py" "${gpu[@]}" tests/test_cutlass_backend.py
    step 3-lazy-ab 150 . "$py" .ab/ab_split.py --reps 2 --suites many-heads,mtp .ab/main .ab/lazy
    step 4-noloads-parts 150 . "$py" .ab/ab_split.py --suites many-heads .ab/main "${diag[@]}"
}

case ${1:-} in
prepare) prepare ;;
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
