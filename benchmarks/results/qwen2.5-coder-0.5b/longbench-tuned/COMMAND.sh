#!/usr/bin/env bash
# Issue 33, the fair fight on Qwen2.5-Coder-0.5B, question-aware LongBench: the first 8 records of the 16 English tasks
# (124 prompts: narrativeqa holds 5 records and musique 7; disjoint from the tuning prompts), middle-truncated to 2,048
# tokens, 64-token answers, every family at the setting ../tune chose (tune.json "settings", read below: a method's
# lowest calibration KL averaged over the budgets), SnapKV's scorer (the settings were tuned under it); RippleKV's
# local-signal ablation takes RippleKV's tuned r and gamma. Task scores and fidelity. Every configuration of a prompt is
# derived from its one prefill. Re-running resumes where the last run stopped.
# --decode-memory 4GiB decodes a prompt's configurations in one batch instead of groups within one full cache: it
# changes no row (one multi_news prompt, all 28 rows bitwise equal either way) and ran 2.2x faster here.
set -eo pipefail
cd "$(dirname "$0")/../../../.."
Q=benchmarks/results/qwen2.5-coder-0.5b
METHODS=$(python - "$Q/tune/tune.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["settings"]
local = s["ripplekv"].replace("ripplekv", "ripplekv-local", 1)
print(",".join(["full", "snapkv", *(s[m] for m in ("pyramidkv", "cake", "squeezeattention", "dynamickv", "lava", "lava-layer", "ripplekv")), local]))
PY
)
echo "methods: $METHODS"
ripplekv eval --model qwen2.5-coder-0.5b --suite longbench --data-dir ../shared/data/longbench \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e,gov_report,narrativeqa,musique,qmsum \
  --methods "$METHODS" --budgets 0.1,0.2,0.3 --scorers snapkv \
  --limit 8 --max-length 2048 --max-new-tokens 64 --score both \
  --profile $Q/qwen2.5-coder-0.5b.profile.json --no-progress --decode-memory 4GiB --out $Q/longbench-tuned "$@"
ripplekv report $Q/longbench-tuned > $Q/longbench-tuned/report.md
ripplekv report $Q/longbench-tuned --format json > $Q/longbench-tuned/report.json
