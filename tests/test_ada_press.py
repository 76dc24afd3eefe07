"""LayerBudgetAdaPress / ``ripplekv-ada``: RippleKV's per-layer budgets, AdaKV's head-wise allocation in each layer."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kvpress import AdaKVPress, SnapKVPress

from ripplekv.allocation.budget import BudgetSpec, ProfileSchedule, TokenBudgetError
from ripplekv.allocation.schedules import UniformSchedule
from ripplekv.inference.generate import Prefill, greedy_decode, kept_tokens, prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.attention_masks import PaddedBatchError
from ripplekv.models.cache import layer_lengths
from ripplekv.models.headwise import MASKED_KEYS, headwise_of
from ripplekv.presses.layer_budget_ada_press import LayerBudgetAdaPress, headwise_keep_mask, safeguard_tokens
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.presses.registry import make_press
from ripplekv.profiling.sensitivity import ProfilingConfig, profile_model
from ripplekv_eval.fastpath.derive import derived_prefill
from ripplekv_eval.fastpath.fidelity import teacher_forced_logprobs
from ripplekv_eval.fastpath.hidden_tail import is_derivable
from ripplekv_eval.fastpath.record import record_prefill
from tests.conftest import random_ids, tiny_model
from tests.test_profiling import CharTokenizer, _calibration

WINDOW = 8
LAYERS = 4
KV_HEADS = 2  # tiny_model: 4 query heads over 2 KV heads
SCORES = (0.1, 2.0, 0.5, 1.2)

pytestmark = pytest.mark.usefixtures("one_thread")


def _masked(state: Prefill) -> dict[int, set[tuple[int, int, int]]]:
    """Per layer, the masked (batch, head, position) entries its cache layer holds."""
    found: dict[int, set[tuple[int, int, int]]] = {}
    for index, layer in enumerate(state.cache.layers):
        mask = headwise_of(layer)
        if mask is not None:
            found[index] = set(zip(*(t.tolist() for t in mask.indices)))
    return found


def _head_counts(state: Prefill, layer: int, k_len: int) -> list[int]:
    """Tokens each KV head of ``layer`` keeps (``k_len`` minus its masked entries)."""
    masked = _masked(state).get(layer, set())
    return [k_len - sum(1 for _, h, _ in masked if h == head) for head in range(KV_HEADS)]


def _ada(schedule, alpha: float = 0.2, **kwargs) -> LayerBudgetAdaPress:
    return LayerBudgetAdaPress(SnapKVPress(window_size=WINDOW), schedule, alpha_safeguard=alpha, **kwargs)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize(("budget", "alpha"), [(0.2, 0.2), (0.3, 0.6), (0.5, 0.5), (0.5, 1.0), (0.3, 0.0)])
def test_uniform_schedule_masks_what_kvpress_adakv_masks(arch: str, budget: float, alpha: float) -> None:
    model = enable_varlen_attention(tiny_model(arch, layers=LAYERS))
    ids = random_ids(100, seed=3)
    theirs = prefill(model, ids, AdaKVPress(SnapKVPress(1 - budget, window_size=WINDOW), alpha_safeguard=alpha))
    ours = prefill(model, ids, _ada(UniformSchedule(budget), alpha, evict_balanced=False))
    assert layer_lengths(ours.cache) == [100] * LAYERS  # masked, not evicted, as kvpress does
    assert _masked(ours) == _masked(theirs) and len(_masked(ours)) == LAYERS
    assert kept_tokens(ours) == kept_tokens(theirs) == [BudgetSpec(budget).average(100)] * LAYERS
    assert greedy_decode(model, ours, 6, set()) == greedy_decode(model, theirs, 6, set())


@pytest.mark.parametrize("tokens", [1, 17, 40])
def test_token_budget_masks_what_kvpress_adakv_masks_at_its_ratio(tokens: int) -> None:
    """``UniformSchedule(tokens=N)``: kvpress's AdaKV at ``compression_ratio_for(prompt)`` keeps the same entries."""
    model = enable_varlen_attention(tiny_model("llama", layers=LAYERS))
    ids = random_ids(100, seed=4)
    press = _ada(UniformSchedule(tokens=tokens), 0.2, evict_balanced=False, floor=1)
    ratio = press.compression_ratio_for(100)
    assert ratio == pytest.approx(1 - tokens / 100)
    with pytest.raises(TokenBudgetError, match="compression_ratio_for"):
        _ = press.compression_ratio
    theirs = prefill(model, ids, AdaKVPress(SnapKVPress(ratio, window_size=WINDOW), alpha_safeguard=0.2))
    ours = prefill(model, ids, press)
    assert _masked(ours) == _masked(theirs)
    assert kept_tokens(ours) == kept_tokens(theirs) == [tokens] * LAYERS


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_profile_schedule_keeps_the_layer_budgets_head_wise(arch: str) -> None:
    model = enable_varlen_attention(tiny_model(arch, layers=LAYERS))
    n = 120
    schedule = ProfileSchedule(0.3, SCORES, ratio=8.0, gamma=3.0)
    press = _ada(schedule, alpha=0.2)
    state = prefill(model, random_ids(n, seed=5), press)
    budgets = list(press.layer_budgets(LAYERS, n))
    assert budgets == list(LayerBudgetPress(SnapKVPress(window_size=WINDOW), schedule).layer_budgets(LAYERS, n))
    assert len(set(budgets)) > 1  # the profile really changed the per-layer budgets
    assert sum(budgets) == LAYERS * int(n * 0.3)  # SnapKV's total
    assert kept_tokens(state) == budgets
    unequal = 0
    for layer, budget in enumerate(budgets):
        counts = _head_counts(state, layer, layer_lengths(state.cache)[layer])
        assert sum(counts) == KV_HEADS * budget
        unequal += len(set(counts)) > 1
    assert unequal  # some layer shares its budget unevenly over heads: the allocation is AdaKV's, not SnapKV's


