#!/usr/bin/env bash
# Session 31, device call 2 (H200): does the row-halves merge (on from 64 query rows since session 29,
# measured on an H100 only) gain on the H200? Same-process profiler timeline of the many-heads and mtp
# suites, MERGE_MIN_QUERY_ROWS 0 (never) / 64 / 64 / 0 per shape.
#
#   bash benchmarks/results/session31/call2.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
source benchmarks/results/session21/step.sh
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$OUT/0-gpu.log"
step 1-timeline 300 "$root" python3 benchmarks/timeline.py --backend cutlass --suites many-heads,mtp \
    --merge 0 --merge 64 --merge 64 --merge 0
grep -E "period|Error" "$OUT/1-timeline.log"
