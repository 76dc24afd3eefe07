#!/usr/bin/env bash
# Issue 26, tuned matrix on the RULER-style suite at 4K: the prompts of allocators-ruler-4k (14 tasks x 10 samples,
# --seed 0; the tuning drew its prompts with --seed 1) with every allocation family at the setting two tuning passes
# chose on RULER calibration prompts (tune-fair-ruler-4k, then tune-fair-ruler-4k-edges past its grid edges; a
# method's setting is its lowest calibration KL averaged over the three budgets; SqueezeAttention's first choice,
# its default p, was inside its grid and had no second pass). SnapKV's scorer only: the settings were tuned under
# it. RippleKV's local-signal ablation takes RippleKV's tuned r and gamma. The default-setting run stays in
# allocators-ruler-4k. Every configuration of a prompt is derived from its one prefill.
# Re-running resumes where the last run stopped.
cd "$(dirname "$0")/../../.."
ripplekv eval --suite ruler --context-tokens 4096 --limit 10 --seed 0 \
  --methods 'full,snapkv,pyramidkv:beta=1,cake:tau1=8,tau2=0.25,window=64,squeezeattention,dynamickv:radio_max=1.5,window=128,lava:window=128,floor_alpha=0,lava-layer:window=128,ripplekv:r=64,gamma=60,ripplekv-local:r=64,gamma=60' \
  --budgets 0.1,0.2,0.3 --scorers snapkv --score fidelity \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/allocators-ruler-4k-tuned "$@"
