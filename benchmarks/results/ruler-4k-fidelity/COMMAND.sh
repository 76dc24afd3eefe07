#!/usr/bin/env bash
# Fidelity to the full cache on the RULER-style suite at 4K tokens, SmolLM2-135M: every method x 10/20/30%.
# Re-running resumes where the last run stopped.
# Sampling: all 14 tasks x 10 generated samples (seeds derived from --seed 0): 140 prompts, contexts sized to at
# most 4,096 tokens with the model's tokenizer, question-aware compression. --score fidelity: only the full cache
# decodes (each task's own answer cap, 32 or 64 tokens, first token never a stop token); every compressed
# configuration is scored by teacher-forcing that answer (KL(full || method), top-1 agreement) and the gold answer
# (NLL change). The task scores of the compressed configurations come from ../ruler-4k-decoded (--score both).
cd "$(dirname "$0")/../../.."
ripplekv eval --suite ruler --context-tokens 4096 --limit 10 --seed 0 \
  --methods full,streamingllm,snapkv,pyramidkv,adakv,ripplekv,ripplekv-local --budgets 0.1,0.2,0.3 --score fidelity \
  --profile benchmarks/results/smollm2-135m.profile.json --out benchmarks/results/ruler-4k-fidelity "$@"
