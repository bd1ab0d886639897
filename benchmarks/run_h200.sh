#!/usr/bin/env bash
# One device call on the H200 (<= 9 min): GPU-marked tests, then the deepseek and
# amd-mixed-mla benchmark suites. Every step is logged to $OUT; a failing step does not
# stop the next ones; the exit code is non-zero if any step failed.
#
# Run from the repository root, with the Tile C++ cubins compiled beforehand (on the CPU
# machine) into .cache/tilecpp and carried along:
#   run(command="bash benchmarks/run_h200.sh", carry=[".cache/tilecpp"], timeout_s=600)
#
# $OUT gets (<= 8 files): 0-info.log, 1-gpu-tests.log, 2-bench-deepseek.log,
# 3-bench-amd-mixed-mla.log, 4-bench-quick-fp8.log (if time is left), results.tar.gz
# (benchmarks/results/), and the two bf16 markdown tables. Results also stay in
# benchmarks/results/<suite>/ (JSON, CSV, markdown, PNG).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT" benchmarks/results
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TILEGYM_CACHE_DIR="${TILEGYM_CACHE_DIR:-.cache/tilecpp}"
PY="${PYTHON:-python3}"
failed=()

# step NAME SECONDS COMMAND...: run with a time limit, tee into $OUT/NAME.log, remember failures.
step() {
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit}s): $*"
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start))s" | tee -a "$OUT/$name.log"
    [ "$rc" -eq 0 ] || failed+=("$name (exit $rc)")
}

step 0-info 60 bash -c "nvidia-smi; $PY -m tilegym info; ls -la \"$TILEGYM_CACHE_DIR\" || true"
step 1-gpu-tests 210 "$PY" -m pytest -p no:cacheprovider -m gpu -n 0 -ra tests
step 2-bench-deepseek 150 "$PY" -m tilegym bench --suite deepseek --out-dir benchmarks/results/deepseek
step 3-bench-amd-mixed-mla 120 "$PY" -m tilegym bench --suite amd-mixed-mla --out-dir benchmarks/results/amd-mixed-mla
# Optional, only if the call has time left (the device call's limit is 600 s): fp8 KV cache.
if [ "$SECONDS" -lt 420 ]; then
    step 4-bench-quick-fp8 90 "$PY" -m tilegym bench --suite quick --kv-dtype fp8 --out-dir benchmarks/results/quick-fp8
else
    echo "=== 4-bench-quick-fp8: skipped, ${SECONDS}s used"
fi

tar czf "$OUT/results.tar.gz" benchmarks/results
for suite in deepseek amd-mixed-mla; do
    cp "benchmarks/results/$suite/mla_decoding_split_kv_${suite}_bf16.md" "$OUT/" 2>/dev/null || true
done

echo
echo "=== summary"
grep -E "^(=+ .*(passed|failed|error|skipped).* =+|FAILED|ERROR)" "$OUT/1-gpu-tests.log" | tail -20
for table in deepseek/mla_decoding_split_kv_deepseek_bf16 amd-mixed-mla/mla_decoding_split_kv_amd-mixed-mla_bf16 \
    quick-fp8/mla_decoding_split_kv_quick_bf16-kvfp8; do
    echo "--- $table"
    grep -E "^\| (backend|[a-z]+ \|)" "benchmarks/results/$table.md" 2>/dev/null |
        cut -d'|' -f2-7,10,12-14,17-19 || echo "no results"
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "failed steps: ${failed[*]}"
    exit 1
fi
echo "all steps passed"
