"""The layer-budget presses are bound to the model once (``post_init_from_model``, before each prefill): a prefill
resolves the schedule over the model's compressed layers once and builds no schedule nor press per layer, on a
model with sliding layers too (Gemma 3: the schedule of the global layers)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from ripplekv.allocation.budget import ProfileSchedule
from ripplekv.inference.generate import kept_tokens, prefill
from ripplekv.models.layer_types import compressed_layers
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.presses.registry import make_press
from tests.conftest import random_ids, synthetic_profile, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = 40
MODELS: dict[str, dict[str, Any]] = {
    "llama": {"arch": "llama"},
    "gemma3-sliding": {
        "arch": "gemma3",
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "sliding_window": 16,
    },
}


def _count_calls(monkeypatch: pytest.MonkeyPatch, owner: type, name: str, counts: Counter[str], key: str) -> None:
    """Count calls of ``owner.name`` (for this test only)."""
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[key] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("method", ["ripplekv", "ripplekv-ada"])
def test_a_prefill_builds_no_schedule_or_press_per_layer(
    method: str, model_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ``ProfileSchedule`` (``dataclasses.replace`` included) and every layer-budget press (a subclass's
    ``super().__post_init__()`` included) built during a 4-layer prefill is counted: at most the one schedule of
    the global layers, bound in ``post_init_from_model``, and no press."""
    model = tiny_model(layers=4, **MODELS[model_name])
    press = make_press(method, budget=0.3, profile=synthetic_profile(model), window_size=4)
    built: Counter[str] = Counter()
    _count_calls(monkeypatch, ProfileSchedule, "__post_init__", built, "schedules")
    _count_calls(monkeypatch, LayerBudgetPress, "__post_init__", built, "presses")
    state = prefill(model, random_ids(PROMPT, seed=1), press)
    kept = kept_tokens(state)
    assert all(kept[i] < PROMPT for i in compressed_layers(model.config))  # the layers were compressed
    assert built["presses"] == 0, built
    assert built["schedules"] <= 1, built
