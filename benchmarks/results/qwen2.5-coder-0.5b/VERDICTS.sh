#!/usr/bin/env bash
# Issue 33's verdicts on Qwen2.5-Coder-0.5B, from the committed runs (after RUN_ALL.sh): each LongBench matrix's
# RippleKV-against-every-family verdict on fidelity and on task scores, the README's headline lines of both models.
set -eo pipefail
cd "$(dirname "$0")/../../.."
Q=benchmarks/results/qwen2.5-coder-0.5b
for run in longbench-default longbench-tuned; do
  python benchmarks/allocators_verdict.py $Q/$run --metrics fidelity_kl,top1_agreement,score \
    --json $Q/$run/verdict.json --md $Q/$run/verdict.md
done
python benchmarks/headline_table.py --json benchmarks/results/headline_table.json > benchmarks/results/headline_table.md
python benchmarks/headline_table.py --metric score > benchmarks/results/headline_table_score.md
