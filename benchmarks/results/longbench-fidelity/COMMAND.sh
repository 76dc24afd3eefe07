#!/usr/bin/env bash
# Fidelity to the full cache on LongBench-mini, SmolLM2-135M: every method x 10/20/30%, 211 prompts.
# Re-running resumes where the last run stopped.
# Sampling: the 16 English tasks (the _e file where ../shared/data/longbench has one), the first 15 records of
# each in file order (narrativeqa 5, musique 7, gov_report 9 and qmsum 10 hold fewer: 211 prompts in all),
# prompts middle-truncated to 4,096 tokens, question-aware compression.
# --score fidelity: only the full cache decodes (greedy, first token never a stop token, capped at 64 new tokens);
# every compressed configuration is scored by teacher-forcing that answer (KL(full || method), top-1 agreement)
# and the gold answer (NLL change against the full cache).
cd "$(dirname "$0")/../../.."
ripplekv eval --suite longbench --data-dir ../shared/data/longbench \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e,gov_report,narrativeqa,musique,qmsum \
  --methods full,streamingllm,snapkv,pyramidkv,adakv,ripplekv,ripplekv-local --budgets 0.1,0.2,0.3 \
  --limit 15 --max-length 4096 --max-new-tokens 64 --score fidelity \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/longbench-fidelity "$@"
