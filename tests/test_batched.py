"""Batched decoding and teacher forcing of every compressed cache of one prompt (ripplekv_eval.fastpath.batched)."""

from __future__ import annotations

import pytest
import torch

from ripplekv.inference.generate import Prefill, cache_forward, extend, greedy_decode
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.presses.registry import make_press
from ripplekv_eval.fastpath.batched import (
    NotBatchableError,
    batched_teacher_forced_logprobs,
    pad_layers,
    padded_batch,
)
from ripplekv_eval.fastpath.derive import derived_prefill
from ripplekv_eval.fastpath.fidelity import teacher_forced_logprobs
from ripplekv_eval.fastpath.padded import KeyValidity
from ripplekv_eval.fastpath.record import record_prefill
from tests.conftest import decode_batch, random_ids, synthetic_profile, tiny_model
from tests.test_ada_press import _masked

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = 160
METHODS = ("full", "streamingllm", "snapkv", "pyramidkv", "adakv", "ripplekv")


@pytest.fixture(scope="module", params=("llama", "qwen2", "mistral"))
def model(request):
    return enable_varlen_attention(tiny_model(request.param, layers=3, seed=3))


def _states(model, window: int = 16) -> list[Prefill]:
    record = record_prefill(model, random_ids(PROMPT, seed=5))
    profile = synthetic_profile(model)
    states = []
    for method in METHODS:
        for budget in (1.0,) if method == "full" else (0.2, 0.5):
            press = make_press(method, budget=budget, profile=profile, window_size=window)
            states.append(derived_prefill(record, press)[0])
    return states


def test_batched_greedy_equals_one_at_a_time(model) -> None:
    states = _states(model)
    lengths = {tuple(layer.keys.shape[2] for layer in s.cache.layers) for s in states}
    assert len(lengths) > 3, "the caches should differ in per-layer lengths"
    assert any(map(_masked, states)), "AdaKV's head-wise masks should be among the rows"
    stops = {7, 11, 200}
    sequential = [greedy_decode(model, s, 12, stops, min_new_tokens=1) for s in states]
    batched = decode_batch(model, states, 12, stops, min_new_tokens=1)
    assert batched == sequential
    assert {len(t) for t in sequential} != {12} or True  # rows may stop early; equality above is the check
    fours = [states[i : i + 4] for i in range(0, len(states), 4)]  # in batches of four rows: the same tokens
    assert [t for rows in fours for t in decode_batch(model, rows, 12, stops, min_new_tokens=1)] == sequential


def test_rows_leave_the_batch_when_they_stop(model) -> None:
    states = _states(model)
    free = [greedy_decode(model, s, 10, set()) for s in states]
    # Make the second token of some rows a stop token: those rows must stop there, the others go on unchanged.
    stops = {free[1][1], free[4][1]}
    sequential = [greedy_decode(model, s, 10, stops) for s in states]
    assert any(len(t) < 10 for t in sequential) and any(len(t) == 10 for t in sequential)
    assert decode_batch(model, states, 10, stops) == sequential


def test_min_new_tokens_bans_stops_in_every_row(model) -> None:
    states = _states(model)
    first = {int(s.next_logits.argmax()) for s in states}
    sequential = [greedy_decode(model, s, 4, first, min_new_tokens=2) for s in states]
    batched = decode_batch(model, states, 4, first, min_new_tokens=2)
    assert batched == sequential
    assert all(t[0] not in first and t[1] not in first for t in batched)


def test_batched_teacher_forcing_matches(model) -> None:
    states = _states(model)
    tokens = greedy_decode(model, states[0], 9, set())
    batched = batched_teacher_forced_logprobs(model, states, tokens, max_rows=5)
    for state, got in zip(states, batched):
        want = teacher_forced_logprobs(model, state, tokens)
        assert got.dtype == torch.float64 and got.shape == want.shape
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


def test_padding_is_masked_not_attended() -> None:
    """A masked (padded) entry gets zero weight: garbage in the padding must not change any row."""
    model = enable_varlen_attention(tiny_model("llama", layers=2, seed=1))
    states = _states(model)
    cache, validity = padded_batch(states)
    assert not bool(validity.layers[0].all()), "some rows should be padded"
    for layer, valid in zip(cache.layers, validity.layers):
        layer.keys[~valid] = 1e4  # poison exactly the entries the rows must not see
        layer.values[~valid] = 1e4
    step = torch.tensor([[5]] * len(states))
    pos = torch.tensor([PROMPT])
    poisoned = model(
        step,
        past_key_values=cache,
        use_cache=True,
        cache_position=pos,
        position_ids=pos.expand(len(states), 1),
        key_validity=validity,
    ).logits[:, -1]
    for row, state in enumerate(states):
        alone = extend(model, state, torch.tensor([[5]])).next_logits
        torch.testing.assert_close(poisoned[row], alone, atol=1e-4, rtol=1e-4)


