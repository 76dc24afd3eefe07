#!/usr/bin/env bash
# Issue 43: the pooled layout (every layer in one KV-cache group, at 92a4c75 and later) serves exactly what the plugin
# with one KV-cache group per layer served (at dc420e4, ../smollm2-135m/ripplekv-0.2.json): SmolLM2-135M, the 48
# library-vs-served prompts at 20%, each request forced along the library's full-cache answer, against the same
# recorded full-cache references (the per-group run's, kept in /tmp on the machine that made them).
# Result (compare.txt): every per-token KL of all 48 prompts equal, max |difference| 0.0.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=benchmarks/results/serving-library-vs-served/pooled-check
RUN=$(mktemp -d)
cp benchmarks/results/serving-library-vs-served/smollm2-135m/{full,snapkv-0.2}.json "$RUN/"
MODEL_DIR=$(.venv/bin/python -c "from ripplekv.models.loading import ensure_converted; from ripplekv.models.sources \
import resolve_model_source; print(ensure_converted(resolve_model_source('smollm2-135m')[1]))")
OMP_NUM_THREADS=1 nice -n 10 .venv-vllm/bin/python benchmarks/serving/served_fidelity.py \
  --answers benchmarks/results/serving-granularity/smollm2-135m/answers.jsonl --model-dir "$MODEL_DIR" \
  --profile benchmarks/results/smollm2-135m.profile.json --groups layer --budgets 0.2 \
  --fidelity-dir /tmp/ripplekv-served-fidelity-smollm2-135m --out "$RUN"
cp "$RUN/ripplekv-0.2.json" "$OUT/"
python3 - "$OUT/ripplekv-0.2.json" benchmarks/results/serving-library-vs-served/smollm2-135m/ripplekv-0.2.json <<'PY' | tee "$OUT/compare.txt"
import json, sys
new, old = (json.load(open(path))["rows"] for path in sys.argv[1:3])
worst = max(abs(a - b) for key in new for a, b in zip(new[key]["kl_tokens"], old[key]["kl_tokens"]))
print(f"{len(new)} prompts; max |per-token KL, pooled - per-group| = {worst}")
PY
