"""LAVa complete: its token score, its head-wise split with the floor, and the press that runs both (issue 26)."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from kvpress import SnapKVPress

from ripplekv.allocation.budget import BudgetSpec
from ripplekv.allocation.lava import lava_token_scores
from ripplekv.allocation.lava_heads import head_floor, lava_head_budgets
from ripplekv.allocation.per_prompt import PerPromptSchedule, top_k_counts
from ripplekv.allocation.squeezeattention import SqueezeAttentionRule
from ripplekv.inference.generate import Prefill, greedy_decode, kept_tokens, prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.cache import layer_lengths
from ripplekv.models.headwise import MASKED_KEYS
from ripplekv.presses.lava_press import LavaPress, headwise_select
from ripplekv.presses.lava_scorer import LavaScorerPress
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress
from ripplekv.presses.registry import make_press
from ripplekv.presses.scorers import make_scorer
from ripplekv_eval.fastpath.derive import derived_prefill
from ripplekv_eval.fastpath.fidelity import teacher_forced_logprobs
from ripplekv_eval.fastpath.record import record_prefill
from tests.conftest import random_ids, tiny_model
from tests.test_ada_press import _masked

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOW = 8
LAYERS = 4
PROMPT = 300  # long enough that LAVa's layer budgets differ on the tiny model
BUDGET = 0.4


# ---------------------------------------------------------------------------------------------- the head split


def _brute_force(scores: np.ndarray, per_head: int, alpha: float) -> set[tuple[int, ...]]:
    """Every integer split nearest (least squares) to the authors' real shares ``(1 - a) c_h + a b``, where ``c_h``
    counts head ``h``'s entries among the ``H b`` highest of the layer (sorted in Python; scores distinct)."""
    heads, tokens = scores.shape
    ranked = sorted(((float(scores[h, j]), h) for h in range(heads) for j in range(tokens)), reverse=True)
    counts = Counter(h for _, h in ranked[: heads * per_head])
    a = Fraction(alpha)
    shares = [(1 - a) * counts[h] + a * per_head for h in range(heads)]
    best, found = None, set()
    for split in itertools.product(range(tokens + 1), repeat=heads):
        if sum(split) != heads * per_head:
            continue
        error = sum((n - x) ** 2 for n, x in zip(split, shares))
        if best is None or error < best:
            best, found = error, {split}
        elif error == best:
            found.add(split)
    return found


def _cases(n: int) -> list[tuple[np.ndarray, int, float]]:
    rng = np.random.default_rng(26)
    cases = []
    for _ in range(n):
        heads, tokens = int(rng.integers(1, 4)), int(rng.integers(1, 6))
        alpha = float(rng.choice([0, 0.2, 0.5, 1, 0.37]))
        cases.append((rng.random((heads, tokens)), int(rng.integers(0, tokens + 1)), alpha))
    return cases


def test_head_split_equals_brute_force_on_small_layers() -> None:
    for scores, per_head, alpha in _cases(300):
        assert lava_head_budgets(scores, per_head, alpha) in _brute_force(scores, per_head, alpha)


def test_head_split_keeps_the_layer_budget_and_the_floor() -> None:
    rng = np.random.default_rng(1)
    for _ in range(300):
        heads, tokens = int(rng.integers(1, 9)), int(rng.integers(1, 60))
        per_head, alpha = int(rng.integers(0, tokens + 1)), float(rng.random())
        scores = rng.random((heads, tokens)) ** 4 * rng.random((heads, 1)) * 10  # heads of very different mass
        split = lava_head_budgets(scores, per_head, alpha)
        assert sum(split) == heads * per_head
        assert min(split) >= head_floor(per_head, alpha) == math.floor(Fraction(alpha) * per_head)
        assert max(split) <= tokens
    assert lava_head_budgets([[3.0, 2.0, 1.0], [0.0, 0.0, 0.0]], 2, 1.0) == (2, 2)  # alpha 1: no split
    assert lava_head_budgets([[3.0, 2.0, 1.0], [0.0, 0.0, 0.0]], 2, 0.0) == (3, 1)  # alpha 0: the joint top-k
    assert lava_head_budgets([[3.0, 2.0, 1.0], [0.0, 0.0, 0.0]], 2, 0.5) == (3, 1)  # 2.5 / 1.5: the larger count


