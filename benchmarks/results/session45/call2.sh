#!/usr/bin/env bash
# Session 45, device call 2, with the library as committed.
# - Everywhere: `benchmarks/read_floor.py`, how fast a bare copy and a bare read stream the bytes of the
#   16-head `quantized` shapes (fp8 and fp8_ds_mla), beside the run's copy ceiling: what 85% of that
#   ceiling asks of a call that streams 151-688 MB.
# - On an H200 only: then session 44's call 2 (the fp8 and fp8_ds_mla suites, bf16 `many-heads`, for the
#   README's H200 tables); its reports come back in $OUT/suites/results.tar.gz, for results/<suite>/.
#
#   bash benchmarks/results/session45/call2.sh   # carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
step 1-read-floor 150 . python3 benchmarks/read_floor.py
cat "$OUT/1-read-floor.log"
if grep -q H200 "$OUT/0-gpu.log"; then
    OUT=$OUT/suites bash benchmarks/results/session44/call2.sh
fi
