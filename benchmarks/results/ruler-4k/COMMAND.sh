#!/usr/bin/env bash
# Ran on 2026-11-30 with the first SmolLM2 profile and that day's code; the profile was remade since (float64
# profiling), so this folder resumes only from commit b2cf94f: git worktree add ../early b2cf94f, then run this file there.
# RULER-style suite at 4K tokens on SmolLM2-135M: every method x 10/20/30%. Re-running resumes where the last
# run stopped. Subsampling (CPU): 3 generated samples per task (seeds derived from --seed 0) for all 14 tasks,
# contexts sized to at most 4,096 tokens with the model's tokenizer, each task's own answer cap (32 or 64 tokens).
cd "$(dirname "$0")/../../.."
ripplekv eval --suite ruler --context-tokens 4096 --limit 3 --seed 0 \
  --methods full,streamingllm,snapkv,pyramidkv,adakv,ripplekv,ripplekv-local --budgets 0.1,0.2,0.3 \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/ruler-4k "$@"
