#!/usr/bin/env bash
# Per-layer damage on SmolLM2-135M against the sensitivity profile (issue 8, `ripplekv analyze`).
# Held-out prompts: LongBench-E records 16 onwards of the 12 tasks that have them (--skip 15: the fidelity run in
# ../longbench-fidelity used the first 15 of each file; the profile was measured on essay text), 5 per task
# (repobench-p_e has 4): 59 prompts, middle-truncated to 2,048 tokens, question-aware.
# For each prompt and budget: one prefill, every layer compressed alone (SnapKV selection), fidelity KL over the full
# cache's own greedy answer (up to 32 tokens). Re-running resumes.
cd "$(dirname "$0")/../../.."
ripplekv analyze --suite longbench --data-dir ../shared/data/longbench \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e \
  --skip 15 --limit 5 --max-length 2048 --budgets 0.1,0.2,0.3 \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/analyze-smollm2 "$@"
