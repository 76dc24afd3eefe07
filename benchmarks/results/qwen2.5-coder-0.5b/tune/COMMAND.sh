#!/usr/bin/env bash
# Issue 33, tuning parity on Qwen2.5-Coder-0.5B: every family's knobs and RippleKV's r/gamma tuned on the same
# calibration prompts, from the same prefill, under SnapKV's scorer, by the same fidelity and rule, as SmolLM2's
# tune-fair-longbench. One pass whose grids span SmolLM2's two passes (its first grid and the steps past its edges,
# down to each knob's degenerate end: beta 1, p 1, radio_max 1, floor_alpha 0).
# Prompts: records 16-19 of the 12 LongBench-E English tasks (--skip 15 --limit 4: disjoint from the matrices, which
# read the first 8 records), middle-truncated to 2,048 tokens (Qwen's prefill costs ~4x SmolLM2's), question-aware,
# 64-token answers; each task's first 3 prompts select (--calibration-fraction 0.75), the 4th is held out.
# The tuned settings are tune.json's "settings". Re-running resumes where the last run stopped.
set -eo pipefail
cd "$(dirname "$0")/../../../.."
OUT=benchmarks/results/qwen2.5-coder-0.5b/tune
ripplekv tune --model qwen2.5-coder-0.5b --suite longbench --data-dir ../shared/data/longbench \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e \
  --skip 15 --limit 4 --max-length 2048 --max-new-tokens 64 --budgets 0.1,0.2,0.3 --calibration-fraction 0.75 \
  --profile default=benchmarks/results/qwen2.5-coder-0.5b/qwen2.5-coder-0.5b.profile.json \
  --ratios 2,4,8,16,32 --gammas 2,3,6,12,30 \
  --grid 'pyramidkv:beta=1|2|5|10|20' \
  --grid 'cake:tau1=0.5|2|8,tau2=0.5|2|8,window=32|64' \
  --grid 'squeezeattention:p=0.3|0.5|0.8|0.95|1' \
  --grid 'dynamickv:radio_max=1|1.5|2|5|20,window=32|64' \
  --grid 'lava:floor_alpha=0|0.05|0.2|0.5,window=32|64' \
  --grid 'lava-layer:window=32|64|128' \
  --no-progress --out $OUT "$@" | tee -a $OUT/tune.log
