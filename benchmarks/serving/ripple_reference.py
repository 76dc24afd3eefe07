"""The library's RippleKV generations at the vLLM plugin's realised budgets, with the kept positions of each head.

Run in the main environment (transformers 5.2 + kvpress), never in the vLLM one; ``ripple_compare.py`` then serves
the same prompts with the plugin in the vLLM environment and compares the two, layer by layer and head by head:

    python benchmarks/serving/ripple_reference.py --out /tmp/ripple-reference.json
    .venv-vllm/bin/python benchmarks/serving/ripple_compare.py --reference /tmp/ripple-reference.json --out DIR

The plugin keeps, per layer tier, a block-aligned share of each prompt: ``k`` SnapKV-selected tokens of the
prompt's full blocks ``[0, T)`` and the partial tail block ``[T, N)`` (``serving/src/ripplekv_vllm/hole.py``), i.e.
``k + N - T`` tokens. Here the library's own press (:class:`ripplekv.presses.LayerBudgetPress` with kvpress's
``SnapKVPress``, window 64, kernel 5) runs with exactly those per-layer budgets (a fixed schedule), and the positions
each head keeps are recorded. The budgets come from the same profile and settings as the plugin's
(``ripplekv_vllm.budgets``, imported from ``serving/src``: it needs no vLLM). The prompts are BAMBOO contexts
(``benchmarks/heldout/bamboo.jsonl``) cut to a few lengths.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from kvpress import SnapKVPress

from ripplekv.allocation.budget import BudgetSchedule
from ripplekv.inference.generate import greedy_decode, prefill
from ripplekv.models import load_model
from ripplekv.models.loading import ensure_converted
from ripplekv.models.sources import smollm2_gguf_path
from ripplekv.presses import LayerBudgetPress
from ripplekv.presses.layer_budget_press import global_schedule
from ripplekv.profiling.profile import SensitivityProfile

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "serving" / "src"))  # ripplekv_vllm.budgets / .hole: no vLLM import

from ripplekv_vllm.budgets import ProfileBudgets, layer_groups  # noqa: E402

BAMBOO = ROOT / "benchmarks" / "heldout" / "bamboo.jsonl"
PROFILE = ROOT / "benchmarks" / "results" / "smollm2-135m.profile.json"
PROMPTS = (("bamboo0-1000", 0, 1000), ("bamboo1-600", 1, 600), ("bamboo2-300", 2, 300), ("bamboo3-1200", 3, 1200))
BLOCK, WINDOW, KERNEL = 32, 64, 5


@dataclass(frozen=True)
class FixedBudgets(BudgetSchedule):
    """Given per-layer token budgets of one prompt length (the plugin's realised budgets).

    Attributes:
        budgets: tokens kept by each layer.
        prompt_tokens: the prompt length they are for.
    """

    budgets: tuple[int, ...] = ()
    prompt_tokens: int = 0
    budget: float | None = None
    tokens: int | None = field(default=None)

    def layer_budgets(self, n_layers: int, prompt_tokens: int, floor: int) -> tuple[int, ...]:
        """The given budgets (the prompt must be the one they were computed for)."""
        assert prompt_tokens == self.prompt_tokens and n_layers == len(self.budgets), (prompt_tokens, n_layers)
        return self.budgets


@dataclass
class RecordingPress(LayerBudgetPress):
    """``LayerBudgetPress`` that records, per layer, the sorted positions each KV head keeps."""

    kept: dict[int, list[list[int]]] = field(default_factory=dict)

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):  # noqa: ANN001, ANN201
        """Compress as the library does, after recording what ``scores.topk`` keeps (the same call, same scores)."""
        from ripplekv.allocation.budget import compression_ratio_keeping
        from ripplekv.presses.layer_budget_press import scorer_at_ratio

        schedule, layers = global_schedule(self.schedule, module.config)
        k_len = keys.shape[2]
        n_kept = schedule.layer_budgets(len(layers), k_len, self.floor)[layers.index(module.layer_idx)]
        if n_kept < k_len:
            scorer = scorer_at_ratio(self.press, compression_ratio_keeping(n_kept, k_len))
            scores = scorer.score(module, hidden_states, keys, values, attentions, kwargs)
            indices = scores.topk(n_kept, dim=-1).indices[0].sort(dim=-1).values
            self.kept[int(module.layer_idx)] = indices.tolist()
        return super().compress(module, hidden_states, keys, values, attentions, kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=0.2)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args()
    model, tokenizer = load_model("smollm2-135m", dtype="float32", device="cpu")
    scores = SensitivityProfile.load(PROFILE).scores
    served = ProfileBudgets(layer_groups(len(scores)), scores, args.budget, 4.0, 3.0, BLOCK, WINDOW)
    records = [json.loads(line) for line in BAMBOO.read_text().splitlines() if line.strip()]
    rows = []
    for name, index, length in PROMPTS:
        ids = tokenizer(records[index]["context"], add_special_tokens=False).input_ids[:length]
        n = len(ids)
        bounds = [served.hole(n, layer) for layer in range(len(scores))]
        budgets = served.layer_budgets(n)
        press = RecordingPress(press=SnapKVPress(window_size=WINDOW, kernel_size=KERNEL))
        press.schedule = FixedBudgets(budgets=budgets, prompt_tokens=n)
        state = prefill(model, torch.tensor([ids]), press=press)
        tokens = greedy_decode(model, state, args.max_new_tokens, set())
        full = greedy_decode(model, prefill(model, torch.tensor([ids])), args.max_new_tokens, set())
        rows.append(
            {
                "name": name,
                "prompt_ids": ids,
                "budgets": list(budgets),
                "holes": [list(b) for b in bounds],
                "kept": {str(layer): heads for layer, heads in sorted(press.kept.items())},
                "output_ids": tokens,
                "full_cache_ids": full,
            }
        )
        print(
            f"{name}: {n} tokens, budgets {sorted(set(budgets))}, {sum(t != f for t, f in zip(tokens, full))} "
            f"of {len(tokens)} tokens differ from the full cache's"
        )
    import transformers

    payload = {
        "model_dir": str(ensure_converted(smollm2_gguf_path())),
        "transformers": transformers.__version__,
        "settings": {
            "profile": str(PROFILE),
            "budget": args.budget,
            "window": WINDOW,
            "kernel_size": KERNEL,
        },
        "block_size": BLOCK,
        "max_new_tokens": args.max_new_tokens,
        "prompts": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload) + "\n")


if __name__ == "__main__":
    main()
