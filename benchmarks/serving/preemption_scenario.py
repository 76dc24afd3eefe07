"""Issue 34's preemption scenario on SmolLM2-135M: each answer under load against the same request served alone.

Four 600-token BAMBOO prompts arrive at engine steps 0/2/4/6 into a 91-block pool (3 RippleKV tiers at 20%), 300
greedy tokens each, so at least one request is preempted (recomputed); then each request is served alone in the
same engine. Prints the preemptions and, per request, whether the tokens are equal and the largest log-probability
difference. Runs in the vLLM environment with the plugin installed (``benchmarks/serving/test.sh`` installs it):

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/serving/preemption_scenario.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, str(ROOT / "serving" / "tests"))  # the engine tests' helpers


def main() -> None:
    """Serve the scenario under load and alone, and print how each answer compares."""
    from engine_support import close, drive, ripple_llm
    from tokenizers import Tokenizer

    reference = ROOT / "benchmarks" / "results" / "vllm-probe" / "reference.json"
    model = json.loads(reference.read_text())["model_dir"]
    tokenizer = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
    lines = (ROOT / "benchmarks" / "heldout" / "bamboo.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    prompts = {f"r{i}": tokenizer.encode(records[i]["context"], add_special_tokens=False).ids[:600] for i in range(4)}
    profile = ROOT / "benchmarks" / "results" / "smollm2-135m.profile.json"
    settings = {"profile": str(profile), "budget": 0.2, "groups": 3}
    llm = ripple_llm(model, settings, num_gpu_blocks_override=91, max_model_len=960, max_num_batched_tokens=960)
    try:
        loaded = drive(llm, prompts, 300, arrivals={f"r{i}": 2 * i for i in range(4)})
        print("preemptions", loaded.preemptions, flush=True)
        for name, ids in prompts.items():
            alone = drive(llm, {name: ids}, 300).requests[name]
            served = loaded.requests[name]
            worst = max(abs(a - b) for a, b in zip(served.logprobs, alone.logprobs))
            print(name, "tokens equal", served.tokens == alone.tokens, "max |logprob difference|", worst, flush=True)
    finally:
        close(llm)


if __name__ == "__main__":
    main()
