#!/usr/bin/env bash
# Issue 17, run (b): every per-layer allocation family at SnapKV's total under SnapKV's and ExpectedAttention's
# token scorers, fidelity to the full cache on the RULER-style suite at 4K tokens, SmolLM2-135M, 10/20/30%,
# question-aware. The prompts of ruler-4k-fidelity: all 14 tasks x 10 generated samples (--seed 0), contexts sized
# to at most 4,096 tokens. Every configuration of a prompt is derived from its one prefill.
# Re-running resumes where the last run stopped.
cd "$(dirname "$0")/../../.."
ripplekv eval --suite ruler --context-tokens 4096 --limit 10 --seed 0 \
  --methods full,snapkv,pyramidkv,cake,squeezeattention,dynamickv,lava,ripplekv,ripplekv-local --budgets 0.1,0.2,0.3 \
  --scorers snapkv,expected_attention --score fidelity \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/allocators-ruler-4k "$@"
