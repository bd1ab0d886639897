#!/usr/bin/env bash
# Session 26, device call 3: the GPU tests with the tilecpp page id read a step ahead (call 2's .ab/p1,
# now in the tree), the paged suites, and the fp8 suites not run in call 2.
#
#   bash benchmarks/results/session26/call3.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
TESTS_LIMIT=200 BENCH_LIMIT=100 bash benchmarks/run_h200.sh tests deepseek:paged:64 mixed:paged:64 \
    quantized:paged:64 deepseek+fp8 many-heads+fp8 mtp+fp8 > "${OUT:?}/run.log" 2>&1
echo "run: exit $?"
