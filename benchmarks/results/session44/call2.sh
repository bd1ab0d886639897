#!/usr/bin/env bash
# Session 44, device call 2, with the library as committed (the 16-row fp8 kernel now issues a piece's
# first KV copies after its first query loads).
# - On an H200: the per-tensor fp8 and fp8_ds_mla `quantized` suites, the fp8_ds_mla `many-heads` and
#   `mtp` suites (the README's H200 tables still say "not run on the H200 yet" there), bf16 `many-heads`
#   and `mtp+fp8`, cutlass beside triton; the reports are the README's H200 figures.
# - Elsewhere (an H100): the two `quantized` suites only, cutlass beside triton, for the fp8 kernel's
#   figure with same-run ceilings; their reports stay in $OUT/results.tar.gz, not in results/<suite>/.
# Replaces session 43's call 2 (never run), which lacked the per-tensor fp8 `quantized` suite.
#
#   bash benchmarks/results/session44/call2.sh   # carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
suites=("quantized+fp8@cutlass,triton" "quantized+fp8_ds_mla@cutlass,triton")
grep -q H200 "$OUT/0-gpu.log" && suites+=("many-heads+fp8_ds_mla@cutlass,triton" "mtp+fp8_ds_mla@cutlass,triton"
    "many-heads@cutlass" "mtp+fp8@cutlass,triton")
BENCH_LIMIT=60 bash benchmarks/run_h200.sh "${suites[@]}" > "$OUT/1-suites.log" 2>&1
grep -E "^=== |^--- |^\| " "$OUT/1-suites.log" | cut -c1-200