def test_head_split_is_monotone_in_the_heads_scores() -> None:
    """A head whose sorted scores dominate another's (more mass) keeps at least as many tokens."""
    rng = np.random.default_rng(2)
    for _ in range(300):
        heads, tokens = int(rng.integers(2, 6)), int(rng.integers(1, 40))
        scores = rng.random((heads, tokens))
        scores[1] = scores[0] * rng.uniform(0.2, 0.99)  # head 1 dominated by head 0, elementwise
        rng.shuffle(scores[1])
        split = lava_head_budgets(scores, int(rng.integers(0, tokens + 1)), float(rng.random()))
        assert split[0] >= split[1]


def test_ties_at_the_threshold_are_shared_and_equal_heads_get_equal_counts() -> None:
    assert top_k_counts([[1.0, 1.0], [1.0, 1.0]], 2) == (1, 1)
    assert top_k_counts([[5.0, 5.0, 0.0], [5.0, 1.0, 0.0]], 2) == (Fraction(4, 3), Fraction(2, 3))
    assert lava_head_budgets(np.ones((3, 10)), 4, 0.2) == (4, 4, 4)


def _authors_counts(scores: np.ndarray, per_head: int, alpha: float) -> list[int]:
    """``update_kv_gqa`` (batch 1), its floor taken from the layer's own budget: topk over the flattened sorted scores,
    indices // length, scatter_add_, then round(c (1 - alpha) + int(alpha b))."""
    sorted_scores = torch.tensor(scores).sort(dim=-1, descending=True).values.unsqueeze(0)
    heads, length = scores.shape
    flat = sorted_scores.reshape(1, heads * length)
    chosen = torch.topk(flat, k=heads * per_head, dim=-1).indices // length
    counts = torch.zeros((1, heads), dtype=chosen.dtype).scatter_add_(-1, chosen, torch.ones_like(chosen))
    return torch.round(counts * (1 - alpha) + int(per_head * alpha)).int()[0].tolist()


