"""Relations that kill mutants of issue 26's presses modules left alive by its first mutation round."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import FrozenInstanceError, dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch
from kvpress import SnapKVPress, StreamingLLMPress

from ripplekv.allocation.budget import TokenBudgetError
from ripplekv.allocation.lava import LavaRule, lava_token_scores
from ripplekv.allocation.lava_heads import head_floor, lava_head_budgets
from ripplekv.allocation.per_prompt import PerPromptRule, PerPromptSchedule, top_k_counts
from ripplekv.models.attention import attention_implementation, supports_per_layer_lengths, uses_varlen_attention
from ripplekv.models.headwise import headwise_of
from ripplekv.presses.lava_press import LavaPress, headwise_select
from ripplekv.presses.lava_scorer import LavaScorerPress
from ripplekv.presses.method_spec import METHOD_TABLE, parse_method
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress, select_top
from ripplekv.presses.registry import make_press
from ripplekv_eval.fastpath.hidden_tail import hidden_states_needed
from ripplekv_eval.fastpath.record import record_prefill
from ripplekv_eval.fastpath.score_memo import ScoreMemo, scorer_key
from tests.conftest import random_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8


def _never() -> Any:
    """A ``compute`` that must not run (the memo answers)."""
    raise AssertionError("computed although the memo holds the result")


def _eager_inputs(n: int, window: int, seed: int = 7) -> tuple[Any, ...]:
    """``score()`` arguments of one layer with eager attention weights (no model: the weights are given)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, HEADS, n, n, generator=generator).masked_fill(torch.ones(n, n).triu(1).bool(), -1e9)
    keys = torch.randn(1, KV_HEADS, n, HEAD_DIM, generator=generator)
    values = torch.randn(1, KV_HEADS, n, HEAD_DIM, generator=generator)
    module = SimpleNamespace(config=SimpleNamespace(num_attention_heads=HEADS))
    return module, torch.zeros(1, n, 16), keys, values, torch.softmax(logits, dim=-1), {}


# ------------------------------------------------------------------------------------------ lava_heads, lava_press


def test_head_floor_accepts_exactly_the_integers_from_zero() -> None:
    """Seeded bug caught: ``or`` for ``and`` in the check (a negative or a fractional ``per_head`` let through)."""
    assert [head_floor(b, 0.5) for b in (0, 1, 2, 7)] == [0, 0, 1, 3]
    for bad in (-1, -10, 2.5, True):
        with pytest.raises(ValueError, match=re.escape(f"per_head must be an integer >= 0, got {bad!r}")):
            head_floor(bad)  # type: ignore[arg-type]


def test_headwise_select_takes_a_head_that_keeps_nothing() -> None:
    """A count of 0 is in range: the head keeps no unmasked token, and every one of the layer's ``m`` rows is masked
    there. Seeded bug caught: the range check starting at 1."""
    keys = torch.arange(2 * 5, dtype=torch.float32).view(1, 2, 5, 1)
    scores = torch.tensor([[[5.0, 4, 3, 2, 1], [1.0, 2, 3, 4, 5]]])
    kept, _, masked = headwise_select(keys, keys, scores, [[0, 3]])
    assert kept[0, :, :, 0].tolist() == [[0, 1, 2], [9, 8, 7]]
    assert masked is not None and set(zip(*(t.tolist() for t in masked))) == {(0, 0, 0), (0, 0, 1), (0, 0, 2)}
    for bad in ([[-1, 3]], [[0, 6]]):
        with pytest.raises(ValueError, match=re.escape(f"every count must be in [0, 5], got {bad!r}")):
            headwise_select(keys, keys, scores, bad)


