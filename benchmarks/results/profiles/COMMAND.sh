#!/usr/bin/env bash
# Profile design (issue 8): profile variants of SmolLM2-135M, each on 8 calibration samples, to be compared by rho
# with the measured damage on the held-out prompts of ../analyze-smollm2 (benchmarks/profile_design.py) and by
# fidelity on those prompts (`ripplekv tune --ratios 4 --gammas 3`, one --profile per variant).
# The reference is ../smollm2-135m.profile.json (essays, alpha 0.5, 32-token continuation, noise).
# calib-qa.jsonl: `python benchmarks/make_qa_calibration.py ../shared/data/longbench benchmarks/results/profiles/calib-qa.jsonl`
# (LongBench-E QA records 20 onwards: disjoint from the evaluation's 0-14 and the analysis' 15-19).
# Re-running resumes each profile from its .partial.jsonl and skips finished ones.
set -e
cd "$(dirname "$0")/../../.."
P=benchmarks/results/profiles
run() { out=$1; shift; [ -f "$out" ] || (/usr/bin/time -f "%e s" ripplekv profile "$@" --out "$out" 2>&1 | tail -1 > "$out.seconds"); }
run $P/essays-alpha0.25.json --alpha 0.25                     # noise scale
run $P/essays-alpha1.json --alpha 1.0
run $P/essays-cont8.json --continuation-tokens 8              # continuation length
run $P/essays-cont128.json --continuation-tokens 128
run $P/essays-model.json --continuation model                 # the model's own continuation of the essay
run $P/qa-gold.json --calib $P/calib-qa.jsonl                 # QA prompts, gold answer teacher-forced
run $P/qa-gold32.json --calib $P/calib-qa.jsonl --max-continuation-tokens 32   # gold answers cut to 32 tokens
run $P/qa-model.json --calib $P/calib-qa.jsonl --continuation model   # QA prompts, the model's own answer
# Compression-shaped perturbation: each layer's own cache evicted by SnapKV at the target budget (every other
# layer full), on the same 8 QA calibration prompts; OUT/damage_profile_b<budget>.json is the profile.
ripplekv analyze --suite jsonl --data $P/calib-qa.jsonl --limit 8 --budgets 0.1,0.2,0.3 \
  --no-plots --no-progress --out $P/evict-qa > /dev/null