def test_head_split_is_the_authors_rounding_wherever_that_sums_to_the_budget() -> None:
    rng = np.random.default_rng(3)
    agreed = 0
    for _ in range(200):
        heads, tokens = int(rng.integers(2, 8)), int(rng.integers(10, 80))
        per_head = 5 * int(rng.integers(1, tokens // 5 + 1))  # alpha * b an integer, shares never end in .5
        scores = rng.random((heads, tokens)) * rng.random((heads, 1))
        theirs = _authors_counts(scores, per_head, 0.2)
        if sum(theirs) == heads * per_head:
            agreed += 1
            assert list(lava_head_budgets(scores, per_head, 0.2)) == theirs
    assert agreed > 50


def test_head_split_rejects_bad_arguments() -> None:
    for scores, per_head, alpha, message in (
        ([[1.0, 2.0]], 3, 0.2, "per_head must be"),
        ([[1.0, 2.0]], 1, 1.5, "floor_alpha must be"),
        ([[1.0, float("nan")]], 1, 0.2, "finite"),
        ([1.0, 2.0], 1, 0.2, "heads, tokens"),
        ([[1.0, 2.0]], 1.5, 0.2, "per_head must be"),
    ):
        with pytest.raises(ValueError, match=message):
            lava_head_budgets(scores, per_head, alpha)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ the scorer


def _direct_scores(attention: torch.Tensor, values: torch.Tensor, kernel: int, gqa: bool) -> torch.Tensor:
    """LAVa's S from its formula, element by element: query head h reads KV head h // groups."""
    _, heads, _, prefix = attention.shape
    kv_heads = values.shape[1]
    groups = heads // kv_heads
    mean = attention[0].double().mean(dim=1)  # (heads, prefix)
    norm = [max(float(values[0, g, j].double().abs().sum()) for j in range(prefix)) for g in range(kv_heads)]
    half = kernel // 2
    per_query = torch.zeros(heads, prefix, dtype=torch.float64)
    for h in range(heads):
        for j in range(prefix):
            pooled = max(float(mean[h, i]) for i in range(max(0, j - half), min(prefix, j + half + 1)))
            per_query[h, j] = pooled * norm[h // groups]
    if not gqa:
        return per_query
    out = torch.zeros(kv_heads, prefix, dtype=torch.float64)
    for g in range(kv_heads):
        for j in range(prefix):
            out[g, j] = max(float(per_query[h, j]) for h in range(heads) if h // groups == g)
    return out


@pytest.mark.parametrize(("heads", "kv_heads", "gqa"), [(6, 2, True), (4, 2, True), (3, 3, True), (4, 2, False)])
def test_token_scores_equal_their_formula(heads: int, kv_heads: int, gqa: bool) -> None:
    generator = torch.Generator().manual_seed(heads * 10 + kv_heads)
    window, prefix = 3, 11
    attention = torch.softmax(3 * torch.randn(1, heads, window, prefix, generator=generator), dim=-1)
    values = torch.randn(1, kv_heads, prefix + window, 5, generator=generator)
    values[:, :, :prefix] *= torch.arange(1, kv_heads + 1).view(1, -1, 1, 1)  # KV heads of different norms
    ours = lava_token_scores(attention, values, kernel_size=3, pooling="maxpool", gqa_support=gqa)[0]
    torch.testing.assert_close(ours, _direct_scores(attention, values, 3, gqa))


def test_scorer_scores_the_prefix_by_the_formula_and_keeps_the_window() -> None:
    generator = torch.Generator().manual_seed(7)
    heads, kv_heads, n, window = 4, 2, 20, 5
    logits = torch.randn(1, heads, n, n, generator=generator).masked_fill(torch.ones(n, n).triu(1).bool(), -1e9)
    attentions = torch.softmax(logits, dim=-1)  # as eager attention returns them
    keys = torch.randn(1, kv_heads, n, 8, generator=generator)
    values = torch.randn(1, kv_heads, n, 8, generator=generator)
    module = SimpleNamespace(config=SimpleNamespace(num_attention_heads=heads))
    inputs = (module, torch.zeros(1, n, 16), keys, values, attentions, {})
    scores = LavaScorerPress(window_size=window, kernel_size=3).score(*inputs)  # type: ignore[arg-type]
    expected = _direct_scores(attentions[..., -window:, :-window], values, 3, True)
    assert scores.dtype == torch.float32 and scores.shape == (1, kv_heads, n)
    torch.testing.assert_close(scores[0, :, :-window].double(), expected, rtol=1e-5, atol=1e-7)
    assert bool((scores[0, :, -window:] > scores[0, :, :-window].max()).all())
    with pytest.raises(ValueError, match="per query head"):
        LavaScorerPress(window_size=window, gqa_support=False).score(*inputs)  # type: ignore[arg-type]
    for bad in ({"window_size": 0}, {"kernel_size": 4}, {"pooling": "mean"}, {"gqa_support": 1}):
        with pytest.raises(ValueError):
            LavaScorerPress(**bad)  # type: ignore[arg-type]
    assert make_scorer("lava", 16) == LavaScorerPress(window_size=16)


# ------------------------------------------------------------------------------------------------- the press


def _head_counts(state: Prefill, layer: int) -> list[int]:
    length = state.cache.layers[layer].keys.shape[2]
    heads = state.cache.layers[layer].keys.shape[1]
    masked = _masked(state).get(layer, set())
    return [length - sum(1 for _, h, _ in masked if h == head) for head in range(heads)]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return enable_varlen_attention(tiny_model("llama", layers=LAYERS))  # 4 query heads over 2 KV heads


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return random_ids(PROMPT, seed=3)


def _press(scorer: str = "lava", **kwargs: Any) -> LavaPress:
    press = make_press("lava", budget=BUDGET, window_size=WINDOW, scorer=scorer)
    assert isinstance(press, LavaPress)
    return LavaPress(press.press, press.schedule, statistic_window=press.statistic_window, **kwargs)


@pytest.mark.parametrize("scorer", ["lava", "snapkv", "knorm"])
def test_direct_press_equals_the_press_derived_from_a_record(model: Any, ids: torch.Tensor, scorer: str) -> None:
    press = _press(scorer)
    direct = prefill(model, ids, press)
    derived, _ = derived_prefill(record_prefill(model, ids), press)
    assert _masked(direct) == _masked(derived) and _masked(direct)  # some heads do keep fewer tokens
    for a, b in zip(direct.cache.layers, derived.cache.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    tokens = greedy_decode(model, direct, 6, set())
    assert greedy_decode(model, derived, 6, set()) == tokens
    torch.testing.assert_close(
        teacher_forced_logprobs(model, derived, tokens), teacher_forced_logprobs(model, direct, tokens)
    )
    assert all(MASKED_KEYS not in vars(layer.self_attn) for layer in model.model.layers)  # moved into the cache


def test_kvpress_context_manager_sets_the_same_cache_and_masks(model: Any, ids: torch.Tensor) -> None:
    """Under kvpress's own context manager the press writes the same masked cache layers (no module holds a mask)."""
    press = _press()
    expected = prefill(model, ids, press)
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model(ids, past_key_values=cache)
    assert all(MASKED_KEYS not in vars(layer.self_attn) for layer in model.model.layers)
    assert _masked(Prefill(cache, expected.next_logits, expected.prompt_tokens, 0.0)) == _masked(expected)
    for a, b in zip(cache.layers, expected.cache.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_every_layer_keeps_its_lava_budget_at_snapkvs_total(model: Any, ids: torch.Tensor) -> None:
    state = prefill(model, ids, _press())
    layer_rule = prefill(model, ids, make_press("lava-layer", budget=BUDGET, window_size=WINDOW, scorer="lava"))
    budgets = layer_lengths(layer_rule.cache)
    assert len(set(budgets)) > 1  # the layer rule does move budgets here
    assert kept_tokens(state) == budgets and sum(budgets) == LAYERS * BudgetSpec(BUDGET).average(PROMPT)
    for layer, budget in enumerate(budgets):
        counts = _head_counts(state, layer)
        assert sum(counts) == 2 * budget  # unmasked tokens of the layer: its budget in every head on average
        assert state.cache.layers[layer].keys.shape[2] == max(counts)  # memory: the largest head, not the prompt


def test_each_head_keeps_the_window_and_its_own_best_tokens_by_the_split(model: Any, ids: torch.Tensor) -> None:
    press = _press(floor_alpha=0.3)
    record = record_prefill(model, ids)
    state, _ = derived_prefill(record, press)
    masked = _masked(state)
    for index, (layer, kept) in enumerate(zip(record.layers, state.cache.layers)):
        inputs = (layer.module, layer.hidden_states, layer.keys, layer.values, None, layer.kwargs)
        scores = press.press.score(*inputs)
        budget = kept_tokens(state)[index]
        split = lava_head_budgets(scores[0, :, :-WINDOW].double().numpy(), budget - WINDOW, 0.3)
        for head in range(2):
            rows = [j for j in range(kept.keys.shape[2]) if (0, head, j) not in masked.get(index, set())]
            full = layer.keys[0, head]
            match = (kept.keys[0, head, rows][:, None, :] == full[None, :, :]).all(-1)
            positions = set(match.nonzero()[:, 1].tolist())
            row = scores[0, head]
            last = row.topk(WINDOW + split[head]).values[-1]  # max pooling ties neighbours: any tie may be kept
            assert len(positions) == WINDOW + split[head] and all(row[p] >= last for p in positions)
            assert set((row > last).nonzero()[:, 0].tolist()) <= positions
            assert set(range(PROMPT - WINDOW, PROMPT)) <= positions


def test_floor_alpha_one_gives_the_layer_rules_caches(model: Any, ids: torch.Tensor) -> None:
    state = prefill(model, ids, _press(floor_alpha=1.0))
    layer_rule = prefill(model, ids, make_press("lava-layer", budget=BUDGET, window_size=WINDOW, scorer="lava"))
    assert not _masked(state)
    for a, b in zip(state.cache.layers, layer_rule.cache.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_headwise_select_masks_the_surplus_past_each_heads_count() -> None:
    keys = torch.arange(2 * 6, dtype=torch.float32).view(1, 2, 6, 1)
    scores = torch.tensor([[[6.0, 5, 4, 3, 2, 1], [1.0, 2, 3, 4, 5, 6]]])
    kept_keys, _, masked = headwise_select(keys, keys, scores, [[4, 2]])
    assert kept_keys[0, :, :, 0].tolist() == [[0, 1, 2, 3], [11, 10, 9, 8]]
    assert masked is not None and set(zip(*(t.tolist() for t in masked))) == {(0, 1, 2), (0, 1, 3)}
    whole_keys, _, masked = headwise_select(keys, keys, scores, [[6, 3]])  # a head keeps all: in position order
    assert torch.equal(whole_keys, keys)
    assert masked is not None and set(zip(*(t.tolist() for t in masked))) == {(0, 1, 0), (0, 1, 1), (0, 1, 2)}


def test_registry_and_validation() -> None:
    full = make_press("lava", budget=0.2)
    layer = make_press("lava-layer", budget=0.2)
    assert isinstance(full, LavaPress) and isinstance(full.press, SnapKVPress)  # the plain name: SnapKV's scorer
    assert isinstance(layer, PerPromptBudgetPress) and not isinstance(layer, LavaPress)
    assert isinstance(make_press("lava", budget=0.2, scorer="lava").press, LavaScorerPress)
    assert isinstance(LavaPress().press, LavaScorerPress)  # the class default: LAVa's own scorer
    for bad in (-0.1, 1.5, float("nan"), "0.2"):
        with pytest.raises(ValueError, match="floor_alpha"):
            LavaPress(floor_alpha=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="residual"):
        LavaPress(SnapKVPress(window_size=8), PerPromptSchedule(SqueezeAttentionRule(), 0.2, window_size=8))
    eager = tiny_model("llama", layers=2, attn="eager")
    with pytest.raises(ValueError, match="eager"):
        prefill(eager, random_ids(200), LavaPress(SnapKVPress(window_size=8), floor_alpha=0.0))


@pytest.mark.slow
def test_lava_on_smollm2_direct_equals_derived(smollm2: dict[str, Any]) -> None:
    model, tokenizer = smollm2["model"], smollm2["tokenizer"]
    text = " ".join(f"Item {i} is stored in box {i * 7 % 31} of room {i % 5}." for i in range(60))
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :600]
    press = make_press("lava", budget=0.2, scorer="lava")
    direct = prefill(model, ids, press)
    derived, _ = derived_prefill(record_prefill(model, ids), press)
    layer_rule = prefill(model, ids, make_press("lava-layer", budget=0.2, scorer="lava"))
    assert kept_tokens(direct) == kept_tokens(derived) == layer_lengths(layer_rule.cache)
    assert sum(kept_tokens(direct)) == 30 * BudgetSpec(0.2).average(ids.shape[1])  # SnapKV's total
    assert _masked(direct) == _masked(derived) and len(_masked(direct)) > 10
    for a, b in zip(direct.cache.layers, derived.cache.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    tokens = greedy_decode(model, direct, 8, set())
    assert greedy_decode(model, derived, 8, set()) == tokens
    torch.testing.assert_close(
        teacher_forced_logprobs(model, derived, tokens), teacher_forced_logprobs(model, direct, tokens)
    )