def test_head_counts_are_the_budget_in_every_head_where_nothing_is_split() -> None:
    """A budget at or past the prompt keeps the prompt in every head; a budget within the kept window keeps the
    budget in every head; only between them are heads split (summing to ``heads * budget``). Seeded bug caught:
    the uniform rows built with ``/`` (never run by the other tests)."""
    press = LavaPress(SnapKVPress(window_size=4), floor_alpha=0.0)
    scores = torch.rand(2, 3, 10, generator=torch.Generator().manual_seed(1))
    scores[0, 0, :6] += 10  # batch row 0: head 0 holds the layer's best prefix tokens
    for budget, kept in ((10, 10), (15, 10), (4, 4), (3, 3), (1, 1)):
        assert press.head_counts(scores, budget) == [(kept,) * 3] * 2
    split = press.head_counts(scores, 6)
    prefix = scores[..., :6].double().numpy()
    assert split == [tuple(4 + c for c in lava_head_budgets(row, 2, 0.0)) for row in prefix]
    assert split[0] == (10, 4, 4) and all(sum(row) == 3 * 6 for row in split)


# -------------------------------------------------------------------------------------------------- lava_scorer


def test_scorer_validation_boundaries() -> None:
    """window_size 1 and any ratio below 1 are accepted; 0 and a ratio of 1 are refused with their messages.
    Seeded bugs caught: ``< 1`` as ``<= 1`` or ``< 2`` for the window, ``< 2`` for the ratio."""
    assert LavaScorerPress(window_size=1).window_size == 1
    assert LavaScorerPress(compression_ratio=0.99).compression_ratio == 0.99
    with pytest.raises(ValueError, match=re.escape("window_size must be an integer >= 1, got 0")):
        LavaScorerPress(window_size=0)
    for ratio in (1, 1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=re.escape(f"compression_ratio must be in [0, 1), got {ratio!r}")):
            LavaScorerPress(compression_ratio=ratio)


def test_hidden_states_tail_is_the_fewest_positions_the_score_accepts() -> None:
    """A record keeping the declared tail (``window + 1``) scores exactly as one keeping every position; one fewer
    is refused. Seeded bug caught: the tail ``window - 1``."""
    window, n = 5, 20
    scorer = LavaScorerPress(window_size=window, kernel_size=3)
    assert scorer.hidden_states_tail == hidden_states_needed(scorer) == window + 1
    module, hidden, keys, values, attentions, kwargs = _eager_inputs(n, window)
    full = scorer.score(module, hidden, keys, values, attentions, kwargs)  # type: ignore[arg-type]
    tail = hidden[:, -scorer.hidden_states_tail :]
    assert torch.equal(scorer.score(module, tail, keys, values, attentions, kwargs), full)  # type: ignore[arg-type]
    message = re.escape(f"the prompt has {n} tokens, not more than LavaScorerPress's {window}-token window")
    with pytest.raises(ValueError, match=message):
        scorer.score(module, tail[:, 1:], keys, values, attentions, kwargs)  # type: ignore[arg-type]


def test_score_refuses_keys_no_longer_than_the_window() -> None:
    """The prompt (the keys) must be longer than the window even where the hidden states are. Seeded bug caught:
    ``keys.shape[2] < window``."""
    window = 5
    module, hidden, keys, values, attentions, kwargs = _eager_inputs(window + 1, window)
    scorer = LavaScorerPress(window_size=window, kernel_size=3)
    assert scorer.score(module, hidden, keys, values, attentions, kwargs).shape[-1] == window + 1  # type: ignore[arg-type]
    short = (keys[:, :, 1:], values[:, :, 1:], attentions[..., 1:, 1:])
    with pytest.raises(ValueError, match=re.escape(f"the prompt has {window} tokens, not more than")):
        scorer.score(module, hidden, *short, kwargs)  # type: ignore[arg-type]


