#!/usr/bin/env bash
# Issue 26, tuning parity on the RULER-style suite at 4K: the grids of tune-fair-longbench on 3 generated samples
# of each of the 14 tasks drawn with --seed 1 (the matrices use --seed 0: other needles, keys and haystack cuts),
# question-aware, SnapKV's scorer; each task's first 2 samples select (--calibration-fraction 0.67), the 3rd is
# held out. Re-running resumes where the last run stopped.
cd "$(dirname "$0")/../../.."
ripplekv tune --suite ruler --context-tokens 4096 --limit 3 --seed 1 --budgets 0.1,0.2,0.3 --calibration-fraction 0.67 \
  --profile default=benchmarks/results/smollm2-135m.profile.json --ratios 2,4,8,16,32 --gammas 2,3,6,12,30 \
  --grid 'pyramidkv:beta=5|10|20|40' \
  --grid 'cake:tau1=0.5|1|2,tau2=0.5|1|2,window=32|64' \
  --grid 'squeezeattention:p=0.2|0.3|0.5|0.625|0.8' \
  --grid 'dynamickv:radio_max=2|5|10|20,window=8|32|64' \
  --grid 'lava:floor_alpha=0.1|0.2|0.5,window=32|64' \
  --grid 'lava-layer:window=32|64' \
  --out benchmarks/results/tune-fair-ruler-4k "$@"
