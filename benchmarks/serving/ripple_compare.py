"""The RippleKV vLLM plugin against the library: kept positions, layer by layer and head by head, then tokens.

Run in the vLLM environment after ``ripple_reference.py`` (main environment) wrote the library's side:

    .venv-vllm/bin/python benchmarks/serving/ripple_compare.py --reference /tmp/ripple-reference.json --out DIR

The plugin serves each reference prompt alone (in-process engine, float32, eager, 32-token blocks, the reference's
profile and budget as ``additional_config["ripplekv"]``, one group per layer), records the positions every
compaction keeps (``ripplekv_vllm.backend.observe_kept``) and adds the prompt's tail block ``[T, N)``, which stays
in place. For each layer and KV head the kept set is compared with the library's (SnapKV at the same per-layer
budget ``k + N - T``), then the greedy tokens (``ignore_eos``) are compared, and the prompts are served once more as
one concurrent batch. ``DIR/compare.json`` holds every count; ``DIR/compare.txt`` a summary.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm_probe import first_difference  # noqa: E402  (the probe beside this script; it imports no vLLM at import)


def compare_kept(plugin: dict[int, list[set[int]]], library: dict[int, list[set[int]]]) -> dict[str, Any]:
    """Per (layer, head): equal sets, and for unequal ones the positions kept by one side only.

    Args:
        plugin: per layer, per head, the plugin's kept positions (compacted ones and the tail).
        library: the same for the library.
    """
    pairs = equal = 0
    diffs = []
    for layer in sorted(set(plugin) | set(library)):
        for head, (ours, theirs) in enumerate(zip(plugin.get(layer, []), library.get(layer, []))):
            pairs += 1
            if ours == theirs:
                equal += 1
            else:
                diffs.append(
                    {
                        "layer": layer,
                        "head": head,
                        "plugin_only": sorted(ours - theirs),
                        "library_only": sorted(theirs - ours),
                        "size": len(ours),
                    }
                )
    missing = sorted(set(plugin) ^ set(library))
    return {"pairs": pairs, "equal": equal, "differing": diffs, "layers_on_one_side_only": missing}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    reference = json.loads(args.reference.read_text())

    import ripplekv_vllm
    import vllm
    from ripplekv_vllm.backend import observe_kept
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    ripplekv_vllm.register()
    bs = int(reference["block_size"])
    settings = {k: v for k, v in reference["settings"].items() if k in ("profile", "budget", "window", "kernel_size")}
    llm = LLM(
        model=reference["model_dir"],
        dtype="float32",
        max_model_len=2048,
        max_num_batched_tokens=8192,
        enforce_eager=True,
        seed=0,
        enable_prefix_caching=False,
        enable_chunked_prefill=False,
        block_size=bs,
        worker_cls=ripplekv_vllm.WORKER_CLS,
        additional_config={"ripplekv": settings},
    )
    config = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.ripple_config
    params = SamplingParams(temperature=0.0, max_tokens=int(reference["max_new_tokens"]), ignore_eos=True)
    rows, alone = [], []
    for row in reference["prompts"]:
        ids, n = row["prompt_ids"], len(row["prompt_ids"])
        kept: dict[int, list[set[int]]] = {}

        def record(layer_name: str, batch_row: int, indices, _kept=kept, _n=n) -> None:  # noqa: ANN001
            layer = int(layer_name.split(".layers.")[1].split(".")[0])
            full = _n // bs * bs
            _kept[layer] = [set(indices[:, h].tolist()) | set(range(full, _n)) for h in range(indices.shape[1])]

        observe_kept(record)
        output = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
        observe_kept(None)
        tokens = list(output.outputs[0].token_ids)
        alone.append(tokens)
        library = {int(layer): [set(h) for h in heads] for layer, heads in row["kept"].items()}
        budgets_equal = list(config.budgets.layer_budgets(n)) == row["budgets"]
        sets = compare_kept(kept, library)
        rows.append(
            {
                "name": row["name"],
                "prompt_tokens": n,
                "budgets_equal": budgets_equal,
                "kept": sets,
                "plugin_ids": tokens,
                "library_ids": row["output_ids"],
                "first_difference": first_difference(tokens, row["output_ids"]),
                "library_full_cache_first_difference": first_difference(row["output_ids"], row["full_cache_ids"]),
            }
        )
    batch = llm.generate(
        [TokensPrompt(prompt_token_ids=r["prompt_ids"]) for r in reference["prompts"]], params, use_tqdm=False
    )
    for row, out, solo in zip(rows, batch, alone):
        row["concurrent_equal_to_alone"] = list(out.outputs[0].token_ids) == solo
    result = {"vllm": vllm.__version__, "settings": settings, "block_size": bs, "prompts": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "prompt | tokens | (layer, head) pairs with equal kept sets | tokens equal | first difference | "
        "library vs its full cache | concurrent = alone"
    ]
    for r in rows:
        k = r["kept"]
        lines.append(
            f"{r['name']} | {r['prompt_tokens']} | {k['equal']}/{k['pairs']} | {r['plugin_ids'] == r['library_ids']} "
            f"| {r['first_difference']} | {r['library_full_cache_first_difference']} | {r['concurrent_equal_to_alone']}"
        )
        for d in k["differing"][:6]:
            lines.append(
                f"    layer {d['layer']} head {d['head']}: plugin only {d['plugin_only'][:8]}, "
                f"library only {d['library_only'][:8]} (of {d['size']})"
            )
    (args.out / "compare.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
