#!/usr/bin/env bash
# One device call on the H200: GPU-marked tests, then benchmark suites, then the demo. Every step is
# logged to $OUT; a failing step does not stop the next ones; the exit code is non-zero if any
# step failed.
#
#   bash benchmarks/run_h200.sh [tests] [SUITE-SPEC ...] [demo]
#
# A SUITE-SPEC is suite[:layout[:page_size]][+KV][@backends], KV one of fp8, fp8_ds_mla, mxfp4; e.g.
# `deepseek`, `mixed:paged:64`, `deepseek:ragged:1@triton,tilecpp`, `deepseek+fp8`, `deepseek+mxfp4`. Results land in benchmarks/results/<suite>/,
# which the repository commits; $OUT gets results.tar.gz (the results and every step's log).
#
# Step limits (seconds): TESTS_LIMIT (default 330), BENCH_LIMIT (default 300 per suite). Keep their
# sum under the device call's own limit; results are packed after every step, so a call cut short
# loses only the step it was in.
#
# Run from the repository root, with the Tile C++ cubins compiled beforehand (on the CPU
# machine) into .cache/tilecpp and carried along:
#   run(command="bash benchmarks/run_h200.sh tests deepseek", carry=[".cache/tilecpp"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-$PWD/out}"
LOGS="$PWD/device-logs"  # step logs; they travel back inside results.tar.gz ($OUT returns at most 8 files)
mkdir -p "$OUT" "$LOGS" benchmarks/results
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TILEGYM_CACHE_DIR="${TILEGYM_CACHE_DIR:-.cache/tilecpp}"
PY="${PYTHON:-python3}"
failed=()
n=0

# step NAME SECONDS COMMAND...: run with a time limit, tee into $LOGS/NAME.log, remember failures.
step() {
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit}s): $*"
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start))s" | tee -a "$LOGS/$name.log"
    [ "$rc" -eq 0 ] || failed+=("$name (exit $rc)")
    pack
}

# The results and logs so far -> $OUT after every step: a device call that ends early (its own
# time limit) still brings back every step that finished.
pack() { tar czf "$OUT/results.tar.gz" benchmarks/results device-logs; }

bench_step() {
    local spec=$1 suite layout="dense" page=64 kv="" backends="" rest
    rest=${spec%%@*}
    [[ $spec == *@* ]] && backends=${spec#*@}
    [[ $rest == *+* ]] && kv=${rest##*+} && rest=${rest%+*}
    IFS=: read -r suite layout_given page_given <<<"$rest"
    layout=${layout_given:-dense}
    page=${page_given:-64}
    local dir="$suite${kv:+-$kv}"
    [ "$layout" = dense ] || dir="$dir-$layout$page"
    local args=(--suite "$suite" --layout "$layout" --page-size "$page" --out-dir "benchmarks/results/$dir")
    [ -n "$kv" ] && args+=(--kv-dtype "$kv")
    [ -n "$backends" ] && args+=(--backends "$backends")
    n=$((n + 1))
    step "$n-bench-$dir" "${BENCH_LIMIT:-300}" "$PY" -m tilegym bench "${args[@]}"
}

step 0-info 60 bash -c "nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv; $PY -m tilegym info"
for spec in "$@"; do
    case $spec in
    tests)
        n=$((n + 1))
        # addopts has -q; a second -q hides the counts; -rs lists why each test skipped. Four workers share
        # the GPU (the tests are correctness checks, not timings): 135 s on the H200 against > 300 s alone.
        step "$n-gpu-tests" "${TESTS_LIMIT:-330}" "$PY" -m pytest -p no:cacheprovider -m gpu -n 4 -rfEs tests
        cp "$LOGS/$n-gpu-tests.log" benchmarks/results/gpu-tests-h200.log
        ;;
    demo)
        n=$((n + 1))
        step "$n-demo" 120 "$PY" -m tilegym demo
        cp "$LOGS/$n-demo.log" benchmarks/results/demo-h200.log
        ;;
    *) bench_step "$spec" ;;
    esac
done
cp "$LOGS/0-info.log" benchmarks/results/h200-info.log
pack
echo
echo "=== summary"
grep -hE "^(=+ .*(passed|failed|error|skipped).* =+|[0-9]+ (passed|failed|error).*|FAILED|ERROR)" "$LOGS"/*gpu-tests.log 2>/dev/null | tail -30
for table in "$LOGS"/*-bench-*.log; do
    [ -e "$table" ] || continue
    echo "--- $(basename "$table" .log)"
    grep -E "^\| [a-z@0-9]+ \|" "$table" | cut -d'|' -f2-9,12-13,15-18,21 || echo "no results"
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "failed steps: ${failed[*]}"
    exit 1
fi
echo "all steps passed"
