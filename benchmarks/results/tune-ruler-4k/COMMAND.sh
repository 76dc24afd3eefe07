#!/usr/bin/env bash
# Does a wider RippleKV disparity (r, gamma) close the RULER-style gap to SqueezeAttention of issue 17's run (b)?
# `ripplekv tune` on the first 2 generated samples of each of the 14 tasks at 4K (--seed 0, the prompts of run (b)),
# question-aware, r in {4, 8, 16} x gamma in {3, 6, 12}, budgets 20% and 30%: the first sample of each task selects,
# the second is held out. Re-running resumes where the last run stopped.
cd "$(dirname "$0")/../../.."
ripplekv tune --suite ruler --context-tokens 4096 --limit 2 --seed 0 --budgets 0.2,0.3 \
  --ratios 4,8,16 --gammas 3,6,12 --profile benchmarks/results/smollm2-135m.profile.json \
  --out benchmarks/results/tune-ruler-4k "$@"
