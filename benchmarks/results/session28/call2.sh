#!/usr/bin/env bash
# Session 28, device call 2: the row-halves merge (cutlass, MERGE_ROW_HALVES: a CTA alone runs as a cluster
# of two pieces, and a row cut exactly into pieces 2k and 2k + 1 is merged in distributed shared memory
# instead of going through float32 partials and the combine). The two GPU tests that turn it on first,
# then a same-process timeline A/B, then every GPU test
# (merge off, on, on, off per shape: deepseek, many-heads and mixed suites, bf16). MERGE_ROW_HALVES is
# off by default until this call has run: step 1 runs the two tests that turn it on.
# (Session 29 replaced MERGE_ROW_HALVES by MERGE_MIN_QUERY_ROWS: `--merge 1` now means from one query row,
# which is what `on` meant here; the tests set it to 1.)
#
#   bash benchmarks/results/session28/call2.sh   # device: carry [".cache/tilecpp"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
export TILEGYM_CACHE_DIR=$root/.cache/tilecpp
source benchmarks/results/session21/step.sh
step 1-cutlass-tests 150 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 4 -rfEs -x tests/test_cutlass_backend.py -k "merged or halved"
step 2-timeline 240 "$root" python3 benchmarks/timeline.py --backend cutlass --suites deepseek,many-heads,mixed \
    --merge 0 --merge 1 --merge 1 --merge 0
step 3-gpu-tests 200 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 4 -rfEs tests
