#!/usr/bin/env bash
# Issue 33, the held-out check on Qwen2.5-Coder-0.5B: BAMBOO MeetingQA + PaperQA 4K (benchmarks/heldout/bamboo.jsonl,
# untouched by any profile, calibration or tuning run), all 169 records (85 MeetingQA, 84 PaperQA; 4,166 s here: the
# answers are short options; a first run of the first 80 records, 35 min, is reproduced bit for bit by this one),
# question-aware, 64-token answers at most, fidelity to the full cache,
# SnapKV's scorer, 10/20/30%. Candidates: the library's default (ripplekv: r 4, gamma 3), the setting ../tune chose
# on Qwen (tune.json "settings"), SnapKV uniform and PyramidKV. Every configuration of a prompt is derived from its
# one prefill. Re-running resumes where the last run stopped; then the per-prompt checks of the default and the tuned
# setting.
# --decode-memory 4GiB decodes a prompt's configurations in one batch instead of groups within one full cache: it
# changes no row (one multi_news prompt, all 28 rows bitwise equal either way) and ran 2.2x faster here.
set -eo pipefail
cd "$(dirname "$0")/../../../.."
Q=benchmarks/results/qwen2.5-coder-0.5b
TUNED=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['settings']['ripplekv'])" $Q/tune/tune.json)
METHODS=full,snapkv,pyramidkv,ripplekv
[ "$TUNED" = ripplekv ] || METHODS="$METHODS,$TUNED"  # the tuning may keep the default
ripplekv eval --model qwen2.5-coder-0.5b --suite jsonl --data benchmarks/heldout/bamboo.jsonl \
  --methods "$METHODS" --budgets 0.1,0.2,0.3 --scorers snapkv --score fidelity \
  --max-new-tokens 64 --profile $Q/qwen2.5-coder-0.5b.profile.json --no-progress --decode-memory 4GiB \
  --out $Q/heldout-bamboo "$@"
python benchmarks/default_check.py $Q/heldout-bamboo --candidate ripplekv \
  --json $Q/heldout-bamboo/default_check.json --md $Q/heldout-bamboo/default_check.md
if [ "$TUNED" != ripplekv ]; then  # the tuned setting held out as well: against SnapKV, PyramidKV and the default
  python benchmarks/default_check.py $Q/heldout-bamboo --candidate "$TUNED" \
    --json $Q/heldout-bamboo/default_check_tuned.json --md $Q/heldout-bamboo/default_check_tuned.md
fi
