#!/usr/bin/env bash
# Issue 34, the capacity benchmark, as a small run on the shared 2-core machine (the issue's decode-heavy mix of
# 2-4K-token prompts and 256+ output tokens is out of reach there): 10 requests of 768-1,024 BAMBOO context tokens
# (+ question, chat template), 96 greedy tokens each, all submitted at once into one 96 MiB KV cache (vLLM's
# kv_cache_memory_bytes: about two full-cache requests), full cache (stock vLLM) against SnapKV-uniform and RippleKV
# (profile benchmarks/results/smollm2-135m.profile.json, 3 tiers) at 10/20/30% under the plugin, SmolLM2-135M
# float32 on the CPU build of vLLM 0.32.0. Every configuration in a fresh process; finished configurations are kept
# and skipped when re-run (delete their JSON to measure again).
cd "$(dirname "$0")/../../.."
OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/serving.py --budgets 0.1 0.2 0.3 --requests 10 --min-tokens 768 \
  --max-tokens 1024 --max-new-tokens 96 --max-model-len 1536 --kv-mib 96 --out benchmarks/results/serving-capacity "$@"
