"""Shared prefill: caches derived from one recorded prefill equal direct prefills with each press."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from kvpress import AdaKVPress, PyramidKVPress, SnapKVPress, StreamingLLMPress
from kvpress.presses.base_press import BasePress
from torch import nn

from ripplekv.inference import extend, greedy_decode, prefill
from ripplekv.inference.generate import Prefill
from ripplekv.inference.shared import (
    NotDerivableError,
    compress_recorded,
    derived_prefill,
    is_derivable,
    record_prefill,
)
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.cache import cache_tensors, layer_lengths
from ripplekv.presses import FullPress, RippleKVPress, make_press
from tests.conftest import random_ids, tiny_model

WINDOW = 8
LAYERS = 4
SCORES = (0.5, 3.0, 0.1, 1.2)

pytestmark = pytest.mark.usefixtures("one_thread")


def _presses() -> dict[str, BasePress]:
    return {
        "full": FullPress(),
        "streamingllm": StreamingLLMPress(compression_ratio=0.7),
        "snapkv": SnapKVPress(compression_ratio=0.7, window_size=WINDOW),
        "pyramidkv": PyramidKVPress(compression_ratio=0.7, window_size=WINDOW),
        "ripplekv": RippleKVPress(press=SnapKVPress(window_size=WINDOW), budget=0.3, scores=SCORES),
        "ripplekv-streaming": RippleKVPress(press=StreamingLLMPress(), budget=0.25, scores=SCORES, min_tokens=4),
    }


def _assert_same_cache(derived, direct) -> None:
    assert layer_lengths(derived) == layer_lengths(direct)
    for (k1, v1), (k2, v2) in zip(cache_tensors(derived), cache_tensors(direct)):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


def _decode(model, state: Prefill) -> list[int]:
    return greedy_decode(model, state, max_new_tokens=4, stop_ids=set())


@pytest.fixture(scope="module", params=("llama", "qwen2", "mistral"))
def model(request: pytest.FixtureRequest):
    return enable_varlen_attention(tiny_model(request.param, layers=LAYERS))


def test_derived_caches_equal_direct_prefills(model) -> None:
    ids = random_ids(80, seed=3)
    record = record_prefill(model, ids)
    keys_before = [layer.keys.clone() for layer in record.layers]
    full = prefill(model, ids)
    assert torch.equal(record.next_logits, full.next_logits)
    for name, press in _presses().items():
        state, seconds = derived_prefill(record, press)
        assert seconds >= 0 and state.prompt_tokens == 80
        direct = prefill(model, ids, press)
        _assert_same_cache(state.cache, direct.cache)
        if name != "full":
            assert sum(layer_lengths(state.cache)) < LAYERS * 80, name
        assert torch.equal(state.next_logits, direct.next_logits)
        assert _decode(model, state) == _decode(model, direct), name
    # decoding over derived caches never wrote into the record
    for layer, before in zip(record.layers, keys_before):
        assert torch.equal(layer.keys, before) and layer.keys.shape[2] == 80
    _assert_same_cache(record.full_cache(), full.cache)


def test_query_agnostic_extend_over_derived_caches(model) -> None:
    context, question = random_ids(72, seed=4), random_ids(9, seed=5)
    record = record_prefill(model, context)
    for name in ("snapkv", "pyramidkv", "ripplekv"):
        press = _presses()[name]
        derived = extend(model, derived_prefill(record, press)[0], question)
        direct = extend(model, prefill(model, context, press), question)
        _assert_same_cache(derived.cache, direct.cache)
        assert _decode(model, derived) == _decode(model, direct), name


def test_make_press_methods_are_derivable() -> None:
    model = enable_varlen_attention(tiny_model("llama", layers=LAYERS))
    ids = random_ids(70, seed=6)
    record = record_prefill(model, ids)
    for method in ("full", "streamingllm", "snapkv", "pyramidkv"):
        press = make_press(method, budget=0.2, window_size=WINDOW)
        assert is_derivable(press)
        _assert_same_cache(compress_recorded(record, press), prefill(model, ids, press).cache)


def test_adakv_is_detected_and_module_state_restored() -> None:
    model = enable_varlen_attention(tiny_model("qwen2", layers=LAYERS))
    ids = random_ids(60, seed=7)
    record = record_prefill(model, ids)
    press = AdaKVPress(SnapKVPress(compression_ratio=0.5, window_size=WINDOW))
    assert is_derivable(press)  # statically fine: the check happens on the call
    with pytest.raises(NotDerivableError, match="masked_key_indices"):
        compress_recorded(record, press)
    assert all(getattr(layer.module, "masked_key_indices", None) is None for layer in record.layers)
    # the record is still usable by derivable presses
    snap = _presses()["snapkv"]
    _assert_same_cache(compress_recorded(record, snap), prefill(model, ids, snap).cache)


@dataclass
class _HookPress(FullPress):
    def forward_hook(self, module: nn.Module, input: list, kwargs: dict, output: list) -> list:
        return super().forward_hook(module, input, kwargs, output)


@dataclass
class _CacheReader(FullPress):
    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        return kwargs["past_key_values"].layers[module.layer_idx].keys, values


@dataclass
class _InPlace(FullPress):
    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        keys.mul_(1.0)
        return keys, values


@dataclass
class _OptOut(FullPress):
    derivable_from_record: bool = False


def test_non_derivable_presses_are_refused() -> None:
    model = tiny_model("llama", layers=2)
    record = record_prefill(model, random_ids(40, seed=8))
    for press, match in ((_HookPress(), "forward hook"), (_OptOut(), "opts out"), (_CacheReader(), "past_key_values")):
        assert not is_derivable(press) or isinstance(press, _CacheReader)
        with pytest.raises(NotDerivableError, match=match):
            compress_recorded(record, press)
    with pytest.raises(NotDerivableError, match="in place"):
        compress_recorded(record, _InPlace())
    with pytest.raises(NotDerivableError, match="no longer valid"):
        compress_recorded(record, FullPress())


def test_record_memory_and_window_check() -> None:
    model = tiny_model("mistral", layers=2)
    record = record_prefill(model, random_ids(30, seed=9))
    per_layer = 30 * (2 * 2 * 16 + 64) * 4  # keys + values (2 kv heads x 16) + hidden (64), float32
    assert 2 * per_layer <= record.nbytes() < 2 * per_layer + 30 * 64 * 4 * 4
    with pytest.raises(ValueError, match="selection window"):
        compress_recorded(record, SnapKVPress(compression_ratio=0.5, window_size=30))
