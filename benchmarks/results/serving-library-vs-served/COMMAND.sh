#!/usr/bin/env bash
# Issue 43, item 2: served fidelity against the library's on the same prompts and answers. The vLLM environment serves
# granularity.py's 48 held-out BAMBOO prompts (benchmarks/results/serving-granularity/<model>/answers.jsonl) under the
# full cache, SnapKV-uniform and RippleKV (one KV-cache group per layer, the plugin's default) at 10/20/30%, each request
# forced along the library's full-cache answer; library_vs_served.py (main environment) puts the library's and the
# engine's KL side by side. Each configuration is a fresh engine process whose JSON is written when it finishes:
# re-running resumes. The full cache's recorded distributions go to /tmp (about 0.3 GB for SmolLM2). (6 tiers were
# dropped after the 10% runs: served equals the library at the served budgets, and granularity.py has the library's
# rows of every tier design.)
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=benchmarks/results/serving-library-vs-served
GRAN=benchmarks/results/serving-granularity
model_dir() { .venv/bin/python -c "from ripplekv.models.loading import ensure_converted; from ripplekv.models.sources \
import resolve_model_source; print(ensure_converted(resolve_model_source('$1')[1]))"; }
OMP_NUM_THREADS=1 nice -n 10 .venv-vllm/bin/python benchmarks/serving/served_fidelity.py \
  --answers "$GRAN/smollm2-135m/answers.jsonl" --model-dir "$(model_dir smollm2-135m)" \
  --profile benchmarks/results/smollm2-135m.profile.json --groups layer --out "$OUT/smollm2-135m"
.venv/bin/python benchmarks/serving/library_vs_served.py --library "$GRAN/smollm2-135m" --served "$OUT/smollm2-135m" \
  --model smollm2-135m --out "$OUT/smollm2-135m.md"
OMP_NUM_THREADS=1 nice -n 10 .venv-vllm/bin/python benchmarks/serving/served_fidelity.py \
  --answers "$GRAN/qwen2.5-coder-0.5b/answers.jsonl" --model-dir "$(model_dir qwen2.5-coder-0.5b)" \
  --profile benchmarks/results/qwen2.5-coder-0.5b/qwen2.5-coder-0.5b.profile.json --settings 4,3 16,30 \
  --groups layer --out "$OUT/qwen2.5-coder-0.5b"
.venv/bin/python benchmarks/serving/library_vs_served.py --library "$GRAN/qwen2.5-coder-0.5b" \
  --served "$OUT/qwen2.5-coder-0.5b" --model qwen2.5-coder-0.5b --out "$OUT/qwen2.5-coder-0.5b.md"
