#!/usr/bin/env bash
# Issue 44 on SmolLM2-135M: the profile regenerated as benchmarks/results/smollm2-135m.profile.json was made (essays,
# 8 x 2,048 + 32 tokens, alpha 0.5, seed 0), now with its chosen r and gamma and their evidence, then judged on
# held-out BAMBOO against the default, the settings `ripplekv tune` chose for SmolLM2 (tune-fair-longbench:
# ripplekv:gamma=6; tune-fair-ruler-4k: ripplekv:r=32,gamma=30), SnapKV and PyramidKV
# (benchmarks/profile_setting_check.sh). The committed profile is left as it is: every committed run fingerprints it.
set -eo pipefail
cd "$(dirname "$0")/../../../.."
bash benchmarks/profile_setting_check.sh smollm2-135m benchmarks/results/smollm2-135m/profile-setting \
  benchmarks/results/smollm2-135m.profile.json \
  benchmarks/results/tune-fair-longbench/tune.json benchmarks/results/tune-fair-ruler-4k/tune.json -- "$@"
