#!/usr/bin/env bash
# Session 40, device call 4 (any Hopper): cutlass above 128 query rows (several cluster pairs per
# piece): its GPU tests at those row counts, then the `mtp` suite's 64 x 4096 x 128 Q = 2 row (256
# query rows), cutlass beside triton, bf16 and fp8.
#
#   CALL_BUDGET=S bash benchmarks/results/session40/call4.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
fits 60 && step 1-tests 60 "$root" python3 -m pytest -p no:cacheprovider -p no:randomly -q -m gpu -rfEs -x \
    tests/test_cutlass_backend.py tests/test_cutlass_fp8.py -k "lens10 or lens11 or one_wave or 128-2-1200 or 64-3-900"
fits 40 && step 2-mtp 40 "$root" python3 -m tilegym bench --suite mtp --backends cutlass,triton --repeat 10 --no-plot \
    --out-dir "$OUT/mtp"
fits 40 && step 3-mtp-fp8 40 "$root" python3 -m tilegym bench --suite mtp --kv-dtype fp8 --backends cutlass,triton \
    --repeat 10 --no-plot --out-dir "$OUT/mtp-fp8"
grep -hE "passed|failed|^\| (cutlass|triton) .* 128 \|" "$OUT"/*.log | cut -c1-160
# $OUT returns at most 8 files: the two reports as one archive
tar czf "$OUT/mtp-reports.tar.gz" -C "$OUT" mtp mtp-fp8 2>/dev/null && rm -rf "$OUT/mtp" "$OUT/mtp-fp8"