def test_safeguard_is_respected_and_binds() -> None:
    model = enable_varlen_attention(tiny_model("llama", layers=LAYERS))
    ids, n = random_ids(120, seed=11), 120
    schedule = ProfileSchedule(0.2, SCORES, ratio=8.0, gamma=3.0)
    budgets = _ada(schedule).layer_budgets(LAYERS, n)

    def smallest_heads(alpha: float) -> list[int]:
        state = prefill(model, ids, _ada(schedule, alpha))
        smallest = []
        for layer, budget in enumerate(budgets):
            counts = _head_counts(state, layer, layer_lengths(state.cache)[layer])
            assert sum(counts) == KV_HEADS * budget
            assert min(counts) >= safeguard_tokens(budget, alpha), (layer, counts, budget)
            smallest.append(min(counts))
        return smallest

    # without a safeguard some head keeps fewer tokens than a 0.9 safeguard allows: the safeguard binds below
    assert any(c < safeguard_tokens(b, 0.9) for c, b in zip(smallest_heads(0.0), budgets))
    smallest_heads(0.9)


def test_headwise_keep_mask_safeguard_on_a_lopsided_layer() -> None:
    scores = torch.tensor([[[9.0, 8.0, 7.0, 6.0, 5.0, 4.0], [0.5, 0.1, 0.3, 0.2, 0.4, 0.0]]])
    keep = headwise_keep_mask(scores, n_kept=3, n_safe=0)
    assert keep.sum(-1).tolist() == [[6, 0]]  # head 1 loses everything to head 0
    keep = headwise_keep_mask(scores, n_kept=3, n_safe=2)
    assert keep.sum(-1).tolist() == [[4, 2]]
    assert keep[0, 1].nonzero().flatten().tolist() == [0, 4]  # head 1's two best tokens
    assert safeguard_tokens(3, 0.2) == 1 and safeguard_tokens(10, 0.25) == 2 and safeguard_tokens(10, 0.0) == 0


