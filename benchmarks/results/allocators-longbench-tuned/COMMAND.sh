#!/usr/bin/env bash
# Issue 26, tuned matrix on LongBench: the prompts of allocators-longbench (first 15 records of the 16 English tasks,
# middle-truncated to 4,096 tokens, question-aware; disjoint from the tuning prompts, records 16-19 of the
# LongBench-E tasks) with every allocation family at the setting two tuning passes chose on LongBench calibration
# prompts (tune-fair-longbench, then tune-fair-longbench-edges past its grid edges; a method's setting is its lowest
# calibration KL averaged over the three budgets). SnapKV's scorer only: the settings were tuned under it.
# RippleKV's local-signal ablation takes RippleKV's tuned r and gamma. The default-setting run stays in
# allocators-longbench. Every configuration of a prompt is derived from its one prefill.
# Re-running resumes where the last run stopped.
cd "$(dirname "$0")/../../.."
ripplekv eval --suite longbench --data-dir ../shared/data/longbench \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e,gov_report,narrativeqa,musique,qmsum \
  --methods 'full,snapkv,pyramidkv:beta=1,cake:tau1=8,tau2=2,window=32,squeezeattention:p=1,dynamickv:radio_max=1,window=64,lava:window=64,floor_alpha=0,lava-layer,ripplekv:gamma=6,ripplekv-local:gamma=6' \
  --budgets 0.1,0.2,0.3 --scorers snapkv \
  --limit 15 --max-length 4096 --max-new-tokens 64 --score fidelity \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/allocators-longbench-tuned "$@"
