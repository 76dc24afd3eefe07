#!/usr/bin/env bash
# Profile design by data (issue 8): every profile of ../profiles (run its COMMAND.sh first) against the reference
# ../smollm2-135m.profile.json, (1) by Spearman rho with the measured damage of ../analyze-smollm2 (59 held-out
# prompts; paired bootstrap differences to the reference), (2) by fidelity at the defaults r=4, gamma=3 on the same
# prompts (`ripplekv tune`; every prompt is held out from every profile's calibration data), so a variant ships only
# if it beats the reference with significance, (3) by profiling cost against plain prefills (run alone).
# tune/ holds the first 11 profiles; tune-capped/ the variant added after them (qa-gold32: the gold answers of qa-gold
# cut to 32 tokens, to bring qa-gold's cost under the 1.5x bound), with the reference and qa-gold again.
# Re-running resumes each tune where it stopped.
set -e
cd "$(dirname "$0")/../../.."
P=benchmarks/results/profiles
OUT=benchmarks/results/profile-design
TASKS=2wikimqa_e,hotpotqa_e,multifieldqa_en_e,qasper_e,multi_news_e,passage_count_e,passage_retrieval_en_e,lcc_e,repobench-p_e,samsum_e,trec_e,triviaqa_e
TUNE=(ripplekv tune --suite longbench --data-dir ../shared/data/longbench --tasks $TASKS --skip 15 --limit 5
      --max-length 2048 --budgets 0.1,0.2,0.3 --ratios 4 --gammas 3 --no-progress)
REF=(--profile default=benchmarks/results/smollm2-135m.profile.json)
ARGS=("${REF[@]}")
for v in essays-alpha0.25 essays-alpha1 essays-cont8 essays-cont128 essays-model qa-gold qa-model; do
  ARGS+=(--profile $v=$P/$v.json)
done
for b in 0p1 0p2 0p3; do ARGS+=(--profile evict-qa-b$b=$P/evict-qa/damage_profile_b$b.json); done
python benchmarks/profile_design.py benchmarks/results/analyze-smollm2 "${ARGS[@]}" \
  --profile qa-gold32=$P/qa-gold32.json --json $OUT/rho.json > $OUT/rho.md
"${TUNE[@]}" "${ARGS[@]}" --out $OUT/tune > $OUT/tune.log
"${TUNE[@]}" "${REF[@]}" --profile qa-gold=$P/qa-gold.json --profile qa-gold32=$P/qa-gold32.json \
  --out $OUT/tune-capped > $OUT/tune-capped.log
python benchmarks/profile_design_cost.py --qa-calib $P/calib-qa.jsonl --samples 8 --rounds 1 --json $OUT/cost.json \
  > $OUT/cost.txt
for t in tune tune-capped; do
  python benchmarks/profile_design_fidelity.py $OUT/$t --cost $OUT/cost.json --json $OUT/$t/fidelity.json \
    > $OUT/$t/fidelity.md
done
