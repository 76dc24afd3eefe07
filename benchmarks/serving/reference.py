"""Greedy reference generations of SmolLM2-135M in the library's own environment, for the vLLM probe.

Run in the main environment (transformers 5.2 + kvpress), never in the vLLM one:

    python benchmarks/serving/reference.py --out benchmarks/results/vllm-probe/reference.json

The prompts are three short chat prompts and BAMBOO documents (benchmarks/heldout/bamboo.jsonl) cut to about 1K and
3K tokens, with their question, in the chat template the evaluation uses (:func:`chat_prompt_parts`). Each prompt
is prefilled with the full cache and decoded greedily (:func:`greedy_decode`, the evaluation's loop). The JSON
holds the model directory the library converted the GGUF to (the same weights vLLM loads), every prompt's token
ids and the greedy token ids, so the vLLM side feeds identical ids and compares ids, not text.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ripplekv.inference.generate import chat_prompt_parts, eos_ids, greedy_decode, prefill
from ripplekv.models import load_model
from ripplekv.models.loading import ensure_converted
from ripplekv.models.sources import smollm2_gguf_path

ROOT = Path(__file__).resolve().parents[2]
BAMBOO = ROOT / "benchmarks" / "heldout" / "bamboo.jsonl"
SHORT = (
    ("capital", "What is the capital of France? Answer in one sentence."),
    ("code", "Write a Python function that returns the n-th Fibonacci number."),
    ("story", "Tell a two-sentence story about a lighthouse keeper."),
)
LONG = (("bamboo-1k", 0, 1000), ("bamboo-3k", 1, 3000))  # (name, record index, context tokens kept)


def prompts(tokenizer) -> list[tuple[str, list[int]]]:
    """(name, token ids) of every probe prompt."""
    out: list[tuple[str, list[int]]] = []
    for name, question in SHORT:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        out.append((name, tokenizer(text, add_special_tokens=False).input_ids))
    records = [json.loads(line) for line in BAMBOO.read_text().splitlines() if line.strip()]
    for name, index, keep in LONG:
        record = records[index]
        ids = tokenizer(record["context"], add_special_tokens=False).input_ids[:keep]
        context = tokenizer.decode(ids)
        head, tail = chat_prompt_parts(tokenizer, context, record["question"])
        out.append((name, tokenizer(head + tail, add_special_tokens=False).input_ids))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    model, tokenizer = load_model("smollm2-135m", dtype="float32", device="cpu")
    stop = eos_ids(model, tokenizer)
    rows = []
    for name, ids in prompts(tokenizer):
        state = prefill(model, torch.tensor([ids]))
        tokens = greedy_decode(model, state, args.max_new_tokens, stop)
        rows.append({"name": name, "prompt_ids": ids, "output_ids": tokens, "text": tokenizer.decode(tokens)})
        print(f"{name}: {len(ids)} prompt tokens -> {tokenizer.decode(tokens)!r}")
    import transformers

    payload = {
        "model_dir": str(ensure_converted(smollm2_gguf_path())),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "max_new_tokens": args.max_new_tokens,
        "stop_ids": sorted(stop),
        "prompts": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
