#!/usr/bin/env bash
# Issue 17, run (c): every per-layer allocation family at SnapKV's total under SnapKV's and ExpectedAttention's
# token scorers, query-agnostic (kvpress's protocol: the context is compressed before the question is seen, then the
# question runs over each compressed cache), fidelity to the full cache on LongBench, SmolLM2-135M, 10/20/30%.
# The first 7 records of the 16 English tasks (narrativeqa holds 5), middle-truncated to 4,096 tokens: 110 prompts.
# Every configuration of a prompt is derived from its one prefill of the context.
# Re-running resumes where the last run stopped.
cd "$(dirname "$0")/../../.."
ripplekv eval --suite longbench --data-dir ../shared/data/longbench --protocol query-agnostic \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e,gov_report,narrativeqa,musique,qmsum \
  --methods full,snapkv,pyramidkv,cake,squeezeattention,dynamickv,lava,ripplekv,ripplekv-local --budgets 0.1,0.2,0.3 \
  --scorers snapkv,expected_attention \
  --limit 7 --max-length 4096 --max-new-tokens 64 --score fidelity \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/allocators-longbench-query-agnostic "$@"
