#!/usr/bin/env bash
# Task scores (and fidelity) on LongBench-mini, SmolLM2-135M: every method x 10/20/30%, the 211 prompts of
# ../longbench-fidelity (same tasks, records, truncation and 64-token answer cap), every configuration decoded
# greedily (the full cache's first, then all compressed configurations of a prompt as one batch, --decode batched)
# and scored with LongBench's official metric. Re-running resumes where the last run stopped.
cd "$(dirname "$0")/../../.."
ripplekv eval --suite longbench --data-dir ../shared/data/longbench \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e,gov_report,narrativeqa,musique,qmsum \
  --methods full,streamingllm,snapkv,pyramidkv,adakv,ripplekv,ripplekv-local --budgets 0.1,0.2,0.3 \
  --limit 15 --max-length 4096 --max-new-tokens 64 --score both \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/longbench-decoded "$@"
