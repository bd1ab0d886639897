#!/usr/bin/env bash
# Session 34, device call 1: Triton's per-tensor fp8 partials in fp16 (session 33's last commit), and the
# cutlass 16-row fp8 kernel combining its split rows itself (Fp8Config.fused_combine), measured (any Hopper GPU).
# 1. the GPU tests of the Triton and fp8 paths (the scaled combine and the fused-combine config are checked
#    against float64 there, the fused combine's counters across launches too);
# 2. a same-call A/B of Triton's fp8 split + combine, this tree against the baseline 044adbb (.ab/base,
#    from benchmarks/ab_build.sh 044adbb .ab/base), order new, base, new, base;
# 3. the cutlass fp8 sweep of the default config against the fused-combine config, one process per round, the
#    order swapped in the second.
#
#   bash benchmarks/results/session34/call1.sh   # device: carry [".cache/tilecpp", ".ab/base"]
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
    tests/test_triton_backend.py tests/test_quantized_caches.py tests/test_parity.py tests/test_cutlass_fp8.py \
    -k "fp8 or triton"
grep -E "passed|failed" "$OUT/1-tests.log" | tail -n 3
args=(benchmarks/sweep_triton_configs.py --shapes 64x4096x16,128x8192x16,128x4096x16 --formats fp8 --configs default)
step 2-new 80 "$root" python3 "${args[@]}" --tree new
step 3-base 80 "$root/.ab/base" python3 "${args[@]}" --tree base
step 4-new 80 "$root" python3 "${args[@]}" --tree new
step 5-base 80 "$root/.ab/base" python3 "${args[@]}" --tree base
for f in 2-new 3-base 4-new 5-base; do echo "##### $f"; grep -E "^## |^\| |copy" "$OUT/$f.log" | grep -v "^|--"; done
fp8=(benchmarks/sweep_cutlass_fp8.py --shapes 64x4096x16,128x8192x16,128x4096x16 --formats fp8,fp8_ds_mla)
step 6-fused 100 "$root" python3 "${fp8[@]}" --configs 2x1x2x4,2x1x2x4c
step 7-fused 100 "$root" python3 "${fp8[@]}" --configs 2x1x2x4c,2x1x2x4
for f in 6-fused 7-fused; do echo "##### $f"; grep -E "^## |^\| [0-9]|copy" "$OUT/$f.log"; done
