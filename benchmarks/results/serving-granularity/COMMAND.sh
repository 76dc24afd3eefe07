#!/usr/bin/env bash
# Issue 43, item 1: what serving granularity costs, in the library (main environment). Held-out BAMBOO
# (benchmarks/heldout/bamboo.jsonl): the first 24 records of each task (meetingqa, paperqa; 48 prompts), built as the
# harness's jsonl suite builds them, each with the full cache's answer of the model's committed held-out run,
# teacher-forced over SnapKV-selected caches at the per-layer budgets each vLLM serving design gives, at 10/20/30%.
# The first 24 prompts (12 of each task) under every design (one group per layer, tiers of every divisor of the layer
# count at each prompt's length, the old 3 tiers at a 3,584-token reference); all 48 under the library's own budgets,
# SnapKV-uniform served, one group per layer and 6 tiers (library_vs_served.py). Qwen2.5-Coder-0.5B at the default
# setting and at the tuned r 16, gamma 30. Rows go to rows.jsonl as each prompt finishes: re-running resumes.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=benchmarks/results/serving-granularity
nice -n 10 .venv/bin/python benchmarks/serving/granularity.py --model smollm2-135m \
  --profile benchmarks/results/smollm2-135m.profile.json --heldout-run benchmarks/results/heldout-bamboo \
  --out "$OUT/smollm2-135m"
nice -n 10 .venv/bin/python benchmarks/serving/granularity.py --model qwen2.5-coder-0.5b \
  --profile benchmarks/results/qwen2.5-coder-0.5b/qwen2.5-coder-0.5b.profile.json \
  --heldout-run benchmarks/results/qwen2.5-coder-0.5b/heldout-bamboo --settings 4,3 16,30 \
  --out "$OUT/qwen2.5-coder-0.5b"
