#!/usr/bin/env bash
# Session 25, device call 4 (the session's last device minutes): the GPU tests of the schedule kernel and
# of cutlass (whose cluster-pair plans now share snap tables), then the mixed suite with the final
# settings (tilecpp's segment cost 1024 tokens for one head group).
#
#   bash benchmarks/results/session25/call4.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
timeout 80 python3 -m pytest -p no:cacheprovider -m gpu -n 4 -rfE tests/test_schedule_kernel.py \
    tests/test_cutlass_backend.py > "${OUT:?}/tests.log" 2>&1
echo "tests: exit $?"
BENCH_LIMIT=95 bash benchmarks/run_h200.sh mixed > "$OUT/run.log" 2>&1
echo "mixed: exit $?"
