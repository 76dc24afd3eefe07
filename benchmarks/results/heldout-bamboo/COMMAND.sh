#!/usr/bin/env bash
# Issue 26, deliverable 4: RippleKV's default (r, gamma) checked on a source no data, profile, calibration or tuning
# run of this project has touched: BAMBOO MeetingQA + PaperQA 4K (benchmarks/heldout/PROVENANCE.md), all 169
# records, question-aware, fidelity to the full cache, SmolLM2-135M, SnapKV's scorer, 10/20/30%.
# The candidates: the previous default (ripplekv = r 4, gamma 3); the default chosen from the two tuning runs before
# this run (r 16, gamma 12: the lowest calibration KL relative to SnapKV averaged over both suites and the three
# budgets, see docs/tuning.md); each suite's own best (LongBench r 4 gamma 6, RULER r 32 gamma 30); SnapKV uniform.
# Every configuration of a prompt is derived from its one prefill. Re-running resumes where the last run stopped.
cd "$(dirname "$0")/../../.."
ripplekv eval --suite jsonl --data benchmarks/heldout/bamboo.jsonl \
  --methods 'full,snapkv,ripplekv,ripplekv:r=16,gamma=12,ripplekv:gamma=6,ripplekv:r=32,gamma=30' \
  --budgets 0.1,0.2,0.3 --scorers snapkv --score fidelity --max-new-tokens 64 \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/heldout-bamboo "$@"
