#!/usr/bin/env bash
# Session 27, device call 1: session 26's call 3 again (its outputs were lost with that session):
#   bash benchmarks/results/session26/call3.sh   # device: carry [".cache/tilecpp"]
# The session's device time ran out after 232 s: the GPU tests (323 passed, 81 skipped) and
# `deepseek:paged:64` finished; `mixed:paged:64` was cut at its 8th of 20 timings. call1/ holds the
# logs; the report is in benchmarks/results/deepseek-paged64/.
exec bash "$(dirname "$0")/../session26/call3.sh"