def test_balanced_heads_are_evicted_physically() -> None:
    model = enable_varlen_attention(tiny_model("qwen2", layers=LAYERS))
    ids = random_ids(90, seed=7)
    schedule = ProfileSchedule(0.3, SCORES)
    evicted = prefill(model, ids, _ada(schedule, alpha=1.0))  # alpha 1: every head keeps its uniform share
    masked = prefill(model, ids, _ada(schedule, alpha=1.0, evict_balanced=False))
    full = prefill(model, ids)
    budgets = list(_ada(schedule).layer_budgets(LAYERS, 90))
    assert layer_lengths(evicted.cache) == kept_tokens(evicted) == kept_tokens(masked) == budgets
    assert not _masked(evicted)
    for layer, budget in enumerate(budgets):
        dropped = _masked(masked)[layer]
        for head in range(KV_HEADS):
            kept = [p for p in range(90) if (0, head, p) not in dropped]
            assert len(kept) == budget
            for got, whole in ((evicted.cache.layers[layer].keys, full.cache.layers[layer].keys),):
                assert torch.equal(got[0, head], whole[0, head, kept])
    # alpha 1 is SnapKV's per-head selection: same tokens as LayerBudgetPress, same greedy answer
    snap = prefill(model, ids, LayerBudgetPress(SnapKVPress(window_size=WINDOW), schedule))
    for ours, theirs in zip(evicted.cache.layers, snap.cache.layers):
        order = theirs.keys[..., 0].argsort(dim=-1)
        ordered = theirs.keys.gather(2, order.unsqueeze(-1).expand_as(theirs.keys))
        assert torch.equal(ours.keys[..., 0].sort(dim=-1).values, ordered[..., 0])
    assert greedy_decode(model, evicted, 6, set()) == greedy_decode(model, snap, 6, set())


def test_ripplekv_ada_through_a_shared_prefill() -> None:
    model = enable_varlen_attention(tiny_model("llama", layers=3))
    profile = profile_model(model, CharTokenizer(), _calibration(1), ProfilingConfig(repeats=1))
    press = make_press("ripplekv-ada", budget=0.25, profile=profile, window_size=WINDOW)
    ripple = make_press("ripplekv", budget=0.25, profile=profile, window_size=WINDOW)
    assert isinstance(press, LayerBudgetAdaPress) and press.profile is profile and is_derivable(press)
    ids = random_ids(96, seed=9)
    record = record_prefill(model, ids)
    derived, _ = derived_prefill(record, press)
    direct = prefill(model, ids, press)
    assert kept_tokens(derived) == kept_tokens(direct) == list(ripple.layer_budgets(3, 96))
    assert sum(kept_tokens(derived)) == 3 * int(96 * 0.25)
    assert _masked(derived) == _masked(direct)
    tokens = greedy_decode(model, direct, 6, set())
    assert greedy_decode(model, derived, 6, set()) == tokens
    torch.testing.assert_close(
        teacher_forced_logprobs(model, derived, tokens), teacher_forced_logprobs(model, direct, tokens)
    )
    assert all(MASKED_KEYS not in vars(layer.self_attn) for layer in model.model.layers)  # moved into the cache layers
    with pytest.raises(ValueError, match="needs a sensitivity profile"):
        make_press("ripplekv-ada", budget=0.25)
    other = tiny_model("llama", layers=3, seed=1)
    other.config.hidden_size = 32  # another architecture: the profile does not fit
    with pytest.raises(ValueError, match="config hashes differ"):
        prefill(other, ids, press)


