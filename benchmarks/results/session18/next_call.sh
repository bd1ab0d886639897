#!/usr/bin/env bash
# The device call session 18 prepared but could not run (no device time left): GPU tests and
# same-call timings of the row-flag combine (variants/row-flag-combine.diff) and of the no-loads
# diagnostic (variants/diagnostic-no-loads.diff) against the tree they were made from.
#
#   bash benchmarks/results/session18/next_call.sh prepare   # CPU machine: trees in .ab/, cubins in .cache/tilecpp
#   bash benchmarks/results/session18/next_call.sh run       # device: carry [".cache/tilecpp", ".ab"], timeout 600
#
# Every step has its own limit (their sum stays under 600 s) and leaves its log in $OUT at once.
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=benchmarks/results/session18
py=${PYTHON:-python3}

prepare() {
    rm -rf .ab/main .ab/flags .ab/noloads
    mkdir -p .ab/main .ab/flags .ab/noloads
    for tree in main flags noloads; do git archive HEAD pyproject.toml tilegym benchmarks tests | tar -x -C ".ab/$tree"; done
    # patch, not git apply: inside this repository git apply would resolve the paths from its root
    patch -s -d .ab/flags -p1 < "$here/variants/row-flag-combine.diff" || return 1
    patch -s -d .ab/noloads -p1 < "$here/variants/diagnostic-no-loads.diff" || return 1
    cp "$here/../session15/ab_split.py" .ab/
    export TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    for tree in main flags; do
        (cd ".ab/$tree" && PYTHONPATH=. "$py" -m tilegym precompile --arch sm_90 --backend cutlass | tail -n 1)
    done
    PYTHONPATH=. "$py" .ab/ab_split.py --precompile .ab/main .ab/noloads  # the headers as step 5 builds them
}

# step NAME SECONDS DIR COMMAND...: run COMMAND in DIR with a limit, log to $OUT/NAME.log.
step() {
    local name=$1 limit=$2 dir=$3
    shift 3
    echo "=== $name ($dir, limit ${limit}s)"
    (cd "$dir" && PYTHONPATH=. timeout --kill-after=5 "$limit" "$@") > "$OUT/$name.log" 2>&1
    echo "=== $name: exit $? ($(tail -n 1 "$OUT/$name.log"))"
}

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    local gpu=(-m pytest -p no:cacheprovider -m gpu -n 0 -q -x)
    step 1-flags-test 60 .ab/flags "$py" "${gpu[@]}" tests/test_cutlass_backend.py -k row_flags
    step 2-flags-tests 180 .ab/flags "$py" "${gpu[@]}" tests/test_cutlass_backend.py tests/test_cutlass_fp8.py
    for tree in main flags; do
        step "3-$tree-fp8" 60 ".ab/$tree" "$py" -m tilegym bench --suite quantized --kv-dtype fp8 \
            --backends cutlass --out-dir "/tmp/$tree-fp8" --no-plot
        step "4-$tree-many-heads" 50 ".ab/$tree" "$py" -m tilegym bench --suite many-heads --backends cutlass \
            --out-dir "/tmp/$tree-many-heads" --no-plot
    done
    step 5-noloads 90 . "$py" .ab/ab_split.py --suites many-heads .ab/main .ab/noloads
}

case ${1:-} in
prepare) prepare ;;
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
