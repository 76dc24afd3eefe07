"""PerPromptBudgetPress: statistics of every layer first, budgets after the last, exact totals, same caches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch
from kvpress import KnormPress, SnapKVPress, StreamingLLMPress

from ripplekv.allocation.budget import BudgetSchedule, BudgetSpec
from ripplekv.allocation.cake import CakeRule
from ripplekv.allocation.dynamickv import DynamicKVRule
from ripplekv.allocation.lava import LavaRule
from ripplekv.allocation.per_prompt import PerPromptRule, PerPromptSchedule
from ripplekv.allocation.schedules import UniformSchedule
from ripplekv.allocation.squeezeattention import SqueezeAttentionRule
from ripplekv.inference.generate import prefill
from ripplekv.models.cache import layer_lengths
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress
from tests.conftest import random_ids, tiny_model

WINDOW = 4
RULES = (CakeRule(), SqueezeAttentionRule(), DynamicKVRule(), LavaRule())


@dataclass(frozen=True)
class FixedRule(PerPromptRule):
    """A rule whose budgets are known before the prompt (for the equivalence test): fixed shares of the total."""

    shares: tuple[int, ...] = (1, 3, 2, 2)
    name: ClassVar[str] = "fixed"
    statistic_inputs: ClassVar[tuple[str, ...]] = ("window_attention",)
    statistic_names: ClassVar[tuple[str, ...]] = ("mass",)

    def layer_statistic(self, window_attention: torch.Tensor) -> tuple[float]:  # type: ignore[override]
        return (float(window_attention.sum()),)

    def layer_budgets(
        self, n_layers: int, prompt_tokens: int, floor: int, *, stats: Sequence[Any], total: int, window_size: int
    ) -> tuple[int, ...]:
        unit = total // sum(self.shares)
        budgets = [unit * s for s in self.shares]
        budgets[-1] += total - sum(budgets)
        return tuple(budgets)


@dataclass(frozen=True)
class FixedSchedule(BudgetSchedule):
    """The same budgets as a schedule known in advance (a layer compressed as soon as its hook runs)."""

    rule: FixedRule = FixedRule()
    budget: float = 0.5
    window_size: int = WINDOW

    def layer_budgets(self, n_layers: int, prompt_tokens: int, floor: int) -> tuple[int, ...]:
        total = n_layers * BudgetSpec(self.budget).average(prompt_tokens)
        return self.rule.layer_budgets(
            n_layers, prompt_tokens, floor, stats=(), total=total, window_size=self.window_size
        )


def _caches(model: torch.nn.Module, ids: torch.Tensor, press: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    state = prefill(model, ids, press)
    return [(layer.keys, layer.values) for layer in state.cache.layers]


@pytest.mark.parametrize("scorer", [SnapKVPress(window_size=WINDOW), KnormPress()], ids=["snapkv", "knorm"])
def test_deciding_after_the_last_layer_equals_compressing_each_layer_at_once(scorer: Any) -> None:
    model = tiny_model("llama", layers=4)
    ids = random_ids(48)
    reserve = getattr(scorer, "window_size", 0)  # the window the scorer keeps (none for KNorm)
    deferred = PerPromptBudgetPress(
        scorer, PerPromptSchedule(FixedRule(), 0.5, window_size=reserve), floor=1, statistic_window=WINDOW
    )
    at_once = LayerBudgetPress(scorer, FixedSchedule(), floor=1)
    a, b = _caches(model, ids, deferred), _caches(model, ids, at_once)
    assert [k.shape[2] for k, _ in a] == [k.shape[2] for k, _ in b] != [48] * 4
    for (ka, va), (kb, vb) in zip(a, b):
        assert torch.equal(ka, kb) and torch.equal(va, vb)
    assert not deferred._pending  # nothing held after the prefill


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
@pytest.mark.parametrize("budget", [0.2, 0.5])
def test_every_rule_keeps_exactly_snapkvs_total(rule: PerPromptRule, budget: float) -> None:
    model = tiny_model("llama", layers=4)
    ids = random_ids(64)
    press = PerPromptBudgetPress(SnapKVPress(window_size=WINDOW), PerPromptSchedule(rule, budget, window_size=WINDOW))
    kept = layer_lengths(prefill(model, ids, press).cache)
    snapkv = layer_lengths(
        prefill(model, ids, LayerBudgetPress(SnapKVPress(window_size=WINDOW), UniformSchedule(budget))).cache
    )
    assert sum(kept) == sum(snapkv)
    assert all(WINDOW <= n <= 64 for n in kept)


def _layer_inputs(model: torch.nn.Module, ids: torch.Tensor) -> list[dict[str, Any]]:
    """Every layer's statistic inputs from a plain full prefill, captured by hooks (independently of the press)."""
    captured: list[dict[str, Any]] = [{} for _ in model.model.layers]
    handles = []
    for index, layer in enumerate(model.model.layers):

        def pre(module, args, kwargs, index=index):  # noqa: ANN001, ANN202
            captured[index]["residual_in"] = args[0] if args else kwargs["hidden_states"]

        def post(module, args, kwargs, output, index=index):  # noqa: ANN001, ANN202
            cache = kwargs["past_key_values"].layers[index]
            window = SnapKVPress.compute_window_attention(
                module, kwargs["hidden_states"], cache.keys, WINDOW, kwargs["position_embeddings"]
            )
            captured[index].update(window_attention=window.float(), values=cache.values, attention_output=output[0])

        handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(layer.self_attn.register_forward_hook(post, with_kwargs=True))
    try:
        prefill(model, ids)
    finally:
        for handle in handles:
            handle.remove()
    return captured


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_budgets_follow_each_layers_own_statistic(rule: PerPromptRule) -> None:
    model = tiny_model("llama", layers=4, seed=1)
    ids = random_ids(128, seed=1)
    schedule = PerPromptSchedule(rule, 0.3, window_size=WINDOW)
    inputs = _layer_inputs(model, ids)
    stats = [rule.layer_statistic(*(layer[name] for name in rule.statistic_inputs)) for layer in inputs]
    expected = schedule.layer_budgets(4, 128, WINDOW, stats=stats)
    press = PerPromptBudgetPress(SnapKVPress(window_size=WINDOW), schedule)
    seen: list[Any] = []
    original = press.layer_statistic

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(original(*args, **kwargs))
        return seen[-1]

    object.__setattr__(press, "layer_statistic", spy)
    kept = layer_lengths(prefill(model, ids, press).cache)
    assert tuple(kept) == expected
    if rule.name != "squeezeattention":  # computed from the residual stream, not through layer_statistic's window
        for mine, theirs in zip(seen, stats):
            for a, b in zip(mine, theirs):
                assert torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64))
    assert len(set(expected)) > 1 or rule.name == "squeezeattention"  # the rule does move budgets here


