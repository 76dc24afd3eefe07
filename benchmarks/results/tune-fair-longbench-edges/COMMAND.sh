#!/usr/bin/env bash
# Issue 26, tuning parity, second pass on LongBench: tune-fair-longbench chose several settings at the edge of their
# grid (PyramidKV beta 5, CAKE tau1 2 / tau2 2 / window 32, SqueezeAttention p 0.8, DynamicKV radio_max 2 / window
# 64, LAVa floor_alpha 0.1 / window 64, LAVa's layer rule window 64), so a best beyond the edge was never tried. This
# run steps past each edge, on the same 48 prompts and split as the first pass (records 16-19 of the 12 LongBench-E
# tasks, --calibration-fraction 0.75), each grid holding the first pass's choice (identical prompts and computation:
# its KL is the first pass's), and reaching the degenerate ends where a knob has one (beta 1, p 1, radio_max 1,
# floor_alpha 0: close to uniform budgets). RippleKV's first choice (r 4, gamma >= 4: no clip) was inside its grid;
# the defaults and that choice are re-run as the reference. A method's setting is the lowest calibration KL averaged
# over the budgets, over both passes. Re-running resumes where the last run stopped.
cd "$(dirname "$0")/../../.."
ripplekv tune --suite longbench --data-dir ../shared/data/longbench \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e \
  --skip 15 --limit 4 --max-length 4096 --max-new-tokens 64 --budgets 0.1,0.2,0.3 --calibration-fraction 0.75 \
  --profile default=benchmarks/results/smollm2-135m.profile.json --ratios 4 --gammas 3,6 \
  --grid 'pyramidkv:beta=1|2|3|5' \
  --grid 'cake:tau1=2|4|8,tau2=2|4|8,window=16|32' \
  --grid 'squeezeattention:p=0.8|0.9|0.95|1' \
  --grid 'dynamickv:radio_max=1|1.25|1.5|2,window=64|128' \
  --grid 'lava:floor_alpha=0|0.02|0.05|0.1,window=64|128' \
  --grid 'lava-layer:window=64|128' \
  --out benchmarks/results/tune-fair-longbench-edges "$@"
