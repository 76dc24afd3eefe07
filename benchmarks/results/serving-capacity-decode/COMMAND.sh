#!/usr/bin/env bash
# Issue 34, item 5: the capacity benchmark on the decode-heavy mix, in one run (SmolLM2-135M float32, vLLM 0.32.0 CPU
# build, this shared 2-core machine at nice 10, one OpenMP thread). 24 requests of 2,048-3,072 BAMBOO context tokens
# (+ question, chat template) submitted at once, 256 greedy tokens each (ignore_eos), into one 370 MiB KV cache for
# every configuration (vLLM's kv_cache_memory_bytes: 262 blocks of 32 tokens over all layers, about three full-cache
# requests), max_num_seqs 24 (never below the request count). Full cache (stock vLLM) against SnapKV-uniform and
# RippleKV (profile benchmarks/results/smollm2-135m.profile.json, 3 tiers) at 10/20/30% under the plugin. The full
# cache records each output token's distribution; each compressed configuration is teacher-forced along the full
# cache's answers (ripplekv_vllm.fidelity.TeacherForcing) and reports KL(full || compressed) per token and its own
# top tokens. Every configuration runs in a fresh process and writes its JSON when it finishes; re-running skips
# finished configurations (delete a JSON to measure it again; without full.json every JSON must go, since the
# compressed rows compare with it).
cd "$(dirname "$0")/../../.."
OMP_NUM_THREADS=1 nice -n 10 .venv-vllm/bin/python benchmarks/serving.py --budgets 0.1 0.2 0.3 --requests 24 \
  --min-tokens 2048 --max-tokens 3072 --max-new-tokens 256 --max-model-len 3584 --kv-mib 370 \
  --out benchmarks/results/serving-capacity-decode "$@"
# The full cache once more, alone, for the split of its time into prefill steps and decode-only steps (the field was
# added to benchmarks/serving.py while the run above was under way, after its full and 10% configurations had run;
# its tokens are checked against full.json's). Skipped when full-timing.json exists.
if [ ! -e benchmarks/results/serving-capacity-decode/full-timing.json ]; then
  MODEL_DIR=$(.venv-vllm/bin/python -c "import json; print(json.load(open('benchmarks/results/vllm-probe/reference.json'))['model_dir'])")
  VLLM_PLUGINS="" OMP_NUM_THREADS=1 nice -n 10 .venv-vllm/bin/python benchmarks/serving.py --budgets 0.1 0.2 0.3 \
    --requests 24 --min-tokens 2048 --max-tokens 3072 --max-new-tokens 256 --max-model-len 3584 --kv-mib 370 \
    --out /tmp/ripplekv-serving-full-timing --config full --model-dir "$MODEL_DIR" \
    --fidelity-dir /tmp/ripplekv-serving-fidelity/full-timing
  cp /tmp/ripplekv-serving-full-timing/full.json benchmarks/results/serving-capacity-decode/full-timing.json
fi
