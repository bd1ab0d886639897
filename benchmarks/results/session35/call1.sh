#!/usr/bin/env bash
# Session 35, device call 1: session 34's call 4 (the fused-combine config's GPU tests and its sweep
# against the default), then, on an H200 only, the fp8 suites the README's targets quote, which have
# not run there since the fp16 partials (sessions 33-34).
#
#   bash benchmarks/results/session35/call1.sh   # device: carry [".cache/tilecpp"], timeout 600
set -uo pipefail
cd "$(dirname "$0")/../../.."
bash benchmarks/results/session34/call4.sh
if grep -q H200 "${OUT:-out}/0-gpu.log"; then
    BENCH_LIMIT=120 bash benchmarks/run_h200.sh quantized+fp8 quantized+fp8_ds_mla
else
    echo "not an H200: the fp8 suites are skipped"
fi
