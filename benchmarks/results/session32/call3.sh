#!/usr/bin/env bash
# Session 32, device call 3 (H200 only, as call 1): the H200 reports call 1 left: `deepseek:paged:64`
# (cut at call 1's 100 s limit), then the ragged page-of-one suites.
#
#   bash benchmarks/results/session32/call3.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "GPU: $gpu"
case "$gpu" in *H200*) ;; *) echo "not an H200: nothing run"; exit 3 ;; esac
export TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
BENCH_LIMIT=170 bash benchmarks/run_h200.sh deepseek:paged:64 mixed:ragged:1 deepseek:ragged:1 2>&1 | grep -E "^===|passed|failed"
