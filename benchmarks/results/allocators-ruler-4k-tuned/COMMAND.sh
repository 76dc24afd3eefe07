#!/usr/bin/env bash
# Issue 26, the RULER matrix at tuned settings: every per-layer allocation family at SnapKV's total, each method at
# the setting tune-fair-ruler-4k chose for it on its calibration prompts (tune.json "settings": the lowest
# calibration KL averaged over 10/20/30%), RippleKV's local-signal ablation at RippleKV's tuned r/gamma.
# The prompts of allocators-ruler-4k (all 14 tasks x 10 generated samples, --seed 0; the tuning used --seed 1),
# 4,096-token contexts, question-aware, fidelity to the full cache, SmolLM2-135M. SnapKV's token scorer only: the
# settings were tuned under it (allocators-ruler-4k, at the authors' defaults, also ran ExpectedAttention).
# Every configuration of a prompt is derived from its one prefill. Re-running resumes where the last run stopped.
cd "$(dirname "$0")/../../.."
ripplekv eval --suite ruler --context-tokens 4096 --limit 10 --seed 0 \
  --methods 'full,snapkv,pyramidkv:beta=5,cake:tau1=2,tau2=0.5,window=64,squeezeattention,dynamickv:radio_max=2,window=64,lava:window=64,floor_alpha=0.1,lava-layer,ripplekv:r=32,gamma=30,ripplekv-local:r=32,gamma=30' \
  --budgets 0.1,0.2,0.3 --scorers snapkv --score fidelity \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/allocators-ruler-4k-tuned "$@"
