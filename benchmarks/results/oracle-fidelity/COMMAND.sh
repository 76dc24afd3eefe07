#!/usr/bin/env bash
# RippleKV against its ceiling (issue 8): the oracle allocates with RippleKV's rule over the *measured* per-layer
# damage (../analyze-smollm2: LongBench-E records 16-20, one damage profile per budget), evaluated here on other
# prompts (records 1-5 of the 16 LongBench-mini tasks, the first 5 of ../longbench-fidelity's 15), so the oracle is
# out of sample. Also ripplekv-ada (RippleKV's layer budgets, AdaKV's head-wise split inside each layer).
# Fidelity to the full cache over its own greedy answer (64 tokens at most), prompts middle-truncated to 4,096 tokens.
# Re-running resumes where the last run stopped.
cd "$(dirname "$0")/../../.."
O_DIR=benchmarks/results/oracle-fidelity
A=benchmarks/results/analyze-smollm2
ripplekv eval --suite longbench --data-dir ../shared/data/longbench \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e,gov_report,narrativeqa,musique,qmsum \
  --methods full,snapkv,adakv,ripplekv,ripplekv-ada,ripplekv-oracle --budgets 0.1,0.2,0.3 \
  --limit 5 --max-length 4096 --max-new-tokens 64 --score fidelity \
  --profile benchmarks/results/smollm2-135m.profile.json \
  --oracle-profile $A/damage_profile_b0p1.json,$A/damage_profile_b0p2.json,$A/damage_profile_b0p3.json \
  --out benchmarks/results/oracle-fidelity "$@"
# The tables: the report, and the paired differences of each method to the others (benchmarks/headline.py).
ripplekv report $O_DIR > $O_DIR/report.md
ripplekv report $O_DIR --format json > $O_DIR/report.json
python benchmarks/headline.py $O_DIR --baselines snapkv,adakv,ripplekv-ada,ripplekv-oracle --json $O_DIR/headline.json > $O_DIR/headline.md
python benchmarks/headline.py $O_DIR --baselines snapkv,adakv --json $O_DIR/headline-vs-adakv.json > $O_DIR/headline-vs-adakv.md
python benchmarks/headline.py $O_DIR --candidate ripplekv-ada --baselines snapkv,adakv,ripplekv --json $O_DIR/headline-ada.json > $O_DIR/headline-ada.md
python benchmarks/headline.py $O_DIR --candidate ripplekv-oracle --baselines snapkv,adakv,ripplekv --json $O_DIR/headline-oracle.json > $O_DIR/headline-oracle.md
