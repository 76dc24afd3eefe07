#!/usr/bin/env bash
# Issue 27, the serving benchmark: 16 concurrent requests of 2,048-3,900 BAMBOO context tokens (+ question, chat
# template), 64 greedy tokens each, one 1 GiB KV cache (VLLM_CPU_KVCACHE_SPACE=1), full cache (stock vLLM) against
# SnapKV-uniform and RippleKV (profile benchmarks/results/smollm2-135m.profile.json, 3 tiers) at a 20% budget under the
# plugin, SmolLM2-135M float32 on the CPU build of vLLM 0.32.0. Every configuration in a fresh process; finished
# configurations are kept and skipped when re-run (delete their JSON to measure again).
cd "$(dirname "$0")/../../.."
.venv-vllm/bin/python benchmarks/serving.py --budget 0.2 --requests 16 --min-tokens 2048 --max-tokens 3900 \
  --max-new-tokens 64 --kv-gib 1 --out benchmarks/results/serving "$@"
