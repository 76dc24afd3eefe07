#!/usr/bin/env bash
# Issue 27: the RippleKV vLLM plugin against the library. The library's SnapKV (kvpress) at the plugin's realised
# per-layer budgets, kept positions per head (main environment), then the plugin's kept sets and greedy tokens
# against them (vLLM environment: benchmarks/serving/install_vllm_env.sh, then benchmarks/serving/test.sh installs
# the plugin). 4 BAMBOO prompts of 300-1,200 tokens, profile benchmarks/results/smollm2-135m.profile.json, budget 0.2,
# 3 tiers, 24 greedy tokens.
cd "$(dirname "$0")/../../.."
python benchmarks/serving/ripple_reference.py --out benchmarks/results/vllm-plugin-compare/ripple-reference.json
.venv-vllm/bin/python benchmarks/serving/ripple_compare.py \
  --reference benchmarks/results/vllm-plugin-compare/ripple-reference.json --out benchmarks/results/vllm-plugin-compare