def test_window_scores_are_twice_the_layers_top_plus_one_and_always_kept() -> None:
    """Every window position scores ``2 * top + 1`` (``top`` the highest prefix score of the layer, over every head):
    strictly above every prefix score even when all are 0, so keeping ``window + k`` keeps the window and each
    head's ``k`` best prefix tokens. Seeded bugs caught: ``2 * top + 2`` and ``3 * top + 1``."""
    window, n, k = 4, 16, 3
    module, hidden, keys, values, attentions, kwargs = _eager_inputs(n, window, seed=3)
    scorer = LavaScorerPress(window_size=window, kernel_size=3)
    for vals in (values, torch.zeros_like(values)):  # zero values: every prefix score is 0
        scores = scorer.score(module, hidden, keys, vals, attentions, kwargs)  # type: ignore[arg-type]
        prefix = scores[..., :-window]
        top = float(prefix.max())
        assert torch.equal(scores[..., -window:], torch.full_like(scores[..., -window:], 2.0 * top + 1.0))
        assert float(scores[..., -window:].min()) > top
        positions = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1).expand(1, KV_HEADS, n, 1)
        kept, _ = select_top(positions, positions, scores, window + k)
        for head in range(KV_HEADS):
            chosen = set(kept[0, head, :, 0].long().tolist()) - set(range(n - window, n))
            last = float(prefix[0, head].topk(k).values[-1])  # pooling and zeros tie: any tied token may be kept
            assert len(chosen) == k and all(float(prefix[0, head, j]) >= last for j in chosen)


# ----------------------------------------------------------------------------------------------- per_prompt_press


