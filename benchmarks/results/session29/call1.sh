#!/usr/bin/env bash
# Session 29, device call 1: the row-halves merge from MERGE_MIN_QUERY_ROWS query rows (cutlass, on from
# 64 rows after session 28's call 2). The cutlass GPU tests, then a same-process timeline A/B of the
# threshold on the MTP suite (16 heads, Q = 1, 2, 4: 16, 32, 64 rows): never (0), from 16 rows, again;
# then the many-heads suite.
#
#   bash benchmarks/results/session29/call1.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp
source benchmarks/results/session21/step.sh
step 1-cutlass-tests 200 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 4 -rfEs tests/test_cutlass_backend.py
step 2-timeline 200 "$root" python3 benchmarks/timeline.py --backend cutlass --suites mtp \
    --merge 0 --merge 16 --merge 16 --merge 0
# The many-heads suite, every backend, same-run ceilings (kept apart if the machine is not the H200).
step 3-bench-many-heads 180 "$root" python3 -m tilegym bench --suite many-heads --out-dir "$OUT/many-heads"
