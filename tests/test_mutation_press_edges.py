"""Relations that kill mutants of issue 26's press modules left alive by its third mutation round.

Each test names the seeded bug it was watched failing under.
"""

from __future__ import annotations

import re
from dataclasses import FrozenInstanceError
from types import SimpleNamespace

import pytest
import torch
from kvpress import ObservedAttentionPress, SnapKVPress
from transformers import DynamicCache

from ripplekv.allocation.lava import lava_token_scores
from ripplekv.allocation.per_prompt import PerPromptSchedule
from ripplekv.allocation.schedules import UniformSchedule
from ripplekv.allocation.squeezeattention import SqueezeAttentionRule
from ripplekv.inference.generate import prefill
from ripplekv.models.cache import layer_lengths
from ripplekv.presses.lava_press import headwise_select
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.presses.method_spec import Param, parse_method
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress, select_top
from ripplekv.presses.registry import make_press
from ripplekv.presses.scorers import check_attention_weights
from ripplekv_eval.fastpath.derive import derive_cache, residual_statistics_of
from ripplekv_eval.fastpath.hidden_tail import hidden_states_tail
from ripplekv_eval.fastpath.record import record_prefill
from tests.conftest import random_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOW = 8


def _snapkv_total(model: torch.nn.Module, ids: torch.Tensor, budget: float) -> int:
    return sum(
        layer_lengths(
            prefill(model, ids, LayerBudgetPress(SnapKVPress(window_size=WINDOW), UniformSchedule(budget))).cache
        )
    )


def _per_prompt(budget: float) -> PerPromptBudgetPress:
    return PerPromptBudgetPress(
        SnapKVPress(window_size=WINDOW), PerPromptSchedule(SqueezeAttentionRule(), budget, window_size=WINDOW)
    )


def test_a_prompt_longer_than_the_hidden_size_is_compressed() -> None:
    """The prefill is told from decoding by the cache position against the pass's token count, not against another
    dimension of the hidden states. Seeded bug caught: ``hidden_states.shape[2]`` (the hidden size, 64 here): a
    100-token prompt passed through uncompressed."""
    model = tiny_model("llama", layers=3)
    ids = random_ids(100, seed=3)
    assert model.config.hidden_size < ids.shape[1]
    kept = layer_lengths(prefill(model, ids, _per_prompt(0.3)).cache)
    assert sum(kept) == _snapkv_total(model, ids, 0.3) < 3 * 100


def test_a_model_with_one_compressed_layer_takes_the_whole_budget() -> None:
    """A single compressed layer keeps SnapKV's budget, in a direct prefill and in a cache derived from a prefill
    record (its prompt length read from that one layer). Seeded bug caught: the derived cache's length read from
    the second compressed layer (an IndexError)."""
    model = tiny_model("llama", layers=1)
    ids = random_ids(48, seed=2)
    press = _per_prompt(0.5)
    kept = layer_lengths(prefill(model, ids, press).cache)
    assert kept == [_snapkv_total(model, ids, 0.5)] and kept[0] < 48
    record = record_prefill(model, ids, hidden_states_tail([press]), residual_statistics_of([press]))
    assert layer_lengths(derive_cache(record, press)) == kept


def test_select_top_treats_every_batch_row_as_if_alone() -> None:
    """Top-n of a batch is each row's own top-n. Seeded bug caught: the index expanded to batch 1."""
    generator = torch.Generator().manual_seed(5)
    keys, values = torch.randn(2, 2, 12, 4, generator=generator), torch.randn(2, 2, 12, 6, generator=generator)
    scores = torch.randn(2, 2, 12, generator=generator)
    k, v = select_top(keys, values, scores, 5)
    for row in range(2):
        k_row, v_row = select_top(keys[row : row + 1], values[row : row + 1], scores[row : row + 1], 5)
        assert torch.equal(k[row : row + 1], k_row) and torch.equal(v[row : row + 1], v_row)


