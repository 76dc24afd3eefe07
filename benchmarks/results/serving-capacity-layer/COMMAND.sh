#!/usr/bin/env bash
# Issue 43, items 3, 4 and 7: the capacity benchmark of serving-capacity-decode (the decode-heavy mix: 24 requests of
# 2,048-3,072 BAMBOO context tokens, 256 greedy tokens each, one 370 MiB KV cache, max_num_seqs 24) rerun with the
# plugin as it now serves: each layer's own budget at each prompt's own length, every layer in one KV-cache group (the
# pooled layout, ripplekv_vllm/pool.py), and the profile's r and gamma. (The full-cache run, stock vLLM, ran before the
# pooled layout; it does not involve the plugin.) SmolLM2-135M float32, vLLM 0.32.0 CPU build, one OpenMP thread, nice 10, this shared 2-core machine.
# Twice: prompts prefilled in one step (as before), and under vLLM's chunked prefill at 512 tokens a step, for the
# time per output token with and without chunking. Every configuration runs in a fresh process and writes its JSON
# when it finishes; re-running skips finished configurations.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=benchmarks/results/serving-capacity-layer
COMMON=(--budgets 0.1 0.2 0.3 --requests 24 --min-tokens 2048 --max-tokens 3072 --max-new-tokens 256
  --max-model-len 3584 --kv-mib 370 --groups layer)
OMP_NUM_THREADS=1 nice -n 10 .venv-vllm/bin/python benchmarks/serving.py "${COMMON[@]}" --out "$OUT/one-step" "$@"
OMP_NUM_THREADS=1 nice -n 10 .venv-vllm/bin/python benchmarks/serving.py "${COMMON[@]}" --chunked-prefill 512 \
  --out "$OUT/chunked-512" "$@"
# Qwen2.5-Coder-0.5B (item 7), served with its regenerated profile (the setting `ripplekv profile` chose, r 16,
# gamma 6, which the plugin reads from it): the same mix made smaller for a model 4x slower per token (16 requests,
# 128 tokens each) in a KV cache of about three of its full-cache requests (its KV is 24 KiB a token: 200 MiB).
QWEN_DIR=$(.venv/bin/python -c "from ripplekv.models.loading import ensure_converted; from ripplekv.models.sources \
import resolve_model_source; print(ensure_converted(resolve_model_source('qwen2.5-coder-0.5b')[1]))")
OMP_NUM_THREADS=1 nice -n 10 .venv-vllm/bin/python benchmarks/serving.py --model-dir "$QWEN_DIR" \
  --profile benchmarks/results/qwen2.5-coder-0.5b/profile-setting/qwen2.5-coder-0.5b.profile.json \
  --budgets 0.1 0.2 0.3 --requests 16 --min-tokens 2048 --max-tokens 3072 --max-new-tokens 128 \
  --max-model-len 3584 --kv-mib 200 --groups layer --out "$OUT/qwen2.5-coder-0.5b" "$@"
