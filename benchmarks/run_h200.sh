#!/usr/bin/env bash
# One device call on the H200 (about 4 min): GPU-marked tests, the deepseek and amd-mixed-mla
# benchmark suites (bf16), the deepseek suite with an fp8 KV cache, and the demo. Every step is
# logged to $OUT; a failing step does not stop the next ones; the exit code is non-zero if any
# step failed.
#
# Run from the repository root, with the Tile C++ cubins compiled beforehand (on the CPU
# machine) into .cache/tilecpp and carried along:
#   run(command="bash benchmarks/run_h200.sh", carry=[".cache/tilecpp"], timeout_s=600)
#
# $OUT gets 7 files: the six step logs (0-info ... 5-demo) and results.tar.gz, the whole of
# benchmarks/results/ (per suite: JSON, CSV, markdown, PNG; plus the GPU test, info and demo
# logs), which is what the repository commits.
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
step 1-gpu-tests 210 "$PY" -m pytest -p no:cacheprovider -m gpu -n 0 -rfEs -v tests
step 2-bench-deepseek 150 "$PY" -m tilegym bench --suite deepseek --out-dir benchmarks/results/deepseek
step 3-bench-amd-mixed-mla 120 "$PY" -m tilegym bench --suite amd-mixed-mla --out-dir benchmarks/results/amd-mixed-mla
step 4-bench-deepseek-fp8 120 "$PY" -m tilegym bench --suite deepseek --kv-dtype fp8 --out-dir benchmarks/results/deepseek-fp8
step 5-demo 120 "$PY" -m tilegym demo
cp "$OUT/1-gpu-tests.log" benchmarks/results/gpu-tests-h200.log
cp "$OUT/0-info.log" benchmarks/results/h200-info.log
cp "$OUT/5-demo.log" benchmarks/results/demo-h200.log

tar czf "$OUT/results.tar.gz" benchmarks/results
echo
echo "=== summary"
grep -E "^(=+ .*(passed|failed|error|skipped).* =+|FAILED|ERROR)" "$OUT/1-gpu-tests.log" | tail -20
for table in deepseek/mla_decoding_split_kv_deepseek_bf16 amd-mixed-mla/mla_decoding_split_kv_amd-mixed-mla_bf16 \
    deepseek-fp8/mla_decoding_split_kv_deepseek_bf16-kvfp8; do
    echo "--- $table"
    grep -E "^\| (backend|[a-z]+ \|)" "benchmarks/results/$table.md" 2>/dev/null |
        cut -d'|' -f2-7,10,12-14,17-19 || echo "no results"
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "failed steps: ${failed[*]}"
    exit 1
fi
echo "all steps passed"
