#!/usr/bin/env bash
# Profile design by data (issue 8): every profile of ../profiles (run its COMMAND.sh first) against the reference
# ../smollm2-135m.profile.json, (1) by Spearman rho with the measured damage of ../analyze-smollm2 (59 held-out
# prompts; paired bootstrap differences to the reference), (2) by fidelity at the defaults r=4, gamma=3 on the same
# prompts (`ripplekv tune`, held-out half), so a variant ships only if it beats the reference with significance.
set -e
cd "$(dirname "$0")/../../.."
P=benchmarks/results/profiles
OUT=benchmarks/results/profile-design
ARGS=(--profile default=benchmarks/results/smollm2-135m.profile.json)
for v in essays-alpha0.25 essays-alpha1 essays-cont8 essays-cont128 essays-model qa-gold qa-model; do
  ARGS+=(--profile $v=$P/$v.json)
done
for b in 0p1 0p2 0p3; do ARGS+=(--profile evict-qa-b$b=$P/evict-qa/damage_profile_b$b.json); done
python benchmarks/profile_design.py benchmarks/results/analyze-smollm2 "${ARGS[@]}" --json $OUT/rho.json > $OUT/rho.md
ripplekv tune --suite longbench --data-dir ../shared/data/longbench \
  --tasks 2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e \
  --skip 15 --limit 5 --max-length 2048 --budgets 0.1,0.2,0.3 "${ARGS[@]}" \
  --ratios 4 --gammas 3 --no-progress --out $OUT/tune "$@"
