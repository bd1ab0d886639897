#!/usr/bin/env bash
# Session 37, device call 1 (any Hopper): the wgmma kernel's partials as fp16, each half-row scaled by a
# power of two into fp16's top binade (float32 before). First the cutlass GPU tests that reach the wgmma
# kernel and the combine (parity with float64, the new cache-magnitude tests); then a profiler timeline of
# the many-heads and mixed suites (bf16), base tree (.ab/base = the commit before, float32 partials) and
# this tree alternately, and of many-heads with a per-tensor fp8 cache (the wgmma kernel's fp8 variant).
# It ran on an H100 from the tree with variants/cutlass-fp16-partials.patch applied (.ab/base: 0f4b64a);
# the change was not kept (benchmarks/NOTES_cutlass.md, "Session 37").
#
#   bash benchmarks/results/session37/call1.sh   # device: carry [".cache/tilecpp", ".ab/base"], timeout 600
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
step 1-tests 200 "$root" python3 -m pytest -p no:cacheprovider -p no:randomly -q -m gpu -rfEs \
    tests/test_cutlass_backend.py tests/test_cutlass_fp8.py -k "not fp8_caches_match and not snapped"
grep -E "passed|failed|FAILED|Error" "$OUT/1-tests.log" | tail -n 12
i=0
for tree in base new base new; do
    i=$((i + 1))
    dir=$root; [ "$tree" = base ] && dir=$root/.ab/base
    step "2-timeline-$i-$tree" 90 "$dir" python3 benchmarks/timeline.py --backend cutlass --suites many-heads,mixed
    grep -E "period|Error" "$OUT/2-timeline-$i-$tree.log" | cut -c1-150 >> "$OUT/2-timeline.txt"
    echo "##### $tree" >> "$OUT/2-timeline.txt"
done
for tree in base new; do
    dir=$root; [ "$tree" = base ] && dir=$root/.ab/base
    step "3-timeline-fp8-$tree" 60 "$dir" python3 benchmarks/timeline.py --backend cutlass --kv fp8 --suites many-heads
    grep -E "period|Error" "$OUT/3-timeline-fp8-$tree.log" | cut -c1-150 >> "$OUT/3-timeline-fp8.txt"
    echo "##### $tree" >> "$OUT/3-timeline-fp8.txt"
done
cat "$OUT/2-timeline.txt" "$OUT/3-timeline-fp8.txt" | grep -oE "^.*period [0-9.]+ us/call|#####.*|Error.*"
# $OUT brings back at most 8 files: the logs go in one archive.
(cd "$OUT" && tar -czf logs.tar.gz ./*.log ./*.txt && rm -f ./*-timeline-*.log)
