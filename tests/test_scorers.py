"""Every kvpress 0.5.5 ScorerPress under a RippleKV schedule: which run on the CPU, and which cannot (and why)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import kvpress
import pytest
import torch
from kvpress import CriticalKVPress, ScorerPress, SnapKVPress

from ripplekv.inference.generate import prefill
from ripplekv.models.cache import layer_lengths
from ripplekv.presses.layer_budget_press import scorer_at_ratio
from ripplekv.presses.registry import make_press
from ripplekv.presses.ripplekv_press import RippleKVPress
from tests.conftest import random_ids, tiny_model

SCORES = (1.0, 3.0, 2.0, 0.5)
PROMPT = 96

# The ScorerPress classes of kvpress 0.5.5 that cannot run here, and why (docs/cli.md lists them too).
NOT_HERE = {
    "ExpectedAttentionStatsPress": "downloads its query statistics from the Hugging Face hub",
    "QFilterPress": "downloads its Q-filters from the Hugging Face hub",
    "KVzapPress": "downloads its scoring model from the Hugging Face hub (and needs a model name to find it)",
}
NEEDS_EAGER = {"ObservedAttentionPress"}  # scores from the attention weights, which only eager attention returns
WRAPPERS = {"CriticalKVPress": lambda: CriticalKVPress(press=SnapKVPress(window_size=8))}


def _scorer_classes() -> list[str]:
    return sorted(
        name
        for name in dir(kvpress)
        if inspect.isclass(getattr(kvpress, name))
        and issubclass(getattr(kvpress, name), ScorerPress)
        and name != "ScorerPress"
    )


def test_every_scorer_is_accounted_for() -> None:
    """A kvpress upgrade that adds a scorer fails here until it is tried (and listed if it cannot run)."""
    assert set(NOT_HERE) <= set(_scorer_classes())
    assert len(_scorer_classes()) == 19


@pytest.mark.parametrize("name", [n for n in _scorer_classes() if n not in NOT_HERE])
def test_scorer_runs_under_the_ripplekv_schedule(name: str) -> None:
    scorer = WRAPPERS.get(name, getattr(kvpress, name))()
    model = tiny_model("llama", layers=4, attn="eager" if name in NEEDS_EAGER else "sdpa")
    press = RippleKVPress(press=scorer, budget=0.3, scores=SCORES, floor=4)
    state = prefill(model, random_ids(PROMPT), press)
    assert layer_lengths(state.cache) == list(press.layer_budgets(4, PROMPT))
    assert len(set(layer_lengths(state.cache))) > 1


@dataclass
class StatefulScorer(ScorerPress):
    """A scorer holding state set up by post_init_from_model (as QFilterPress and ExpectedAttentionStatsPress do)."""

    weights: torch.Tensor | None = field(default=None, init=False)

    def post_init_from_model(self, model: torch.nn.Module) -> None:
        self.weights = torch.linspace(1.0, 2.0, model.config.head_dim if hasattr(model.config, "head_dim") else 16)

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:  # noqa: ANN001
        if self.weights is None:
            raise RuntimeError("post_init_from_model was not called on this scorer (its state was dropped)")
        return (keys[..., : self.weights.numel()] * self.weights).norm(dim=-1)


def test_scorer_state_set_after_construction_survives_the_per_layer_ratio() -> None:
    model = tiny_model("llama", layers=4)
    press = RippleKVPress(press=StatefulScorer(), budget=0.3, scores=SCORES, floor=4)
    state = prefill(model, random_ids(PROMPT), press)
    assert layer_lengths(state.cache) == list(press.layer_budgets(4, PROMPT))


def test_per_layer_ratio_copies_wrapped_scorers_and_never_touches_the_callers() -> None:
    inner = SnapKVPress(window_size=8, compression_ratio=0.0)
    critical = CriticalKVPress(press=inner)
    copied = scorer_at_ratio(critical, 0.7)
    assert copied.compression_ratio == 0.7 and copied.press is not inner
    assert inner.compression_ratio == 0.0 and critical.compression_ratio == 0.0


def test_attention_weight_scorer_without_eager_names_the_implementation() -> None:
    """ObservedAttentionPress under sdpa is a ValueError naming eager, not kvpress's bare assertion."""
    model = tiny_model("llama", layers=4, attn="sdpa")
    press = RippleKVPress(press=kvpress.ObservedAttentionPress(), budget=0.3, scores=SCORES, floor=4)
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        prefill(model, random_ids(PROMPT), press)


def test_a_wrapped_attention_weight_scorer_is_refused_by_name_too() -> None:
    """``adakv`` over ObservedAttentionPress (kvpress's AdaKVPress holds the scorer as ``press``) under sdpa: the
    same ValueError, not kvpress's assertion inside its head-wise hook."""
    model = tiny_model("llama", layers=4, attn="sdpa")
    press = make_press("adakv", budget=0.3, scorer="observed_attention")
    with pytest.raises(ValueError, match="ObservedAttentionPress .*attn_implementation='eager'"):
        prefill(model, random_ids(PROMPT), press)
