#!/usr/bin/env bash
# Issue 17's runs, one after another (each resumes where it stopped, so re-running this script continues them):
# (a) LongBench question-aware under SnapKV, ExpectedAttention and TOVA; (c) LongBench query-agnostic and (b) the
# RULER-style suite at 4K, both under SnapKV and ExpectedAttention. Reports: `ripplekv report <folder>`.
#   nohup nice -n 10 bash benchmarks/allocators.sh > allocators.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
for run in allocators-longbench allocators-longbench-query-agnostic allocators-ruler-4k; do
  bash "benchmarks/results/$run/COMMAND.sh" --no-progress
done
