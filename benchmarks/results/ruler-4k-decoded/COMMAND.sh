#!/usr/bin/env bash
# Task scores on the RULER-style suite at 4K tokens, SmolLM2-135M: every method x 10/20/30%.
# Re-running resumes where the last run stopped.
# Sampling: all 14 tasks x 5 generated samples (seeds derived from --seed 0; the first 5 of ../ruler-4k-fidelity's
# 10 per task): 70 prompts, contexts sized to at most 4,096 tokens with the model's tokenizer, question-aware
# compression, each task's own answer cap (32 or 64 tokens, first token never a stop token). --score both: every
# configuration is decoded greedily (the full cache's first, then all compressed configurations of a prompt as one
# batch, --decode batched) and scored with the task's metric; fidelity is recorded too.
cd "$(dirname "$0")/../../.."
ripplekv eval --suite ruler --context-tokens 4096 --limit 5 --seed 0 \
  --methods full,streamingllm,snapkv,pyramidkv,adakv,ripplekv,ripplekv-local --budgets 0.1,0.2,0.3 --score both \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/ruler-4k-decoded "$@"
