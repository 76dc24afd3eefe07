#!/usr/bin/env bash
# Issue 26, tuning parity, second pass on RULER: tune-fair-ruler-4k chose most settings at the edge of their grid
# (RippleKV r 32 / gamma 30, PyramidKV beta 5, CAKE tau1 2 / tau2 0.5 / window 64, DynamicKV radio_max 2 / window 64,
# LAVa floor_alpha 0.1 / window 64, LAVa's layer rule window 64), so a best beyond the edge was never tried. This run
# steps past each edge, on the same 42 prompts and split as the first pass (--seed 1, --calibration-fraction 0.67),
# each grid holding the first pass's choice (identical prompts and computation: its KL is the first pass's), and
# reaching the degenerate ends where a knob has one (beta 1, radio_max 1, floor_alpha 0: close to uniform budgets).
# SqueezeAttention's first choice (p = 8/21) was inside its grid and is not tuned again. A method's setting is the
# lowest calibration KL averaged over the budgets, over both passes (tune.json "settings" here, where it holds the
# method; the first pass's otherwise). Re-running resumes where the last run stopped.
cd "$(dirname "$0")/../../.."
ripplekv tune --suite ruler --context-tokens 4096 --limit 3 --seed 1 --budgets 0.1,0.2,0.3 --calibration-fraction 0.67 \
  --profile default=benchmarks/results/smollm2-135m.profile.json --ratios 16,32,64,128 --gammas 12,30,60,120 \
  --grid 'pyramidkv:beta=1|2|3|5' \
  --grid 'cake:tau1=2|4|8,tau2=0.125|0.25|0.5,window=64|128' \
  --grid 'dynamickv:radio_max=1|1.25|1.5|2,window=64|128' \
  --grid 'lava:floor_alpha=0|0.02|0.05|0.1,window=64|128' \
  --grid 'lava-layer:window=64|128' \
  --out benchmarks/results/tune-fair-ruler-4k-edges "$@"