def test_headwise_select_refuses_counts_for_another_batch() -> None:
    """One row of head counts per batch row, even when each row has the right heads. Seeded bug caught: ``and``
    for ``or`` (a missing batch row let through)."""
    keys = values = torch.zeros(2, 2, 6, 4)
    scores = torch.zeros(2, 2, 6)
    with pytest.raises(ValueError, match=re.escape("counts must be 2 rows of 2 head counts, got ((3, 3),)")):
        headwise_select(keys, values, scores, ((3, 3),))


def test_press_equality_is_its_configuration_not_a_pending_prefill() -> None:
    """Two presses of one configuration compare equal whatever an interrupted prefill left pending. Seeded bug
    caught: ``compare=True`` on the pending state."""
    press, other = _per_prompt(0.3), _per_prompt(0.3)
    press._pending[0] = SimpleNamespace()  # type: ignore[assignment]
    assert press == other and press != _per_prompt(0.4)


@pytest.mark.parametrize("implementation", ["eager", "ripplekv_eager", "sdpa", "ripplekv_sdpa"])
def test_a_scorer_of_attention_weights_is_refused_without_eager_attention_only(implementation: str) -> None:
    """ObservedAttention needs a model returning attention weights (eager, or ripplekv's eager variant); any other
    scorer runs under any implementation. Seeded bugs caught: ``not in`` -> ``in`` in the refusal; the refusal
    without its type check."""
    model = SimpleNamespace(config=SimpleNamespace(_attn_implementation=implementation))
    check_attention_weights(SnapKVPress(), model)  # type: ignore[arg-type]
    if "eager" in implementation:
        check_attention_weights(ObservedAttentionPress(), model)  # type: ignore[arg-type]
        return
    with pytest.raises(ValueError, match=f"'{implementation}' does not return.*attn_implementation='eager'"):
        check_attention_weights(ObservedAttentionPress(), model)  # type: ignore[arg-type]


def test_streamingllm_takes_no_sink_at_all() -> None:
    """``n_sink=0`` (a pure sliding window) is valid; only a negative count is refused. Seeded bug caught: ``<=``
    in the check."""
    assert make_press("streamingllm:n_sink=0", budget=0.5).press.n_sink == 0
    with pytest.raises(ValueError, match=re.escape("n_sink must be an integer >= 0, got -1")):
        parse_method("streamingllm:n_sink=-1")


def test_a_param_is_a_frozen_hashable_value() -> None:
    """A declared knob cannot be reassigned and equal knobs hash alike. Seeded bug caught: ``frozen=False``."""
    param = Param("r", float, 4.0)
    assert {param: 1}[Param("r", float, 4.0)] == 1
    with pytest.raises(FrozenInstanceError):
        param.default = 8.0  # type: ignore[misc]


def test_lava_token_scores_reduce_query_groups_by_default() -> None:
    """Without ``gqa_support`` the scores are reduced to KV heads (the authors' default), one row per KV head.
    Seeded bug caught: the default False (one row per query head)."""
    generator = torch.Generator().manual_seed(4)
    attention = torch.softmax(torch.randn(1, 4, 4, 20, generator=generator), dim=-1)
    values = torch.randn(1, 2, 24, 8, generator=generator)
    default = lava_token_scores(attention, values)
    assert default.shape[1] == 2 and torch.equal(default, lava_token_scores(attention, values, gqa_support=True))


def test_a_decoding_step_inside_the_press_leaves_the_compressed_cache_alone() -> None:
    """A one-token pass run while the press is on (kvpress's ``with press(model): model.generate(...)``) is told
    from a prefill and appends one entry per layer, compressing nothing. Seeded bug caught: ``cache_position[-2]``
    (an IndexError on the one-token pass)."""
    model = tiny_model("llama", layers=3)
    press, cache = _per_prompt(0.5), DynamicCache()
    with press(model):
        position = torch.arange(40)
        model(random_ids(40, seed=4), past_key_values=cache, use_cache=True, cache_position=position)
        kept = layer_lengths(cache)
        model(random_ids(1, seed=9), past_key_values=cache, use_cache=True, cache_position=torch.tensor([40]))
    assert sum(kept) == _snapkv_total(model, random_ids(40, seed=4), 0.5)
    assert layer_lengths(cache) == [n + 1 for n in kept]
