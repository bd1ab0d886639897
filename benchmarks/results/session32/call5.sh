#!/usr/bin/env bash
# Left for the next session (not run in session 32): the H200 reports still older than session 31, on an
# H200 only (stops at once on any other GPU). The ragged page-of-one suites ran past 170 s in session 32's
# call 3, mostly in the bench's host timing of the torch reference (250 eager calls of 0.08-0.6 s); that
# timing now stops after 0.5 s, so they should fit. About 600 s in all: split over two calls if needed.
#
#   bash benchmarks/results/session32/call5.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "GPU: $gpu"
case "$gpu" in *H200*) ;; *) echo "not an H200: nothing run"; exit 3 ;; esac
export TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
BENCH_LIMIT=140 bash benchmarks/run_h200.sh mixed:ragged:1 deepseek:ragged:1 quantized:paged:64 \
    quantized:paged:64+fp8 2>&1 | grep -E "^===|passed|failed"