@dataclass(frozen=True)
class CandidatesRule(PerPromptRule):
    """A rule whose statistic is the window attention it is given (to compare with the selection's candidates)."""

    name: ClassVar[str] = "candidates"
    statistic_inputs: ClassVar[tuple[str, ...]] = ("window_attention",)
    statistic_names: ClassVar[tuple[str, ...]] = ("attention",)

    def layer_statistic(self, window_attention: torch.Tensor) -> tuple[torch.Tensor]:  # type: ignore[override]
        return (window_attention,)

    def layer_budgets(
        self, n_layers: int, prompt_tokens: int, floor: int, *, stats: Sequence[Any], total: int, window_size: int
    ) -> tuple[int, ...]:
        return tuple(total // n_layers + (i < total % n_layers) for i in range(n_layers))


@pytest.fixture(scope="module")
def record() -> Any:
    return record_prefill(tiny_model("llama", layers=2), random_ids(40, seed=2), hidden_tail=None)


@pytest.mark.parametrize(("statistic_window", "reserve"), [(4, 8), (12, 8), (8, 8)])
def test_window_statistic_reads_the_keys_before_both_windows(record: Any, statistic_window: int, reserve: int) -> None:
    """The statistic's window attention covers the ``n - max(statistic_window, reserve)`` keys the selection chooses
    among: a kept window wider than the statistic's cuts its last keys off. Seeded bug caught: ``n + max(...)``."""
    layer = record.layers[1]
    n = layer.keys.shape[2]
    rule = CandidatesRule()
    press = PerPromptBudgetPress(
        SnapKVPress(window_size=reserve),
        PerPromptSchedule(rule, 0.5, window_size=reserve),
        statistic_window=statistic_window,
    )
    (attention,) = press.layer_statistic(layer.module, layer.hidden_states, layer.keys, layer.values, layer.kwargs)
    full = SnapKVPress.compute_window_attention(
        layer.module, layer.hidden_states, layer.keys, statistic_window, layer.kwargs["position_embeddings"]
    )
    assert attention.shape[-1] == n - max(statistic_window, reserve)
    assert torch.equal(attention, full[..., : n - max(statistic_window, reserve)].float())


def test_compression_ratio_is_one_minus_the_kept_fraction() -> None:
    """kvpress's convention for a kept fraction. Seeded bug caught: ``1 + budget`` (never read by the other tests)."""
    for budget in (0.125, 0.25, 0.5, 1.0):
        press = PerPromptBudgetPress(SnapKVPress(window_size=8), PerPromptSchedule(LavaRule(), budget, window_size=8))
        assert press.compression_ratio == 1.0 - budget
        assert press.budget == budget


def test_a_token_budget_has_no_compression_ratio_and_says_why() -> None:
    """A token budget (``tokens=``) has no fixed ratio: ``budget`` is None and ``compression_ratio`` raises
    TokenBudgetError naming the tokens, as LayerBudgetPress does. Seeded bug caught: ``float(schedule.budget)``
    (a TypeError about NoneType, the state before issue 26's mutation round)."""
    press = PerPromptBudgetPress(SnapKVPress(window_size=8), PerPromptSchedule(LavaRule(), tokens=100, window_size=8))
    assert press.budget is None
    with pytest.raises(TokenBudgetError, match="keeps 100 tokens per layer on average: a token budget has no fixed"):
        _ = press.compression_ratio


# ---------------------------------------------------------------------------------------------------- score_memo


def test_a_pinned_result_is_a_hit_over_its_own_keys_only() -> None:
    """Reading a pinned entry over its very key tensor returns it without computing and counts a hit each time;
    over another tensor (even an equal one) or another layer it raises, naming the scorer's class. Seeded bugs
    caught: ``is`` for ``is not``, the result compared in place of the key tensor, hits counted down."""
    memo = ScoreMemo()
    key = scorer_key(SnapKVPress(window_size=8))
    keys, result = torch.zeros(1, 2, 10, 4), torch.ones(1, 2, 10)
    memo.pin("scores", key, 0, keys, result)
    assert memo.get("scores", key, 0, keys, _never) is result
    assert memo.get("scores", key, 0, keys, _never) is result
    assert (memo.hits, memo.misses) == (2, 0)
    message = "the prefill record computed the scores of SnapKVPress while it ran, for its own keys of layer {}"
    with pytest.raises(ValueError, match=re.escape(message.format(0))):
        memo.get("scores", key, 0, keys.clone(), _never)
    with pytest.raises(ValueError, match=re.escape(message.format(1))):
        memo.get("scores", key, 1, keys, _never)
    assert (memo.hits, memo.misses) == (2, 0)
    memo.clear()  # pinned results stay
    assert memo.get("scores", key, 0, keys, _never) is result and memo.hits == 3


@pytest.mark.parametrize("key", [("LavaRule()", 8, 8), (), "rule"], ids=["tuple", "empty", "string"])
def test_a_key_that_is_not_a_scorers_is_described_by_its_repr(key: Any) -> None:
    """Only a scorer key (a tuple led by a class) is named by its class; a statistic key is written as it is.
    Seeded bugs caught: ``or`` for ``and`` (a tuple led by a string read as a class), ``key[1]`` for ``key[0]``."""
    memo = ScoreMemo()
    memo.pin("statistic", key, 0, torch.zeros(1), 1.0)
    message = f"the prefill record computed the statistic of {key!r} while it ran, for its own keys of layer 0"
    with pytest.raises(ValueError, match=re.escape(message)):
        memo.get("statistic", key, 0, torch.zeros(1), _never)


# --------------------------------------------------------------------------------------------------- method_spec


def test_statistic_window_from_one_is_accepted_as_the_press_accepts_it() -> None:
    """``window=1`` is a valid spec (the press takes ``statistic_window=1``); 0 is refused by both. Seeded bug
    caught: ``window <= 1`` refused."""
    for method in ("cake", "dynamickv", "lava", "lava-layer"):
        assert parse_method(f"{method}:window=1").canonical() == f"{method}:window=1"
        with pytest.raises(ValueError, match=re.escape(f"method {method!r}: window must be an integer >= 1, got 0")):
            parse_method(f"{method}:window=0")
    assert make_press("cake:window=1", budget=0.5, window_size=8).statistic_window == 1
    with pytest.raises(ValueError, match="statistic_window must be an integer >= 1, got 0"):
        PerPromptBudgetPress(
            SnapKVPress(window_size=8), PerPromptSchedule(LavaRule(), 0.5, window_size=8), statistic_window=0
        )


def test_floor_alpha_spec_accepts_exactly_what_lava_press_accepts() -> None:
    """Both ends of ``[0, 1]`` are valid specs and presses; just outside them neither. Seeded bugs caught: either
    ``<=`` of the check made ``<``."""
    for alpha in (0.0, 1.0, 0.5):
        assert parse_method("lava", floor_alpha=alpha).values["floor_alpha"] == alpha
        assert (
            make_press(f"lava:floor_alpha={alpha}", budget=0.5).floor_alpha == LavaPress(floor_alpha=alpha).floor_alpha
        )
    for alpha in (-0.01, 1.01):
        with pytest.raises(ValueError, match=re.escape(f"method 'lava': floor_alpha must be in [0, 1], got {alpha!r}")):
            parse_method(f"lava:floor_alpha={alpha}")
        with pytest.raises(ValueError, match="floor_alpha"):
            LavaPress(floor_alpha=alpha)


@pytest.mark.parametrize("method", ["lava", "lava-layer"])
def test_lava_spec_defaults_are_the_rules_and_name_one_setting_one_way(method: str) -> None:
    """The declared defaults are :class:`LavaRule`'s and :class:`LavaScorerPress`'s (``gqa_support`` True), the
    press built from the bare name has the rule's defaults, and a spec giving a default is the bare name. Seeded bug
    caught: ``gqa_support``'s declared default False."""
    declared = {p.name: p.default for p in METHOD_TABLE[method].params}
    for name in ("kernel_size", "pooling", "gqa_support"):
        assert declared[name] == getattr(LavaRule(), name) == getattr(LavaScorerPress(), name)
    assert make_press(method, budget=0.5).schedule.rule == LavaRule()
    assert parse_method(f"{method}:gqa_support=true").canonical() == method
    assert parse_method(f"{method}:gqa_support=false").canonical() == f"{method}:gqa_support=false"
    assert make_press(f"{method}:gqa_support=false", budget=0.5).schedule.rule == LavaRule(gqa_support=False)


# ------------------------------------------------------------------------------------------------ second round


def test_top_k_counts_refuses_every_k_negative_or_not_an_integer() -> None:
    """``k`` from 0 counts (beyond the entries: all of them); a non-integer or a negative ``k`` is refused with its
    message. Seeded bug caught: ``and`` for ``or`` (``-1`` and ``1.5`` let through)."""
    scores = [[3.0, 1.0, 2.0], [2.0, 0.0, 5.0]]
    assert top_k_counts(scores, 0) == (0, 0) and top_k_counts(scores, 6) == top_k_counts(scores, 7) == (3, 3)
    assert top_k_counts(scores, 2) == (1, 1)
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match=re.escape(f"k must be an integer >= 0, got {bad!r}")):
            top_k_counts(scores, bad)  # type: ignore[arg-type]