def test_refusals() -> None:
    schedule = PerPromptSchedule(CakeRule(), 0.3, window_size=WINDOW)
    with pytest.raises(ValueError, match="compression ratio"):
        PerPromptBudgetPress(StreamingLLMPress(), schedule)
    with pytest.raises(ValueError, match="window"):
        PerPromptBudgetPress(SnapKVPress(window_size=8), schedule)
    with pytest.raises(TypeError, match="PerPromptSchedule"):
        PerPromptBudgetPress(SnapKVPress(window_size=WINDOW), UniformSchedule(0.3))  # type: ignore[arg-type]
    model = tiny_model("llama", layers=2)
    with pytest.raises(ValueError, match="selection window"):
        prefill(model, random_ids(WINDOW), PerPromptBudgetPress(SnapKVPress(window_size=WINDOW), schedule))


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
@pytest.mark.parametrize("scorer", ["snapkv", "knorm"])
def test_a_prefill_record_derives_the_direct_prefills_caches(rule: PerPromptRule, scorer: str) -> None:
    from ripplekv_eval.fastpath.derive import residual_statistics_of
    from ripplekv_eval.fastpath.hidden_tail import hidden_states_tail
    from ripplekv_eval.fastpath.record import record_prefill

    model = tiny_model("llama", layers=4, seed=1)
    ids = random_ids(96, seed=2)
    inner = SnapKVPress(window_size=WINDOW) if scorer == "snapkv" else KnormPress()
    reserve = WINDOW if scorer == "snapkv" else 0  # KNorm keeps no window: none is reserved
    press = PerPromptBudgetPress(inner, PerPromptSchedule(rule, 0.3, window_size=reserve), statistic_window=WINDOW)
    direct = _caches(model, ids, press)
    record = record_prefill(model, ids, hidden_states_tail([press]), residual_statistics_of([press]))
    assert record.hidden_tokens == WINDOW + 1  # the record holds the window's tail only
    from ripplekv_eval.fastpath.derive import derive_cache

    derived = derive_cache(record, press)
    for (kd, vd), layer in zip(direct, derived.layers):
        assert torch.equal(kd, layer.keys) and torch.equal(vd, layer.values)
    if rule.name == "squeezeattention":
        bare = record_prefill(model, ids, hidden_states_tail([press]))
        with pytest.raises(ValueError, match="no squeezeattention statistic"):
            derive_cache(bare, press)
