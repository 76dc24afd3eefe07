"""Teacher-forced log-probabilities over (compressed) caches, KL / top-1 fidelity and mean NLL."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kvpress import SnapKVPress
from scipy.special import log_softmax, rel_entr

from ripplekv.inference.generate import Prefill, extend, greedy_decode, prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.cache import cache_tensors, layer_lengths
from ripplekv.presses.registry import make_press
from ripplekv.presses.ripplekv_press import RippleKVPress
from ripplekv_eval.fastpath.derive import derived_prefill
from ripplekv_eval.fastpath.fidelity import Fidelity, fidelity, mean_nll, teacher_forced_logprobs
from ripplekv_eval.fastpath.record import record_prefill
from tests.conftest import ARCHITECTURES, VOCAB, random_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOW = 8
SCORES = (0.5, 3.0, 0.1, 1.2)
ATOL = 5e-5  # one multi-token float32 pass against token-by-token passes


@pytest.fixture(scope="module", params=ARCHITECTURES)
def model(request: pytest.FixtureRequest):
    return enable_varlen_attention(tiny_model(request.param, layers=4))


@torch.no_grad()
def stepwise_logprobs(model, state: Prefill, tokens: list[int]) -> torch.Tensor:
    """Reference: feed ``tokens`` one at a time over a copy of the cache, collecting each next-token distribution."""
    cache = prefill(model, torch.tensor([[0]])).cache  # a fresh container, refilled below
    cache.layers = [type(layer)() for layer in state.cache.layers]
    for layer, (keys, values) in zip(cache.layers, cache_tensors(state.cache)):
        layer.update(keys.clone(), values.clone())
    rows, logits = [], state.next_logits
    for i, token in enumerate(tokens):
        rows.append(torch.log_softmax(logits.double(), dim=-1))
        position = torch.tensor([state.prompt_tokens + i])
        logits = model(
            torch.tensor([[token]]),
            past_key_values=cache,
            cache_position=position,
            position_ids=position[None],
            use_cache=True,
        ).logits[0, -1]
    return torch.stack(rows)


def _presses() -> dict[str, object]:
    return {
        "full": None,
        "snapkv": SnapKVPress(compression_ratio=0.7, window_size=WINDOW),
        "pyramidkv": make_press("pyramidkv", budget=0.3, window_size=WINDOW),  # the authors' schedule
        "ripplekv": RippleKVPress(press=SnapKVPress(window_size=WINDOW), budget=0.3, scores=SCORES),
    }


def test_teacher_forced_equals_token_by_token(model) -> None:
    ids = random_ids(72, seed=21)
    for name, press in _presses().items():
        state = prefill(model, ids, press)
        if name in ("pyramidkv", "ripplekv"):
            assert len(set(layer_lengths(state.cache))) > 1, name  # per-layer compressed
        lengths, keys = layer_lengths(state.cache), [k.clone() for k, _ in cache_tensors(state.cache)]
        tokens = greedy_decode(model, state, 10, set())
        forced = teacher_forced_logprobs(model, state, tokens)
        assert forced.shape == (10, VOCAB) and forced.dtype == torch.float64
        torch.testing.assert_close(forced, stepwise_logprobs(model, state, tokens), atol=ATOL, rtol=0)
        assert forced.argmax(dim=-1).tolist() == tokens  # greedy tokens are the argmax of their rows
        torch.testing.assert_close(forced.exp().sum(-1), torch.ones(10, dtype=torch.float64))
        # the given Prefill is untouched and can be forced again
        assert layer_lengths(state.cache) == lengths
        assert all(torch.equal(k, k0) for (k, _), k0 in zip(cache_tensors(state.cache), keys))
        assert torch.equal(teacher_forced_logprobs(model, state, tokens), forced)
        # forcing other tokens than the greedy ones also follows the cache
        other = [int(t) for t in random_ids(6, seed=22)[0]]
        torch.testing.assert_close(
            teacher_forced_logprobs(model, state, other), stepwise_logprobs(model, state, other), atol=ATOL, rtol=0
        )
    one = teacher_forced_logprobs(model, state, [3])
    torch.testing.assert_close(one[0], torch.log_softmax(state.next_logits.double(), -1))


def test_query_agnostic_positions(model) -> None:
    context, question = random_ids(64, seed=23), random_ids(7, seed=24)
    tokens = [int(t) for t in random_ids(5, seed=25)[0]]
    # full cache: one forward pass over context + question + tokens[:-1] gives the same rows
    state = extend(model, prefill(model, context), question)
    with torch.no_grad():
        logits = model(torch.cat([context, question, torch.tensor([tokens[:-1]])], dim=1)).logits[0]
    direct = torch.log_softmax(logits[64 + 7 - 1 :].double(), dim=-1)
    torch.testing.assert_close(teacher_forced_logprobs(model, state, tokens), direct, atol=ATOL, rtol=0)
    # derived per-layer compressed caches, question run over them with extend
    record = record_prefill(model, context)
    for name in ("snapkv", "ripplekv"):
        derived = extend(model, derived_prefill(record, _presses()[name])[0], question)
        assert derived.prompt_tokens == 71
        forced = teacher_forced_logprobs(model, derived, tokens)
        torch.testing.assert_close(forced, stepwise_logprobs(model, derived, tokens), atol=ATOL, rtol=0)


def test_fidelity_against_a_direct_computation() -> None:
    rng = np.random.default_rng(0)
    ref = log_softmax(rng.normal(size=(7, 50)) * 3, axis=-1)
    cand = log_softmax(rng.normal(size=(7, 50)) * 3, axis=-1)
    assert (ref.argmax(-1) != cand.argmax(-1)).all()
    tokens = [int(t) for t in cand.argmax(-1)[:3]] + [int(t) for t in ref.argmax(-1)[3:]]  # 3 of 7 agree
    result = fidelity(torch.from_numpy(ref), torch.from_numpy(cand), tokens)
    expected = rel_entr(np.exp(ref), np.exp(cand)).sum(-1).mean()
    assert isinstance(result, Fidelity) and result.positions == 7
    assert result.kl == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert result.top1 == 3 / 7
    # float32 inputs are computed in float64
    ref32, cand32 = torch.from_numpy(ref).float(), torch.from_numpy(cand).float()
    direct64 = rel_entr(ref32.double().exp().numpy(), cand32.double().exp().numpy()).sum(-1).mean()
    assert fidelity(ref32, cand32, tokens).kl == pytest.approx(direct64, rel=1e-12)
    # zero-probability reference entries contribute 0, not NaN
    sparse = torch.from_numpy(ref).clone()
    sparse[:, 0] = float("-inf")
    sparse = torch.log_softmax(sparse, dim=-1)
    assert np.isfinite(fidelity(sparse, torch.from_numpy(cand), tokens).kl)


def test_kl_of_a_cache_with_itself_is_zero_and_top1_counts(model) -> None:
    state = prefill(model, random_ids(50, seed=26))
    tokens = greedy_decode(model, state, 6, set())
    forced = teacher_forced_logprobs(model, state, tokens)
    same = fidelity(forced, teacher_forced_logprobs(model, state, tokens), tokens)
    assert same == Fidelity(kl=0.0, top1=1.0, positions=6)
    # top1 counts the rows whose argmax is the forced token
    cand = torch.full((4, 5), -10.0, dtype=torch.float64)
    cand[torch.arange(4), torch.tensor([1, 2, 3, 4])] = 0.0
    assert fidelity(cand, cand, [1, 0, 3, 0]).top1 == 0.5
    assert fidelity(cand, cand, [1, 2, 3, 4]).top1 == 1.0


def test_mean_nll_and_validation() -> None:
    logprobs = torch.log_softmax(torch.randn(3, 10, dtype=torch.float64), dim=-1)
    tokens = [4, 0, 9]
    expected = -(logprobs[0, 4] + logprobs[1, 0] + logprobs[2, 9]) / 3
    assert mean_nll(logprobs, tokens) == pytest.approx(float(expected), rel=1e-15)
    with pytest.raises(ValueError, match="3 rows for 2 tokens"):
        mean_nll(logprobs, [1, 2])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        mean_nll(logprobs, [1, 2, 10])
    with pytest.raises(ValueError, match="differ in shape"):
        fidelity(logprobs, logprobs[:, :5], tokens)
    with pytest.raises(ValueError, match="at least one token"):
        teacher_forced_logprobs(None, Prefill(None, torch.zeros(10), 1, 0.0), [])  # type: ignore[arg-type]


def test_fidelity_kl_covers_every_row_when_positions_exceed_the_vocabulary() -> None:
    """The row blocks tile the positions, not the vocabulary: with 9 positions over a vocabulary of 3 every row's KL
    enters the mean, the last rows (the farthest apart here) included. Kills ``row_blocks(ref.shape[1])``."""
    rng = np.random.default_rng(7)
    ref = log_softmax(rng.normal(size=(9, 3)) * 2, axis=-1)
    cand = log_softmax(rng.normal(size=(9, 3)) * 2, axis=-1)
    cand[5:] = log_softmax(-8 * np.exp(ref[5:]), axis=-1)  # the last rows far from the reference
    per_row = rel_entr(np.exp(ref), np.exp(cand)).sum(-1)
    assert (per_row[5:] > 2 * per_row[:5].max()).all()
    result = fidelity(torch.from_numpy(ref), torch.from_numpy(cand), [0] * 9)
    assert result.positions == 9
    assert result.kl == pytest.approx(per_row.mean(), rel=1e-12)
