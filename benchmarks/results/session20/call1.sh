#!/usr/bin/env bash
# Session 20, device call 1: the score scale folded into the exponent and masks only on blocks that
# reach past a row's limit (.ab/fold = the working tree), and the same with the bf16 cache taking the
# fp8 step order (.ab/foldorder), timed against main (.ab/main = HEAD) and tested.
#
#   bash benchmarks/results/session20/call1.sh prepare   # CPU machine: trees and cubins
#   bash benchmarks/results/session20/call1.sh run       # device: carry [".cache/tilecpp", ".ab"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

prepare() {
    rm -rf .ab && mkdir -p .ab/main .ab/fold
    git archive HEAD pyproject.toml tilegym benchmarks tests | tar -x -C .ab/main
    git ls-files pyproject.toml tilegym benchmarks tests | tar -cf - -T - | tar -x -C .ab/fold
    cp benchmarks/results/session15/ab_split.py .ab/
    cp -r .ab/fold .ab/foldorder
    "$py" - <<'PY'
from pathlib import Path
p = Path(".ab/foldorder/tilegym/ops/cutlass/mla_decoding_split_kv.cuh")
t = p.read_text()
for old, new in [
    ("    if constexpr (kFp8 != 0) {\n      // fp8 caches:", "    if constexpr (true) {\n      // fp8 caches:"),
    ("        widen_fp8_tiles<n>(smem, buf, t0, wg, wt);\n", "        if constexpr (kFp8 != 0) widen_fp8_tiles<n>(smem, buf, t0, wg, wt);\n"),
]:
    assert t.count(old) == 1, old
    t = t.replace(old, new)
p.write_text(t)
PY
    export TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    PYTHONPATH=. "$py" .ab/ab_split.py --precompile .ab/main .ab/fold .ab/foldorder
    for t in fold foldorder; do (cd .ab/$t && PYTHONPATH=. "$py" -m tilegym precompile --arch sm_90 --backend cutlass | tail -n 1); done
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
    step 1-bf16-ab 170 . "$py" .ab/ab_split.py --reps 2 --suites many-heads,mtp .ab/main .ab/fold .ab/foldorder
    step 2-fp8-ab 110 . "$py" .ab/ab_split.py --fp8 --reps 2 --suites many-heads,mtp .ab/main .ab/fold
    step 3-fold-tests 170 .ab/fold "$py" "${gpu[@]}" tests/test_cutlass_backend.py tests/test_cutlass_fp8.py
    step 4-foldorder-tests 100 .ab/foldorder "$py" "${gpu[@]}" tests/test_cutlass_backend.py
}

case ${1:-} in
prepare) prepare ;;
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
