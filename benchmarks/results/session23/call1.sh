#!/usr/bin/env bash
# Session 23, device call 1: where a cutlass call's time goes (benchmarks/timeline.py: kernel durations
# and gaps from a profiler trace of graph replays, at the clocks the GPU ran), for this tree (split kernel
# as a programmatic dependent launch) and .ab/main (session 22's HEAD); then the same-process A/B of
# the two and the cutlass GPU tests on this tree.
#
#   bash benchmarks/results/session23/call1.sh run   # device: carry [".cache/tilecpp", ".ab", ".flashmla"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
py=${PYTHON:-python3}

# shellcheck source=../session21/step.sh
. benchmarks/results/session21/step.sh

run() {
    export PYTHONUNBUFFERED=1 TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp
    nvidia-smi --query-gpu=name,driver_version,clocks.current.sm --format=csv > "$OUT/0-info.log" 2>&1
    step 1-tests 110 . "$py" -m pytest -p no:cacheprovider -m gpu -n 0 -q tests/test_cutlass_fp8.py tests/test_cutlass_backend.py
    step 2-timeline 120 . "$py" benchmarks/timeline.py --suites deepseek,mixed --tree .ab/main --tree .
    step 2-timeline-split 60 . "$py" benchmarks/timeline.py --suites many-heads --split 1row --split 2row
    step 2-timeline-fp8 60 . "$py" benchmarks/timeline.py --kv fp8 --suites quantized --tree .ab/main --tree .
    if [ -f .flashmla/libflashmla_sm90.so ]; then  # local only: FlashMLA beside cutlass, pages of 64
        step 3-timeline-flashmla 100 . "$py" .flashmla/timeline_flashmla.py deepseek
    fi
    step 4-ab-bf16 120 . "$py" benchmarks/ab_trees.py .ab/main . --reps 4 --suites many-heads,deepseek,mtp
    step 5-ab-fp8 70 . "$py" benchmarks/ab_trees.py .ab/main . --reps 2 --fp8 --suites many-heads
}

case ${1:-} in
run) OUT=${OUT:?run on the device, where \$OUT is set} run ;;
*) echo "usage: $0 run" >&2; exit 2 ;;
esac
