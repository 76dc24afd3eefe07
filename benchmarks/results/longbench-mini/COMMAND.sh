#!/usr/bin/env bash
# Ran on 2026-11-30 with the first SmolLM2 profile and that day's code; the profile was remade since (float64
# profiling), so this folder resumes only from commit 2c904f3: git worktree add ../early 2c904f3, then run this file there.
# LongBench-mini on SmolLM2-135M: every method x 10/20/30%. Re-running resumes where the last run stopped.
# Subsampling (CPU): the first 2 records of each task, in file order (the _e files here hold only LongBench-E's
# 0-4k-word bucket: see ../shared/data/longbench/PROVENANCE.md),
# prompts truncated to 4,096 tokens (middle truncation), answers capped at 128 new tokens (the official caps
# are 512 for gov_report, qmsum and multi_news; every other task's official cap is <= 128).
cd "$(dirname "$0")/../../.."
ripplekv eval --suite longbench --data-dir ../shared/data/longbench \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e,gov_report,narrativeqa,musique,qmsum \
  --methods full,streamingllm,snapkv,pyramidkv,adakv,ripplekv,ripplekv-local --budgets 0.1,0.2,0.3 \
  --limit 2 --max-length 4096 --max-new-tokens 128 \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/longbench-mini "$@"
