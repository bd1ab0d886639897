#!/usr/bin/env bash
# Session 41, device call 4 (not run: the session's device time ran out; any Hopper): fp8_ds_mla's two
# row tiles (17-32 query rows, `FP8_DS_MLA_TWO_TILES`, off in main: cutlass refuses those rows and `auto`
# takes triton). The cutlass fp8 GPU tests (their two-tile cases switch it on, both formats), then the
# `mtp` suite with an fp8_ds_mla cache, cutlass beside triton, in a tree with the switch on:
#   mkdir -p .ab/ds2 && git archive HEAD | tar -x -C .ab/ds2
#   sed -i 's/^FP8_DS_MLA_TWO_TILES = False/FP8_DS_MLA_TWO_TILES = True/' .ab/ds2/tilegym/ops/cutlass/mla_decoding_split_kv.py
# (the same cubins as main: the switch is host-side). If the tests pass and cutlass beats triton there,
# turn the switch on in main (and the README's fp8_ds_mla limit goes from 16 rows to 32).
#
#   bash benchmarks/results/session41/call4.sh   # device: carry [".cache/tilecpp", ".ab/ds2"]
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/results/session21/step.sh
begin_call
step 1-cutlass-fp8-tests 100 "$root" python3 -m pytest -p no:cacheprovider -m gpu -n 4 -rfEs tests/test_cutlass_fp8.py
(cd .ab/ds2 && OUT=$OUT BENCH_LIMIT=60 bash benchmarks/run_h200.sh "mtp+fp8_ds_mla@cutlass,triton") > "$OUT/2-suites.log" 2>&1
grep -E "^=== " "$OUT/2-suites.log"
grep -hE "^\| (cutlass|triton) " .ab/ds2/benchmarks/results/mtp-fp8_ds_mla/*.md | cut -d'|' -f2-7,13-15,24
