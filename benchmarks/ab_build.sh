#!/usr/bin/env bash
# Build a baseline for a same-call A/B on the GPU machine (a development tool). Kernel times move by
# up to ~10% between device calls, so a change is timed against its baseline in one call.
#
#   bash benchmarks/ab_build.sh REF [DIR]
#
# On the CPU machine: REF's `tilegym` and `benchmarks` (git archive) go to DIR (default .ab/REF, which
# git ignores), and the cubins of both trees (every shipped variant and the fp8 sweep's
# configurations) go to .cache/tilecpp. Then one device call, carrying both:
#
#   run(command="export TILEGYM_CACHE_DIR=$PWD/.cache/tilecpp; \
#                PYTHONPATH=$PWD python3 benchmarks/sweep_cutlass_fp8.py; \
#                (cd .ab/REF && PYTHONPATH=. python3 benchmarks/sweep_cutlass_fp8.py)",
#       carry=[".cache/tilecpp", ".ab/REF"])
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:?usage: bash benchmarks/ab_build.sh REF [DIR]}
dir=${2:-.ab/$ref}
root=$PWD
py=${PYTHON:-$root/.venv/bin/python}
rm -rf "$dir"
mkdir -p "$dir"
git archive "$ref" tilegym benchmarks | tar -x -C "$dir"
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp
case $dir in /*) base=$dir ;; *) base=$root/$dir ;; esac
for tree in "$root" "$base"; do
    (cd "$tree" && PYTHONPATH=. "$py" -m tilegym precompile --arch sm_90 | tail -n 1)
    if [ -f "$tree/benchmarks/sweep_cutlass_fp8.py" ]; then
        (cd "$tree" && PYTHONPATH=. "$py" benchmarks/sweep_cutlass_fp8.py --precompile > /dev/null)
    fi
done
echo "baseline $ref in $dir; cubins of both trees in .cache/tilecpp ($(du -sh .cache/tilecpp | cut -f1))"
