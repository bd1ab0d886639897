#!/usr/bin/env bash
# Session 29, device call 3: the row-halves kernel as a programmatic dependent launch
# (CutlassDecodePlan.early_merge_split; the kernel already waits with griddepcontrol.wait). Timelines of
# the deepseek and mtp suites, merge never (0) / from 16 rows (16): PDL off, on, off.
#
#   bash benchmarks/results/session29/call3.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp
source benchmarks/results/session21/step.sh
args=(benchmarks/timeline.py --backend cutlass --suites deepseek,mtp --merge 0 --merge 16)
step 1-pdl-off 150 "$root" python3 "${args[@]}"
step 2-pdl-on 150 "$root" python3 "${args[@]}" --early-merge-split
step 3-pdl-off 150 "$root" python3 "${args[@]}"
step 4-merge-tests-pdl 100 "$root" python3 -c "import sys, pytest
from tilegym.ops.cutlass import mla_decoding_split_kv as m
m.CutlassDecodePlan.early_merge_split = True
sys.exit(pytest.main(['-p', 'no:cacheprovider', '-m', 'gpu', '-q', 'tests/test_cutlass_backend.py', '-k', 'merged or halved']))"
