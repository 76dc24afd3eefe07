#!/usr/bin/env bash
# Issue 17, run (a): every per-layer allocation family at SnapKV's total under three token scorers (SnapKV,
# ExpectedAttention, TOVA), fidelity to the full cache on LongBench-mini, SmolLM2-135M, 10/20/30%, question-aware.
# The same 211 prompts as longbench-fidelity (first 15 records of the 16 English tasks, middle-truncated to 4,096
# tokens). Every configuration of a prompt is derived from its one prefill. The folder began as a SnapKV-only run
# and was extended with the two other scorers (config.json keeps the first configuration under extended_from).
# Schedules: uniform (snapkv), depth (pyramidkv), attention statistics (cake, dynamickv, lava), representation
# change (squeezeattention), downstream sensitivity (ripplekv) and its local-signal ablation (ripplekv-local).
# Re-running resumes where the last run stopped.
cd "$(dirname "$0")/../../.."
ripplekv eval --suite longbench --data-dir ../shared/data/longbench \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e,gov_report,narrativeqa,musique,qmsum \
  --methods full,snapkv,pyramidkv,cake,squeezeattention,dynamickv,lava,ripplekv,ripplekv-local --budgets 0.1,0.2,0.3 \
  --scorers snapkv,expected_attention,tova \
  --limit 15 --max-length 4096 --max-new-tokens 64 --score fidelity \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/allocators-longbench "$@"