def test_a_budget_the_window_takes_whole_reads_no_prefix_score() -> None:
    """At ``budget == reserve`` (the window keeps the whole budget) every head keeps the budget without a split, so
    even scores the split would refuse (not finite) give the uniform counts. Seeded bug caught: ``budget < reserve``
    (the split run on the prefix, raising "scores must be finite")."""
    press = LavaPress(SnapKVPress(window_size=4), floor_alpha=0.0)
    scores = torch.rand(1, 3, 10, generator=torch.Generator().manual_seed(2))
    scores[0, 1, 2] = float("nan")
    assert press.head_counts(scores, 4) == [(4, 4, 4)]
    with pytest.raises(ValueError, match="scores must be finite"):
        press.head_counts(scores, 5)


def test_prune_refuses_head_masks_under_eager_attention_only() -> None:
    """Eager attention is refused exactly when heads keep different counts (a mask is needed); uniform counts prune
    under eager, and sdpa takes the mask. Seeded bug caught: ``masked is None`` for ``is not None``."""
    press = LavaPress(SnapKVPress(window_size=4), floor_alpha=0.0)
    scores = torch.rand(1, 3, 10, generator=torch.Generator().manual_seed(1))
    scores[0, 0, :6] += 10  # head 0 holds the layer's best prefix tokens: a split budget
    keys = torch.arange(30, dtype=torch.float32).view(1, 3, 10, 1)
    eager, sdpa = SimpleNamespace(_attn_implementation="eager"), SimpleNamespace(_attn_implementation="sdpa")
    layer = press.prune(keys, keys, scores, 6, sdpa)  # type: ignore[arg-type]
    assert headwise_of(layer) is not None and layer.keys.shape[2] == 10
    message = "LavaPress masks keys head-wise, which needs a boolean attention mask: load the model with"
    with pytest.raises(ValueError, match=re.escape(message)):
        press.prune(keys, keys, scores, 6, eager)  # type: ignore[arg-type]
    layer = press.prune(keys, keys, scores, 3, eager)  # type: ignore[arg-type]
    assert headwise_of(layer) is None and layer.keys.shape[2] == 3


