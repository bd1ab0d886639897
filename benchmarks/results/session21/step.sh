# Sourced by the sessions' call scripts: step NAME SECONDS DIR COMMAND... runs COMMAND in DIR with
# PYTHONPATH=. under a time limit, its output in $OUT/NAME.log, and prints its exit code (also left in
# step_rc) and last line.
step() {
    local name=$1 limit=$2 dir=$3
    shift 3
    echo "=== $name ($dir, limit ${limit}s)"
    local start=$SECONDS
    (cd "$dir" && PYTHONPATH=. timeout --kill-after=5 "$limit" "$@") > "$OUT/$name.log" 2>&1
    step_rc=$?  # the command's exit code, for callers that branch on it
    echo "=== $name: exit $step_rc after $((SECONDS - start))s ($(tail -n 1 "$OUT/$name.log"))"
}

# begin_call: what every call script does first, from the repository root: the cubin cache and
# unbuffered Python exported, $OUT made, and the GPU's name, clock and power in $OUT/0-gpu.log (printed).
# Sets root to the repository root.
begin_call() {
    root=$PWD
    export TILEGYM_CACHE_DIR=$root/.cache/tilecpp PYTHONUNBUFFERED=1
    OUT=${OUT:-$root/out}
    mkdir -p "$OUT"
    nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$OUT/0-gpu.log" 2>&1
    cat "$OUT/0-gpu.log"
}

# sweep BACKEND KV COSTS...: the profiler timeline of the mixed suite at each segment cost (tokens),
# its period lines only. Uses $py; export -f it (with py) for `bash -c` steps.
sweep() {
    local backend=$1 kv=$2
    shift 2
    local args=()
    for c in "$@"; do args+=(--segment-cost "$c"); done
    "$py" benchmarks/timeline.py --backend "$backend" --kv "$kv" --suites mixed "${args[@]}" 2>&1 | grep -E "period|Error"
}

# timeline_trees ORDER... -- ARGS...: the tilecpp profiler timeline (timeline.py ARGS) in each tree of
# ORDER in turn (an A/B in one call), its period lines under a "##### tree" label each.
timeline_trees() {
    local trees=()
    while [ "$1" != "--" ]; do trees+=("$1"); shift; done
    shift
    for tree in "${trees[@]}"; do
        echo "##### tree $tree $*"
        (cd "$tree" && PYTHONPATH=. python3 benchmarks/timeline.py --backend tilecpp "$@" 2>&1 | grep -E "period|Error|B[0-9]")
    done
}

# fits SECONDS: whether a step of that limit still ends inside the call's budget (CALL_BUDGET, default 560 s),
# so that a call returns whole steps.
fits() { [ $((SECONDS + $1)) -lt "${CALL_BUDGET:-560}" ]; }

# cutlass_timeline TREE KV SUITES LIMIT [ARGS...]: the cutlass profiler timeline of SUITES (cache KV) in TREE
# (main or a folder under .ab/), with timeline.py's ARGS: its period lines, labelled, appended to
# $OUT/3-timeline.txt, its whole log to $OUT/3-timeline-all.log (the device returns at most 8 files).
# Needs $root (begin_call).
cutlass_timeline() {
    local tree=$1 kv=$2 suites=$3 limit=$4 dir=$root
    shift 4
    [ "$tree" != main ] && dir=$root/.ab/$tree
    step 3-tl "$limit" "$dir" python3 benchmarks/timeline.py --backend cutlass --kv "$kv" --suites "$suites" "$@"
    grep -E "period|Error" "$OUT/3-tl.log" | cut -c1-150 >> "$OUT/3-timeline.txt"
    echo "##### $tree${*:+ $*} ($kv)" >> "$OUT/3-timeline.txt"
    cat "$OUT/3-tl.log" >> "$OUT/3-timeline-all.log" && rm -f "$OUT/3-tl.log"
}
