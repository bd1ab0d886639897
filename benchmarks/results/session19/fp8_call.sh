#!/usr/bin/env bash
# Session 19, device call 6: the lagging max frame in the fp8 step order (.ab/fp8lazy, made by hand
# from HEAD: the same five edits as the bf16 order's, see NOTES_cutlass.md) tested and timed against
# HEAD (.ab/main). Run with carry [".cache/tilecpp", ".ab"]; logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
step() {  # NAME SECONDS DIR COMMAND...
    local name=$1 limit=$2 dir=$3
    shift 3
    local start=$SECONDS
    (cd "$dir" && PYTHONPATH=. timeout --kill-after=5 "$limit" "$@") > "$OUT/$name.log" 2>&1
    echo "=== $name: exit $? after $((SECONDS - start))s ($(tail -n 1 "$OUT/$name.log"))"
}
gpu=(-m pytest -p no:cacheprovider -m gpu -n 0 -q)
step 1-main-fp8-grow 40 .ab/main "$py" "${gpu[@]}" tests/test_cutlass_fp8.py -k grow
step 2-fp8lazy-tests 120 .ab/fp8lazy "$py" "${gpu[@]}" tests/test_cutlass_fp8.py tests/test_cutlass_backend.py
step 3-fp8lazy-ab 90 . "$py" .ab/ab_split.py --fp8 --reps 2 --suites many-heads .ab/main .ab/fp8lazy
