#!/usr/bin/env bash
# Session 38, device call 1b: the profiler timelines that call 1 skipped (its pass check read pytest's
# summary line, which the repository's options leave out; fixed in call1.sh since). Run on the same warm
# H100 right after call 1, with the device budget left (~180 s): main, pipe, pipe, main, 45 s each.
#
#   bash benchmarks/results/session38/call1b.sh   # device: carry [".cache/tilecpp", ".ab/pipe"], timeout 170
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call > /dev/null
for t in main pipe pipe main; do
    d=$root; [ $t != main ] && d=$root/.ab/$t
    (cd $d && PYTHONPATH=. timeout 45 python3 benchmarks/timeline.py --backend cutlass --suites many-heads,mixed 2>&1 |
        grep -E "period|Error" | cut -c1-110 >> $OUT/3-timeline.txt)
    echo "##### $t" >> $OUT/3-timeline.txt
done
cat $OUT/3-timeline.txt