def test_lava_scorer_default_window_is_kvpress_snapkvs() -> None:
    """The documented default window (64, kvpress's SnapKV). Seeded bug caught: 65."""
    assert LavaScorerPress().window_size == SnapKVPress().window_size == 64


def test_post_init_switches_stock_attention_to_the_per_layer_variant() -> None:
    """A model loaded with stock sdpa or eager attends per-layer lengths after the press's post-init; the varlen
    variant stays as it is. Seeded bug caught: ``supports_per_layer_lengths`` not negated (nothing switched)."""
    for attn in ("sdpa", "eager"):
        model = tiny_model("llama", layers=2, attn=attn)
        assert not supports_per_layer_lengths(model)
        PerPromptBudgetPress(
            SnapKVPress(window_size=8), PerPromptSchedule(LavaRule(), 0.5, window_size=8)
        ).post_init_from_model(model)
        assert uses_varlen_attention(model) and attention_implementation(model) == f"ripplekv_{attn}"


def test_adakv_alpha_safeguard_spec_accepts_both_ends() -> None:
    """``alpha_safeguard`` 0 and 1 are valid specs (kvpress's AdaKVPress accepts ``[0, 1]``); just outside is refused
    with its message. Seeded bugs caught: either ``<=`` of the check made ``<``."""
    for alpha in (0.0, 1.0):
        assert parse_method(f"adakv:alpha_safeguard={alpha:g}").values["alpha_safeguard"] == alpha
    for alpha in (-0.01, 1.01):
        message = f"method 'adakv': alpha_safeguard must be in [0, 1], got {alpha!r}"
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_method(f"adakv:alpha_safeguard={alpha}")


def test_method_spec_is_frozen_and_hashable() -> None:
    """A spec is a value: equal specs hash alike (usable as keys) and a field cannot be reassigned. Seeded bug
    caught: ``frozen=False`` (unhashable, mutable)."""
    spec = parse_method("lava:kernel_size=5")
    assert {spec: 1}[parse_method("lava:kernel_size=5")] == 1
    with pytest.raises(FrozenInstanceError):
        spec.name = "cake"  # type: ignore[misc]


def test_streamingllm_declared_sink_default_is_kvpress() -> None:
    """The declared ``n_sink`` default is kvpress's StreamingLLMPress's (4), the bare name builds it, and a spec
    giving 4 is the bare name. Seeded bug caught: the declared default 5."""
    declared = {p.name: p.default for p in METHOD_TABLE["streamingllm"].params}
    assert declared["n_sink"] == StreamingLLMPress().n_sink == 4
    assert make_press("streamingllm", budget=0.5).press.n_sink == 4
    assert parse_method("streamingllm:n_sink=4").canonical() == "streamingllm"
    assert make_press("streamingllm:n_sink=5", budget=0.5).press.n_sink == 5


def test_lava_token_scores_default_kernel_is_the_authors() -> None:
    """Without ``kernel_size`` the scores are those of kernel 7 (the authors' ``k7``, LavaRule's default), not of
    another width. Seeded bug caught: the default 8."""
    generator = torch.Generator().manual_seed(4)
    attention = torch.softmax(torch.randn(1, HEADS, 4, 20, generator=generator), dim=-1)
    values = torch.randn(1, KV_HEADS, 24, HEAD_DIM, generator=generator)
    default = lava_token_scores(attention, values)
    assert LavaRule().kernel_size == 7 and torch.equal(default, lava_token_scores(attention, values, kernel_size=7))
    assert not torch.equal(default, lava_token_scores(attention, values, kernel_size=5))
