#!/usr/bin/env bash
# Issue 26, tuning parity on LongBench: every method's own knobs and RippleKV's r/gamma tuned on the same
# calibration prompts, from the same prefill, under SnapKV's scorer, by the same fidelity and rule.
# Prompts: records 16-19 of the 12 LongBench-E English tasks (--skip 15 --limit 4: disjoint from the 211 prompts of
# the question-aware matrices, which read the first 15 records), middle-truncated to 4,096 tokens, question-aware,
# 64-token answers as the matrices; each task's first 3 prompts select (--calibration-fraction 0.75), the 4th is held
# out. The tuned settings are tune.json's "settings" (one per method: the lowest calibration KL averaged over the
# budgets). Re-running resumes where the last run stopped.
cd "$(dirname "$0")/../../.."
ripplekv tune --suite longbench --data-dir ../shared/data/longbench \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e \
  --skip 15 --limit 4 --max-length 4096 --max-new-tokens 64 --budgets 0.1,0.2,0.3 --calibration-fraction 0.75 \
  --profile default=benchmarks/results/smollm2-135m.profile.json --ratios 2,4,8,16,32 --gammas 2,3,6,12,30 \
  --grid 'pyramidkv:beta=5|10|20|40' \
  --grid 'cake:tau1=0.5|1|2,tau2=0.5|1|2,window=32|64' \
  --grid 'squeezeattention:p=0.2|0.3|0.5|0.625|0.8' \
  --grid 'dynamickv:radio_max=2|5|10|20,window=8|32|64' \
  --grid 'lava:floor_alpha=0.1|0.2|0.5,window=32|64' \
  --grid 'lava-layer:window=32|64' \
  --out benchmarks/results/tune-fair-longbench "$@"
