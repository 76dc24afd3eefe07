"""A head-wise masked cache (``adakv``, ``ripplekv-ada``, ``lava``) is attended masked however the model is called:
``model(token, past_key_values=cache)``, ``model.generate(past_key_values=cache)`` and ``cache_forward`` (issue 45,
item 1). Each pass runs over a cache and over the same cache with garbage in its masked entries: equal outputs mean
the masks were read. Seeded bug caught by every test of the three ways: the attention function finds the cache only
when the caller passes it as ``ripplekv_cache=`` (the pre-hook that hands it on removed)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import DynamicCache

from ripplekv.inference.generate import Prefill, cache_forward, prefill
from ripplekv.models.attention import HeadwiseMaskError, enable_varlen_attention, hand_cache_to_attention
from ripplekv.models.cache import cache_from_layers, dynamic_layer, fork_cache
from ripplekv.models.headwise import MASKED_KEYS, attention_modules, headwise_of
from ripplekv.presses.registry import make_press
from tests.conftest import random_ids, synthetic_profile, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

METHODS = ("adakv", "ripplekv-ada", "lava")
WINDOW = 8
PROMPT = 120
TOKEN = 7  # the token run over each cache


def _masked_state(model: Any, method: str) -> Prefill:
    """The prefill of ``method`` at 30%, whose cache holds head-wise masked layers."""
    profile = synthetic_profile(model) if method == "ripplekv-ada" else None
    press = make_press(method, budget=0.3, window_size=WINDOW, profile=profile)
    state = prefill(model, random_ids(PROMPT, seed=4), press)
    assert any(headwise_of(layer) is not None for layer in state.cache.layers), method
    assert all(MASKED_KEYS not in vars(module) for module in attention_modules(model))  # nothing on the modules
    return state


def _garbled(cache: DynamicCache) -> DynamicCache:
    """A copy of ``cache`` whose masked entries hold large keys and values (attended, they would dominate)."""
    layers = []
    for layer in cache.layers:
        mask = headwise_of(layer)
        keys, values = layer.keys.clone(), layer.values.clone()
        if mask is not None:
            keys[mask.indices] = 8.0
            values[mask.indices] = 50.0
        layers.append(dynamic_layer(keys, values, None if mask is None else mask.indices))
    return cache_from_layers(layers)


def _plain(model: Any, cache: DynamicCache) -> torch.Tensor:
    """One token through ``model(...)``, the position read from the cache as transformers reads it."""
    with torch.no_grad():
        return model(torch.tensor([[TOKEN]]), past_key_values=cache, use_cache=True).logits[0]


def _generated(model: Any, cache: DynamicCache) -> torch.Tensor:
    """Three greedy steps of ``model.generate`` after the token, their logits stacked."""
    ids = torch.full((1, cache.get_seq_length() + 1), TOKEN)  # the cached positions' ids are not read
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        past_key_values=cache,
        max_new_tokens=3,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    return torch.cat(out.logits)


def _forwarded(model: Any, cache: DynamicCache) -> torch.Tensor:
    """One token through :func:`cache_forward` at the position transformers reads from the cache."""
    with torch.no_grad():
        return cache_forward(model, torch.tensor([[TOKEN]]), cache, torch.tensor([cache.get_seq_length()]))[0]


WAYS = {"model": _plain, "generate": _generated, "cache_forward": _forwarded}


@pytest.fixture(scope="module")
def model() -> Any:
    return enable_varlen_attention(tiny_model("llama", layers=4))


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("method", METHODS)
def test_every_way_of_calling_reads_the_cache_layers_masks(model: Any, method: str, way: str) -> None:
    state = _masked_state(model, method)
    run = WAYS[way]
    ours = run(model, fork_cache(state.cache))
    assert torch.equal(ours, run(model, _garbled(state.cache))), f"{method} via {way}: masked entries were attended"
    reference = _forwarded(model, fork_cache(state.cache))
    torch.testing.assert_close(ours[:1], reference, rtol=1e-5, atol=1e-5)  # the first step is cache_forward's
    bare = cache_from_layers([dynamic_layer(layer.keys, layer.values) for layer in state.cache.layers])
    assert not torch.allclose(_forwarded(model, bare), reference, atol=1e-3), "the masks should matter here"


@pytest.mark.parametrize("method", METHODS)
def test_a_model_that_would_attend_unmasked_refuses_the_pass(method: str) -> None:
    """Stock sdpa cannot read the masks: a pass over the cache raises naming what to call instead of attending to
    the masked entries (prefill hands passes over the cache to a reader whatever the model runs)."""
    model = tiny_model("llama", layers=4)
    state = _masked_state(enable_varlen_attention(model), method)
    model.set_attn_implementation("sdpa")
    for run in (_plain, _forwarded):
        with pytest.raises(HeadwiseMaskError, match="enable_varlen_attention"):
            run(model, fork_cache(state.cache))
    enable_varlen_attention(model)
    assert torch.equal(_plain(model, fork_cache(state.cache)), _plain(model, _garbled(state.cache)))
    hooks = [list(module._forward_pre_hooks.values()) for module in attention_modules(model)]
    assert all(found.count(hand_cache_to_attention) == 1 for found in hooks)  # installed once, however often asked
