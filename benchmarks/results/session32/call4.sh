#!/usr/bin/env bash
# Session 32, device call 4 (a diagnostic; any Hopper GPU, the trees compared within the call): the
# 16-row fp8 cutlass kernel against a build of it that only loads (each stage released as soon as it
# lands, no matmul, no widening; its output is wrong by construction). How far is this kernel's load
# structure (ring, pieces, ends, combine) from issue 13's 85% / 80% of copy bandwidth by itself?
# The loads-only tree is this commit's tilegym/benchmarks with one block added to the kernel's block
# loop (the `DIAGNOSTIC` block quoted in NOTES_cutlass.md, "Session 32"), in .ab/loads (git-ignored);
# both trees' cubins precompiled into .cache/tilecpp (sweep_cutlass_fp8.py --precompile in each).
#
#   bash benchmarks/results/session32/call4.sh   # device: carry [".cache/tilecpp", ".ab/loads"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
source benchmarks/results/session21/step.sh
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$OUT/0-gpu.log" 2>&1
cat "$OUT/0-gpu.log"
args=(benchmarks/sweep_cutlass_fp8.py --shapes 64x4096x16,128x8192x16 --formats fp8,fp8_ds_mla --configs 2x1x2x4)
step 1-main 120 "$root" python3 "${args[@]}"
step 2-loads-only 120 "$root/.ab/loads" python3 "${args[@]}"
step 3-loads-only 120 "$root/.ab/loads" python3 "${args[@]}"
step 4-main 120 "$root" python3 "${args[@]}"
for f in 1-main 2-loads-only 3-loads-only 4-main; do echo "##### $f"; grep -E "^## |^\| [0-9]|copy" "$OUT/$f.log"; done
