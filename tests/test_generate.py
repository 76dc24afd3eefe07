"""Greedy decoding: min_new_tokens, no mutation of a Prefill, forks, kept tokens, generate_answer with AdaKV."""

from __future__ import annotations

import pytest
import torch
from kvpress import SnapKVPress

from ripplekv.inference.generate import Prefill, extend, generate_answer, greedy_decode, kept_tokens, prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.cache import (
    PassThroughLayer,
    PreallocatedLayer,
    cache_from_layers,
    cache_from_tensors,
    cache_tensors,
    fork_cache,
    layer_lengths,
)
from ripplekv.models.headwise import MASKED_KEYS, attention_modules
from ripplekv.presses.registry import make_press
from ripplekv.presses.ripplekv_press import RippleKVPress
from tests.conftest import random_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

SCORES = (0.5, 3.0, 0.1, 1.2)


@pytest.fixture(scope="module")
def model():
    return enable_varlen_attention(tiny_model("llama", layers=4))


def test_min_new_tokens_bans_stop_ids_like_transformers(model) -> None:
    ids = random_ids(40, seed=11)
    state = prefill(model, ids)
    first = int(state.next_logits.argmax())  # make the model's first choice a stop id
    assert greedy_decode(model, state, 8, {first}) == [first]
    tokens = greedy_decode(model, state, 8, {first}, min_new_tokens=1)
    second = int(state.next_logits.topk(2).indices[1])
    assert tokens[0] == second and len(tokens) > 1
    for min_new in (1, 3):
        ours = greedy_decode(model, state, 8, {first}, min_new_tokens=min_new)
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=8,
                min_new_tokens=min_new,
                eos_token_id=first,
                pad_token_id=first,
                do_sample=False,
            )
        theirs = out[0, 40:].tolist()
        if first in theirs:
            theirs = theirs[: theirs.index(first) + 1]
        assert ours == theirs
        assert first not in ours[:min_new]
    # a stop id outside the vocabulary is ignored by the ban; bad arguments are clear errors
    assert greedy_decode(model, state, 2, {first, 10**6}, min_new_tokens=1)[0] == second
    with pytest.raises(ValueError, match="min_new_tokens"):
        greedy_decode(model, state, 4, set(), min_new_tokens=-1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_decode(model, state, 0, set())


def test_passes_never_mutate_the_given_prefill(model) -> None:
    ids = random_ids(70, seed=12)
    press = RippleKVPress(press=SnapKVPress(window_size=8), budget=0.3, scores=SCORES)
    state = prefill(model, ids, press)
    layers = list(state.cache.layers)
    before = [(k.clone(), v.clone(), k._version, v._version) for k, v in cache_tensors(state.cache)]
    lengths = layer_lengths(state.cache)
    first = greedy_decode(model, state, 10, set())
    extended = extend(model, state, random_ids(5, seed=13))
    assert greedy_decode(model, state, 10, set()) == first  # decoded twice from one Prefill
    assert extended.cache is not state.cache and layer_lengths(extended.cache) == [n + 5 for n in lengths]
    assert state.cache.layers == layers and layer_lengths(state.cache) == lengths
    for (k, v), (k0, v0, kv, vv) in zip(cache_tensors(state.cache), before):
        assert torch.equal(k, k0) and torch.equal(v, v0) and k._version == kv and v._version == vv
    assert greedy_decode(model, extended, 6, set()) == greedy_decode(model, extended, 6, set())


def test_fork_cache_shares_tensors_and_refuses_in_place_layers() -> None:
    keys = torch.randn(1, 2, 1, 16)
    state = prefill(tiny_model("mistral", layers=2), random_ids(9, seed=1))
    fork = fork_cache(state.cache)
    assert fork is not state.cache and all(a is not b for a, b in zip(fork.layers, state.cache.layers))
    assert all(a[0] is b[0] for a, b in zip(cache_tensors(fork), cache_tensors(state.cache)))
    fork.layers[0].update(keys, keys)
    assert layer_lengths(fork)[0] == 10 and layer_lengths(state.cache)[0] == 9
    for layer in (PreallocatedLayer(torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4), 5), PassThroughLayer(5)):
        with pytest.raises(TypeError, match="cannot fork cache layer 0"):
            fork_cache(cache_from_layers([layer]))


def test_kept_tokens_do_not_count_adakv_masked_keys(model) -> None:
    ids = random_ids(80, seed=14)
    press = make_press("adakv", budget=0.3, window_size=8)
    state = prefill(model, ids, press)
    assert layer_lengths(state.cache) == [80] * 4  # AdaKV keeps every key and masks some per head
    assert all(getattr(m, MASKED_KEYS, None) is None for m in attention_modules(model))  # moved into the cache
    n_kept = int(80 * (1 - press.compression_ratio))  # kvpress's compute_n_kept
    assert kept_tokens(state) == [n_kept] * 4
    plain = Prefill(cache_from_tensors(cache_tensors(state.cache)), state.next_logits, state.prompt_tokens, 0.0)
    assert kept_tokens(plain) == [80] * 4
    snap = prefill(model, ids, make_press("snapkv", budget=0.3, window_size=8))
    assert kept_tokens(snap) == layer_lengths(snap.cache) == [n_kept] * 4


class _Tokenizer:
    """Characters as token ids (0-255), enough for generate_answer without a chat template."""

    eos_token_id = None
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = False, return_tensors: str = "pt") -> dict:
        return {"input_ids": torch.tensor([[ord(c) % 256 for c in text]])}

    def decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(t) for t in tokens)


def test_generate_answer_with_adakv_both_protocols(model) -> None:
    context = "".join(chr(97 + i % 26) for i in range(90))
    press = make_press("adakv", budget=0.2, window_size=8)
    for protocol in ("question-aware", "query-agnostic"):
        result = generate_answer(model, _Tokenizer(), context, "why?", press, max_new_tokens=5, protocol=protocol)
        assert len(result.token_ids) == 5
        assert all(n < result.prompt_tokens * 0.3 for n in result.layer_tokens), result.layer_tokens
        assert result.kv_bytes == result.full_kv_bytes  # masked keys are not freed
    assert all(getattr(m, MASKED_KEYS, None) is None for m in attention_modules(model))
