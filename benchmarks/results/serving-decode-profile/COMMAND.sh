#!/usr/bin/env bash
# Issue 43, item 3: where a decode step's time goes, SnapKV-uniform against RippleKV's per-layer budgets (and tiers),
# side by side: SmolLM2-135M float32, 12 BAMBOO prompts of 1,024 tokens, 96 greedy tokens
# each, budget 20%, one engine per configuration in one process stepped in turn (this shared 2-core machine was
# running other benchmarks; the turn-taking slows every engine alike). Two runs at the same commit.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=benchmarks/results/serving-decode-profile
# Since the pooled layout (every layer in one KV-cache group, each layer's kept blocks packed into the pages of the
# request's block ids; ripplekv_vllm/pool.py): SnapKV-uniform and RippleKV per layer, SmolLM2 (one other benchmark,
# the served-fidelity run, on the machine's other core).
OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/serving/decode_profile.py \
  --configs snapkv ripplekv-layer --out "$OUT/pooled"
# The capacity run's decode-only ratio moved with the machine's load (its configurations run one after another); the
# same comparison at its request count and prompt length, the two engines stepped in turn, at 20% and 30%.
for BUDGET in 0.2 0.3; do
  OMP_NUM_THREADS=1 nice -n 10 .venv-vllm/bin/python benchmarks/serving/decode_profile.py --configs snapkv ripplekv-layer \
    --requests 24 --tokens 2048 --max-new-tokens 96 --budget "$BUDGET" --out "$OUT/pooled-24x2048-$BUDGET"
done
# The runs below are of the plugin before the pooled layout (one KV-cache group per layer or tier, at dc420e4).
OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/serving/decode_profile.py \
  --configs snapkv ripplekv-layer ripplekv-tiers-6 ripplekv-tiers-10 --out "$OUT/layer-tiers6-tiers10"
OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/serving/decode_profile.py \
  --configs snapkv ripplekv-layer ripplekv-tiers-15 ripplekv-tiers-10 --out "$OUT/layer-tiers15-tiers10"
# Qwen2.5-Coder-0.5B (24 layers; 4x SmolLM2's compute per token), the same workload: SnapKV-uniform, one group per
# layer and 6 tiers (run while other benchmarks shared the machine).
QWEN_DIR=$(.venv/bin/python -c "from ripplekv.models.loading import ensure_converted; from ripplekv.models.sources \
import resolve_model_source; print(ensure_converted(resolve_model_source('qwen2.5-coder-0.5b')[1]))")
OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/serving/decode_profile.py --model-dir "$QWEN_DIR" \
  --profile benchmarks/results/qwen2.5-coder-0.5b/qwen2.5-coder-0.5b.profile.json \
  --configs snapkv ripplekv-layer ripplekv-tiers-6 --budget 0.2 --out "$OUT/qwen2.5-coder-0.5b"