def test_bad_arguments_are_clear_errors() -> None:
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="alpha_safeguard must be in"):
            LayerBudgetAdaPress(alpha_safeguard=bad)
    with pytest.raises(TypeError, match="alpha_safeguard must be a real number"):
        LayerBudgetAdaPress(alpha_safeguard="0.2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="evict_balanced must be a bool"):
        LayerBudgetAdaPress(evict_balanced=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ScorerPress"):
        LayerBudgetAdaPress(press=AdaKVPress(SnapKVPress()))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="SensitivityProfile"):
        LayerBudgetAdaPress(schedule=ProfileSchedule(0.2, SCORES), profile="p.json")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_kept must be in"):
        headwise_keep_mask(torch.zeros(1, 2, 5), n_kept=6, n_safe=0)
    with pytest.raises(ValueError, match="n_safe must be in"):
        headwise_keep_mask(torch.zeros(1, 2, 5), n_kept=2, n_safe=3)
    eager = tiny_model("llama", layers=2, attn="eager")
    with pytest.raises(ValueError, match="not eager"):
        prefill(eager, random_ids(60), _ada(UniformSchedule(0.3), evict_balanced=False))
    model = tiny_model("llama", layers=2)
    with pytest.raises(PaddedBatchError, match="padded batch"), torch.no_grad(), _ada(UniformSchedule(0.3))(model):
        model(random_ids(60).repeat(2, 1), attention_mask=torch.tensor([[0] * 5 + [1] * 55, [1] * 60]))


@st.composite
def _layers(draw: st.DrawFn) -> tuple[torch.Tensor, int, float]:
    batch, heads, tokens = draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 24))
    values = st.floats(-4, 4, allow_nan=False, width=32) | st.sampled_from([0.0, 1.0])  # ties included
    scores = torch.tensor(draw(st.lists(values, min_size=batch * heads * tokens, max_size=batch * heads * tokens)))
    return scores.view(batch, heads, tokens), draw(st.integers(0, tokens)), draw(st.floats(0, 1))


@settings(max_examples=150, deadline=None)
@given(_layers())
def test_headwise_keep_mask_invariants(layer: tuple[torch.Tensor, int, float]) -> None:
    scores, n_kept, alpha = layer
    batch, heads, tokens = scores.shape
    n_safe = safeguard_tokens(n_kept, alpha)
    before = scores.clone()
    keep = headwise_keep_mask(scores, n_kept, n_safe)
    assert torch.equal(scores, before)  # the scores are not written
    counts = keep.sum(-1)
    assert (counts.sum(-1) == n_kept * heads).all()  # the layer keeps exactly its budget of entries
    assert (counts >= n_safe).all() and (counts <= tokens).all()  # the safeguard
    if alpha == 1.0:
        assert (counts == n_kept).all()
    for b in range(batch):
        dropped = scores[b][~keep[b]]
        if not dropped.numel():
            continue
        chosen = []  # entries chosen across heads: each head's kept scores past its n_safe best
        for h in range(heads):
            kept, lost = scores[b, h][keep[b, h]].sort(descending=True).values, scores[b, h][~keep[b, h]]
            if kept.numel() and lost.numel():
                assert kept.min() >= lost.max()  # within a head, kept tokens outscore dropped ones
            chosen.append(kept[n_safe:])
        rest = torch.cat(chosen)
        if rest.numel():
            assert rest.min() >= dropped.max()  # nothing dropped outscores an entry chosen across heads


@settings(max_examples=100, deadline=None)
@given(
    scores=st.lists(st.floats(0, 10, allow_nan=False), min_size=2, max_size=12),
    budget=st.sampled_from([0.1, 0.2, 0.3, 0.5, 0.9]),
    prompt=st.integers(80, 5000),
    ratio=st.floats(1, 16),
    gamma=st.floats(1, 5),
)
def test_layer_budgets_follow_the_profile_schedule(
    scores: list[float], budget: float, prompt: int, ratio: float, gamma: float
) -> None:
    schedule = ProfileSchedule(budget, tuple(scores), ratio, gamma)
    layers = len(scores)
    ada = _ada(schedule)
    budgets = ada.layer_budgets(layers, prompt)
    assert budgets == LayerBudgetPress(SnapKVPress(window_size=WINDOW), schedule).layer_budgets(layers, prompt)
    assert sum(budgets) == layers * BudgetSpec(budget).average(prompt)  # SnapKV's total
    assert all(1 <= b <= prompt for b in budgets)
    uniform = replace(ada, schedule=UniformSchedule(budget)).layer_budgets(layers, prompt)
    assert uniform == (BudgetSpec(budget).average(prompt),) * layers  # kvpress AdaKV's per-layer count
