#!/usr/bin/env bash
# Session 27, device call 3 (not run yet: the session's device time ran out): the suites session 26's
# call 3 did not reach (call 1 of this session was cut after `deepseek:paged:64`), with the tilecpp
# kernels of this tree (the plain row loop, the page id a step ahead).
#
#   bash benchmarks/results/session27/call3.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
BENCH_LIMIT=100 bash benchmarks/run_h200.sh mixed:paged:64 quantized:paged:64 deepseek+fp8 many-heads+fp8 \
    mtp+fp8 > "${OUT:?}/run.log" 2>&1
echo "run: exit $?"
