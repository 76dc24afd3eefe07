#!/usr/bin/env bash
# Ran on 2026-11-30 with the first SmolLM2 profile and that day's code; the profile was remade since (float64
# profiling), so this folder resumes only from commit f941ed9: git worktree add ../early f941ed9, then run this file there.
# Needle in a haystack on SmolLM2-135M: context length x depth, every method x 10/20/30%. Re-running resumes.
# Subsampling (CPU): one needle (seed 0) per cell, 3 lengths x 5 depths, a 4-digit number (SmolLM2-135M
# copies 4 digits reliably with the full cache; the demo and benchmarks/needle_sweep.py use the same).
cd "$(dirname "$0")/../../.."
ripplekv eval --suite needle --needle-lengths 1024,2048,4096 --needle-depths 0,0.25,0.5,0.75,1 \
  --needle-digits 4 --limit 1 --seed 0 \
  --methods full,streamingllm,snapkv,pyramidkv,adakv,ripplekv,ripplekv-local --budgets 0.1,0.2,0.3 \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/needle "$@"
