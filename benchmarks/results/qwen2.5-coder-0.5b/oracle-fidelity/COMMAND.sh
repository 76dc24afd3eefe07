#!/usr/bin/env bash
# Issue 33, RippleKV against its ceiling on Qwen2.5-Coder-0.5B, as ../../oracle-fidelity on SmolLM2: the oracle
# allocates with RippleKV's rule over the *measured* per-layer damage (../analyze: LongBench-E records 16-20, one
# damage profile per budget), evaluated on other prompts (records 1-5 of the 16 LongBench tasks), so it is out of
# sample. Fidelity to the full cache over its own greedy answer (64 tokens at most), 2,048 tokens, SnapKV's scorer.
# Re-running resumes where the last run stopped. Both also at the setting ../tune chose (r 16, gamma 30), added to the
# finished run (its config.json keeps the first configuration under extended_from): is the oracle a ceiling once
# the clip lets the dominant layer have more?
# --decode-memory 4GiB decodes a prompt's configurations in one batch instead of groups within one full cache: it
# changes no row (one multi_news prompt, all 28 rows bitwise equal either way) and ran 2.2x faster here.
set -eo pipefail
cd "$(dirname "$0")/../../../.."
Q=benchmarks/results/qwen2.5-coder-0.5b
O=$Q/oracle-fidelity
A=$Q/analyze
ripplekv eval --model qwen2.5-coder-0.5b --suite longbench --data-dir ../shared/data/longbench \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e,gov_report,narrativeqa,musique,qmsum \
  --methods full,snapkv,ripplekv,ripplekv-oracle,ripplekv:r=16,gamma=30,ripplekv-oracle:r=16,gamma=30 \
  --budgets 0.1,0.2,0.3 --scorers snapkv \
  --limit 5 --max-length 2048 --max-new-tokens 64 --score fidelity \
  --profile $Q/qwen2.5-coder-0.5b.profile.json \
  --oracle-profile $A/damage_profile_b0p1.json,$A/damage_profile_b0p2.json,$A/damage_profile_b0p3.json \
  --no-progress --decode-memory 4GiB --out $O "$@"
ripplekv report $O > $O/report.md
ripplekv report $O --format json > $O/report.json
python benchmarks/headline.py $O --candidate ripplekv-oracle --baselines snapkv,ripplekv --json $O/headline-oracle.json > $O/headline-oracle.md
python benchmarks/headline.py $O --candidate ripplekv-oracle:r=16,gamma=30 --baselines snapkv,ripplekv:r=16,gamma=30 \
  --json $O/headline-oracle-tuned.json > $O/headline-oracle-tuned.md
