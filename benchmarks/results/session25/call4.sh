#!/usr/bin/env bash
# Session 25, device call 4: every GPU test and the mixed suite with the final settings (tilecpp's
# segment cost 1024 tokens for one head group; snap tables shared by the plans of one shape).
#
#   bash benchmarks/results/session25/call4.sh run   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
BENCH_LIMIT=120 TESTS_LIMIT=200 bash benchmarks/run_h200.sh tests mixed > "${OUT:?}/run.log" 2>&1