def test_states_at_other_positions_are_refused() -> None:
    model = enable_varlen_attention(tiny_model("llama", layers=2))
    states = _states(model)
    moved = extend(model, states[1], torch.tensor([[3]]))
    with pytest.raises(NotBatchableError, match="same positions"):
        decode_batch(model, [states[0], moved], 3, set())


def test_validation() -> None:
    model = enable_varlen_attention(tiny_model("llama", layers=2))
    states = _states(model)
    with pytest.raises(ValueError, match="max_new_tokens"):
        decode_batch(model, states, 0, set())
    with pytest.raises(ValueError, match="no caches"):
        padded_batch([])
    with pytest.raises(TypeError, match="boolean"):
        KeyValidity((torch.ones(2, 3),))
    with pytest.raises(ValueError, match="rows"):
        KeyValidity((torch.ones(2, 1, 3, dtype=torch.bool), torch.ones(3, 1, 3, dtype=torch.bool)))
    with pytest.raises(ValueError, match="do not match"):
        pad_layers([(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), None), (torch.zeros(1, 3, 3, 4),) * 2 + (None,)])


def test_mask_layout() -> None:
    valid = torch.tensor([[[False, True, True]], [[True, False, True]]])  # 2 rows, 1 KV head, 3 cached
    mask = KeyValidity((valid,)).mask(0, query_len=2, key_len=6, heads=2)
    assert mask.shape == (2, 2, 2, 6)
    # row 0: padding hidden; one appended token seen by both queries; the two new tokens causal
    assert mask[0, 1].tolist() == [[False, True, True, True, True, False], [False, True, True, True, True, True]]
    assert mask[1, 0, 0].tolist() == [True, False, True, True, True, False]
    with pytest.raises(ValueError, match="does not match"):
        KeyValidity((valid,)).mask(0, query_len=2, key_len=4, heads=2)


def test_batches_group_similar_caches_and_compact_headwise_masks(model) -> None:
    from ripplekv_eval.fastpath.batched import STEP_COST_TOKENS, plan_batches, row_lengths

    states = _states(model)
    full = sum(layer.keys.shape[2] for layer in states[0].cache.layers)
    adakv = [s for s in states if _masked(s)]
    assert adakv and all(sum(row_lengths(s)) < full for s in adakv), "AdaKV rows must cost what they keep"
    for max_rows in (None, 2):
        batches = plan_batches(states, max_rows)
        assert sorted(i for batch in batches for i in batch) == list(range(len(states)))
        assert max_rows is None or all(len(batch) <= max_rows for batch in batches)
        for batch in batches:  # each batch is cheaper than decoding its last (largest) row apart
            lengths = [row_lengths(states[i]) for i in batch]
            layers = len(lengths[0])
            padded = len(batch) * sum(max(column) for column in zip(*lengths)) / layers
            without = (len(batch) - 1) * sum(max(column) for column in zip(*lengths[:-1] or [[0] * layers])) / layers
            assert len(batch) == 1 or padded <= without + STEP_COST_TOKENS + sum(lengths[-1]) / layers
    assert plan_batches(states) == [sorted(range(len(states)), key=lambda i: sum(row_lengths(states[i])))]
    cache, validity = padded_batch(adakv)
    assert all(layer.keys.shape[2] < states[0].cache.layers[0].keys.shape[2] for layer in cache.layers)
    assert all(bool(valid.any(dim=-1).all()) for valid in validity.layers)


def test_ragged_batch_multi_token_pass_matches_each_cache_alone(model) -> None:
    """A 3-token pass over a ragged batch (causal among the new tokens, AdaKV rows masked) equals extend()."""
    from ripplekv_eval.fastpath.batched import decode_row, ragged_cache_of

    states = _states(model)
    cache = ragged_cache_of([decode_row(state, 3) for state in states])
    new = torch.tensor([[5, 9, 2]])
    positions = torch.arange(PROMPT, PROMPT + 3)
    logits = cache_forward(model, new.expand(len(states), -1), cache, positions)
    for row, state in enumerate(states):
        for i in range(3):  # every position: the new tokens are causal among themselves
            alone = extend(model, state, new[:, : i + 1]).next_logits
            torch.testing.assert_close(logits[row, i], alone, atol=1e-4, rtol=1e-4)
    assert [layer.lengths for layer in cache.layers][0][0] == states[0].cache.layers[0].keys.shape[2] + 3
    with pytest.raises(ValueError, match="room"):
        cache_forward(model, torch.tensor([[1]] * len(states)), cache, torch.tensor([PROMPT + 3]))
