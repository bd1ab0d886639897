#!/usr/bin/env bash
# Session 34, device call 2: the wgmma kernel's fused combine (FUSED_COMBINE_MIN_QUERY_ROWS), measured.
# 1. its GPU tests (16, 32 x 2, 64 and 128 query rows, a per-tensor fp8 cache at 64; three launches of
#    one plan each) and the cutlass backend's other GPU tests;
# 2. the profiler timeline of the many-heads and deepseek suites with the combine launched (--fused 0)
#    and fused (--fused 1), each plan timed in turn in one process, two processes (any Hopper GPU).
#
#   bash benchmarks/results/session34/call2.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp PYTHONUNBUFFERED=1
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
source benchmarks/results/session21/step.sh
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$OUT/0-gpu.log" 2>&1
cat "$OUT/0-gpu.log"
step 1-tests 200 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 4 -rfE tests/test_cutlass_backend.py
grep -E "passed|failed" "$OUT/1-tests.log" | tail -n 3
step 2-timeline 170 "$root" python3 benchmarks/timeline.py --suites many-heads,deepseek --fused 0 --fused 1
step 3-timeline 170 "$root" python3 benchmarks/timeline.py --suites many-heads,deepseek --fused 1 --fused 0
for f in 2-timeline 3-timeline; do echo "##### $f"; grep -E "period|Error" "$OUT/$f.log"; done
