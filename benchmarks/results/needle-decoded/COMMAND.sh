#!/usr/bin/env bash
# Needle in a haystack on SmolLM2-135M, redone with this release's fixes (faithful PyramidKV, first token never a
# stop token, AdaKV derived from the shared prefill, float64 profile, batched decoding): context length x depth,
# every method x 10/20/30%, task score and fidelity. Re-running resumes.
# 3 needles (seeds derived from --seed 0) per cell, 3 lengths x 5 depths: 45 prompts; a 4-digit number
# (SmolLM2-135M copies 4 digits reliably with the full cache). Supersedes ../needle (1 needle per cell).
cd "$(dirname "$0")/../../.."
ripplekv eval --suite needle --needle-lengths 1024,2048,4096 --needle-depths 0,0.25,0.5,0.75,1 \
  --needle-digits 4 --limit 3 --seed 0 \
  --methods full,streamingllm,snapkv,pyramidkv,adakv,ripplekv,ripplekv-local --budgets 0.1,0.2,0.3 --score both \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/needle-decoded "$@"
