#!/usr/bin/env bash
# Session 23, device call 4 (prepared, NOT run: the session's device time ran out): the paged reports whose cutlass rows predate sessions 22-23
# (deepseek and mixed with pages of 64), every backend.
#
#   bash benchmarks/results/session23/call4.sh run   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."

case ${1:-} in
run) BENCH_LIMIT=95 bash benchmarks/run_h200.sh deepseek:paged:64 mixed:paged:64 ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
