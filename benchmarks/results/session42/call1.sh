#!/usr/bin/env bash
# Session 42, device call 1 (any Hopper; it got an H100, results in call1-h100/): fp8_ds_mla on the cutlass
# backend at 17+ query rows, both routes off in the library until this ran (on since it passed):
# - its two row tiles in the fp8 kernel (17-32 rows, `FP8_DS_MLA_TWO_TILES`; built in session 41);
# - the wgmma kernel's fp8_ds_mla variant (kFp8 = 2, `FP8_DS_MLA_WIDE`: 33-1024 rows, e.g. 64-128 heads,
#   which run on triton without it; built in session 42).
# The cutlass GPU tests (both files; their fp8_ds_mla cases turn the switches on), then the suites with an
# fp8_ds_mla cache, every backend, from a copy of the tree with both switches on (.ab/on: the same
# cubins, the switches are host-side); on an H200 also main's other suites. Results in results.tar.gz.
#
#   bash benchmarks/results/session42/call1.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
# LEAN=1 (little device time left): only the fp8_ds_mla tests, and two suites.
if [ "${LEAN:-0}" = 1 ]; then
    step 1-cutlass-tests 150 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 4 -rfEs tests/test_cutlass_fp8.py -k fp8_ds_mla
else
    step 1-cutlass-tests 220 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 4 -rfEs tests/test_cutlass_fp8.py tests/test_cutlass_backend.py
fi
rm -rf .ab/on && mkdir -p .ab/on && cp -r tilegym benchmarks .ab/on/
sed -i -e 's/^FP8_DS_MLA_TWO_TILES = False/FP8_DS_MLA_TWO_TILES = True/' -e 's/^FP8_DS_MLA_WIDE = False/FP8_DS_MLA_WIDE = True/' \
    .ab/on/tilegym/ops/cutlass/mla_decoding_split_kv.py
grep -E "^FP8_DS_MLA_(TWO_TILES|WIDE) =" .ab/on/tilegym/ops/cutlass/mla_decoding_split_kv.py
suites=("quantized+fp8_ds_mla" "mtp+fp8_ds_mla" "many-heads+fp8_ds_mla" "quantized:paged:64+fp8_ds_mla")
[ "${LEAN:-0}" = 1 ] && suites=("mtp+fp8_ds_mla@cutlass,triton" "quantized+fp8_ds_mla@cutlass,triton")
(cd .ab/on && BENCH_LIMIT=60 bash benchmarks/run_h200.sh "${suites[@]}") > "$OUT/2-suites.log" 2>&1
grep -E "^=== " "$OUT/2-suites.log"
for d in quantized-fp8_ds_mla mtp-fp8_ds_mla many-heads-fp8_ds_mla quantized-fp8_ds_mla-paged64; do
    echo "## $d"
    grep -hE "^\| (cutlass|triton) " .ab/on/benchmarks/results/$d/*.md | cut -d'|' -f2-6,9,13,14,16,22
done
if [ "${LEAN:-0}" != 1 ] && grep -q H200 "$OUT/0-gpu.log"; then
    mkdir -p "$OUT/main"
    OUT=$OUT/main BENCH_LIMIT=60 bash benchmarks/run_h200.sh many-heads mtp mtp+fp8 quantized+fp8 demo > "$OUT/3-suites.log" 2>&1
    grep -E "^=== " "$OUT/3-suites.log"
fi
