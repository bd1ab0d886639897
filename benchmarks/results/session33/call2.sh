#!/usr/bin/env bash
# Session 33, device call 2: fp16 partials for fp8_ds_mla too (call 1 measured per-tensor fp8 on an H100).
# 1. the GPU tests of the cutlass and fp8 paths (the new combine variant is checked against float64 there);
# 2. a same-call A/B of the fp8 kernel, this tree against the baseline 044adbb (.ab/base, from
#    benchmarks/ab_build.sh 044adbb .ab/base), order new, base, new, base (any Hopper GPU);
# 3. on an H200 only: the quantized suites over both fp8 formats and deepseek over fp8 (the README's fp8 figures).
#
#   bash benchmarks/results/session33/call2.sh   # device: carry [".cache/tilecpp", ".ab/base"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp PYTHONUNBUFFERED=1
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
source benchmarks/results/session21/step.sh
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$OUT/0-gpu.log" 2>&1
cat "$OUT/0-gpu.log"
step 1-tests 150 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 4 -rfE \
    tests/test_cutlass_fp8.py tests/test_cutlass_backend.py tests/test_quantized_caches.py
grep -E "passed|failed" "$OUT/1-tests.log" | tail -n 3
args=(benchmarks/sweep_cutlass_fp8.py --shapes 64x4096x16,128x8192x16,128x4096x16 --formats fp8_ds_mla)
step 2-new 90 "$root" python3 "${args[@]}" --configs 2x1x2x4
step 3-base 90 "$root/.ab/base" python3 "${args[@]}" --configs 2x1x2x4
step 4-new 90 "$root" python3 "${args[@]}" --configs 2x1x2x4
step 5-base 90 "$root/.ab/base" python3 "${args[@]}" --configs 2x1x2x4
for f in 2-new 3-base 4-new 5-base; do echo "##### $f"; grep -E "^## |^\| [0-9]|copy" "$OUT/$f.log"; done
case "$(head -n 2 "$OUT/0-gpu.log")" in
*H200*) BENCH_LIMIT=120 bash benchmarks/run_h200.sh quantized+fp8 quantized+fp8_ds_mla deepseek+fp8 2>&1 | grep -E "^===|passed|failed" ;;
*) echo "not an H200: no suite run" ;;
esac
