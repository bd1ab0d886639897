#!/usr/bin/env bash
# Session 34, device call 3 (calls 1 and 2 in one, cut to fit the device time left): any Hopper GPU.
# 1. GPU tests: the cutlass backend (the wgmma kernel's fused combine among them) and its fp8 kernel
#    (every case with the fused-combine config too), and Triton's fp8 paths (its fp16 partials);
# 2. the cutlass fp8 sweep, the default config against the fused-combine one (both orders, one process);
# 3. the profiler timeline of many-heads and deepseek, combine launched (--fused 0) against fused (1);
# 4. Triton's fp8 split + combine, this tree (fp16 partials) against the baseline 044adbb (.ab/base).
#
#   bash benchmarks/results/session34/call3.sh   # device: carry [".cache/tilecpp", ".ab/base"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp PYTHONUNBUFFERED=1
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
source benchmarks/results/session21/step.sh
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$OUT/0-gpu.log" 2>&1
cat "$OUT/0-gpu.log"
step 1-tests 170 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 8 -rfE tests/test_cutlass_backend.py \
    tests/test_cutlass_fp8.py tests/test_quantized_caches.py -k "cutlass or fp8"
grep -E "passed|failed" "$OUT/1-tests.log" | tail -n 3
step 2-fp8-fused 90 "$root" python3 benchmarks/sweep_cutlass_fp8.py --shapes 64x4096x16,128x8192x16,128x4096x16 \
    --formats fp8,fp8_ds_mla --configs 2x1x2x4,2x1x2x4c,2x1x2x4c,2x1x2x4
grep -E "^## |^\| [0-9]|copy" "$OUT/2-fp8-fused.log"
step 3-timeline 130 "$root" python3 benchmarks/timeline.py --suites many-heads,deepseek --fused 0 --fused 1 --rounds 2
grep -E "period|Error" "$OUT/3-timeline.log"
args=(benchmarks/sweep_triton_configs.py --shapes 64x4096x16,128x8192x16 --formats fp8 --configs default)
step 4-triton-new 60 "$root" python3 "${args[@]}" --tree new
step 5-triton-base 60 "$root/.ab/base" python3 "${args[@]}" --tree base
for f in 4-triton-new 5-triton-base; do echo "##### $f"; grep -E "^## |^\| [0-9]|copy" "$OUT/$f.log"; done
