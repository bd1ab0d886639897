#!/usr/bin/env bash
# Session 42, device call 1 (any Hopper): fp8_ds_mla on the cutlass backend at 17+ query rows.
# - its two row tiles in the fp8 kernel (17-32 rows, `FP8_DS_MLA_TWO_TILES`, on in this tree; session 41
#   built them and could not run them);
# - the wgmma kernel's new fp8_ds_mla variant (kFp8 = 2: 33-1024 rows, e.g. 64-128 heads; before, those
#   rows ran on triton).
# The cutlass GPU tests (both files), then the suites with an fp8_ds_mla cache, every backend; on an H200
# also main's other suites (the README's tables come from H200 runs). Results in results.tar.gz.
#
#   bash benchmarks/results/session42/call1.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
step 1-cutlass-tests 220 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 4 -rfEs tests/test_cutlass_fp8.py tests/test_cutlass_backend.py
suites=("quantized+fp8_ds_mla" "mtp+fp8_ds_mla" "many-heads+fp8_ds_mla" "quantized:paged:64+fp8_ds_mla")
grep -q H200 "$OUT/0-gpu.log" && suites+=(many-heads mtp mtp+fp8 quantized+fp8 demo)
BENCH_LIMIT=60 bash benchmarks/run_h200.sh "${suites[@]}" > "$OUT/2-suites.log" 2>&1
grep -E "^=== " "$OUT/2-suites.log"
for d in quantized-fp8_ds_mla mtp-fp8_ds_mla many-heads-fp8_ds_mla quantized-fp8_ds_mla-paged64; do
    echo "## $d"
    grep -hE "^\| (cutlass|triton|flashmla) " benchmarks/results/$d/*.md | cut -d'|' -f2-6,9,13,14,16,22
done
