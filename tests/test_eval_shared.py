"""Shared prefill: caches derived from one recorded prefill equal direct prefills with each press (AdaKV included)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from kvpress import ExpectedAttentionPress, KnormPress, PyramidKVPress, SnapKVPress, StreamingLLMPress, TOVAPress
from kvpress.presses.base_press import BasePress
from torch import nn
from transformers import DynamicCache

from ripplekv.inference.generate import Prefill, extend, greedy_decode, kept_tokens, prefill
from ripplekv.models.attention import enable_varlen_attention, hand_cache_to_attention
from ripplekv.models.cache import cache_from_tensors, cache_tensors, layer_lengths
from ripplekv.models.headwise import MASKED_KEYS, attention_modules, headwise_of
from ripplekv.presses.full_press import FullPress
from ripplekv.presses.registry import METHODS, make_press
from ripplekv.presses.ripplekv_press import RippleKVPress
from ripplekv_eval.fastpath.derive import NotDerivableError, derive_cache, derived_prefill, residual_statistics_of
from ripplekv_eval.fastpath.fidelity import teacher_forced_logprobs
from ripplekv_eval.fastpath.hidden_tail import hidden_states_needed, hidden_states_tail, is_derivable
from ripplekv_eval.fastpath.record import record_prefill
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
        "ripplekv-streaming": RippleKVPress(press=StreamingLLMPress(), budget=0.25, scores=SCORES, floor=4),
    }


def _assert_same_cache(derived, direct) -> None:
    assert layer_lengths(derived) == layer_lengths(direct)
    for (k1, v1), (k2, v2) in zip(cache_tensors(derived), cache_tensors(direct)):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


def _decode(model, state: Prefill, steps: int = 4) -> list[int]:
    return greedy_decode(model, state, max_new_tokens=steps, stop_ids=set())


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
    # the ripplekv methods need a profile: RippleKVPress is covered by _presses()
    presses = {m: make_press(m, budget=0.2, window_size=WINDOW) for m in METHODS if not m.startswith("ripplekv")}
    record = record_prefill(model, ids, residual_statistics=residual_statistics_of(presses.values()))
    for method, press in presses.items():
        assert is_derivable(press), method
        derived, direct = derived_prefill(record, press)[0], prefill(model, ids, press)
        _assert_same_cache(derived.cache, direct.cache)
        assert _decode(model, derived) == _decode(model, direct), method


def _assert_same_masks(ours: DynamicCache, theirs: DynamicCache) -> None:
    """The two caches' layers hold the same head-wise masks (or none)."""
    for a, b in zip(map(headwise_of, ours.layers), map(headwise_of, theirs.layers), strict=True):
        assert (a is None) == (b is None)
        assert a is None or all(torch.equal(u, v) for u, v in zip(a.indices, b.indices, strict=True))


def _masks_left(model) -> list[int]:
    """Modules holding a mask or a pre-hook other than the one handing each pass its cache (``read_cache_masks``)."""
    return [
        i
        for i, m in enumerate(attention_modules(model))
        if MASKED_KEYS in vars(m) or set(m._forward_pre_hooks.values()) - {hand_cache_to_attention}
    ]


@torch.no_grad()
def _kvpress_adakv(model, ids: torch.Tensor, press: BasePress, steps: int) -> tuple[list[int], torch.Tensor]:
    """AdaKV as kvpress runs it: prefill under ``with press(model)`` (the masks stay on the modules), then greedy
    decoding token by token through kvpress's attention wrapper. Returns the tokens and each step's log-probs."""
    cache = DynamicCache()
    with press(model):
        logits = model(ids, past_key_values=cache, use_cache=True).logits[0, -1]
    assert all(getattr(m, MASKED_KEYS, None) is not None for m in attention_modules(model))
    tokens, rows = [], []
    for i in range(steps):
        rows.append(torch.log_softmax(logits.double(), dim=-1))
        tokens.append(int(logits.argmax()))
        position = torch.tensor([ids.shape[1] + i])
        logits = model(
            torch.tensor([[tokens[-1]]]),
            past_key_values=cache,
            use_cache=True,
            cache_position=position,
            position_ids=position[None],
        ).logits[0, -1]
    for module in attention_modules(model):
        del module.masked_key_indices
    return tokens, torch.stack(rows)


@pytest.mark.parametrize("budget", [0.1, 0.3])
def test_adakv_derived_equals_its_own_prefill(model, budget: float) -> None:
    ids = random_ids(80, seed=7)
    press = make_press("adakv", budget=budget, window_size=WINDOW)
    expected, expected_logprobs = _kvpress_adakv(model, ids, press, steps=10)
    record = record_prefill(model, ids)
    state, _ = derived_prefill(record, press)
    assert not _masks_left(model) and all(headwise_of(layer) is not None for layer in state.cache.layers)
    assert layer_lengths(state.cache) == [80] * LAYERS
    assert kept_tokens(state) == [int(80 * (1 - press.compression_ratio))] * LAYERS
    assert _decode(model, state, 10) == expected
    forced = teacher_forced_logprobs(model, state, expected)
    torch.testing.assert_close(forced, expected_logprobs, atol=5e-5, rtol=0)
    assert not _masks_left(model)
    # the masks matter: the same tensors without the cache layers' masks decode differently
    bare = Prefill(cache_from_tensors(cache_tensors(state.cache)), state.next_logits, state.prompt_tokens, 0.0)
    assert _decode(model, bare, 10) != expected
    # a direct prefill with the press holds the same masks in its cache
    direct = prefill(model, ids, press)
    assert not _masks_left(model) and _decode(model, direct, 10) == expected
    _assert_same_masks(state.cache, direct.cache)
    _assert_same_masks(derive_cache(record, press), direct.cache)
    assert not _masks_left(model)


def test_adakv_configurations_from_one_record_do_not_leak(model) -> None:
    ids, question = random_ids(80, seed=8), random_ids(6, seed=9)
    presses = {b: make_press("adakv", budget=b, window_size=WINDOW) for b in (0.1, 0.3)}
    snap = _presses()["snapkv"]
    refs = {b: _kvpress_adakv(model, ids, p, steps=8) for b, p in presses.items()}
    record = record_prefill(model, ids)
    states = {b: derived_prefill(record, p)[0] for b, p in presses.items()}
    snap_state = derived_prefill(record, snap)[0]
    snap_tokens = _decode(model, prefill(model, ids, snap), 8)
    for b in (0.1, 0.3, 0.1, 0.3):
        assert _decode(model, states[b], 8) == refs[b][0], b
        assert _decode(model, snap_state, 8) == snap_tokens
        forced = teacher_forced_logprobs(model, states[b], refs[b][0])
        torch.testing.assert_close(forced, refs[b][1], atol=5e-5, rtol=0)
    # the query-agnostic question over each derived cache equals it over AdaKV's own prefill
    for b, press in presses.items():
        derived, direct = extend(model, states[b], question), extend(model, prefill(model, ids, press), question)
        assert _decode(model, derived, 6) == _decode(model, direct, 6)
    assert not _masks_left(model)


def test_passes_over_adakv_caches_need_no_module_state(model) -> None:
    """The attention functions read the masks from the cache a pass carries: no pass sets any on the modules, and
    a pass over one cache inside a pass over another sees its own masks only. Seeded bug caught: ``cache_forward``
    handing the masks to kvpress's wrapper through the modules under ripplekv_sdpa too."""
    ids = random_ids(80, seed=8)
    presses = {b: make_press("adakv", budget=b, window_size=WINDOW) for b in (0.1, 0.3)}
    refs = {b: _kvpress_adakv(model, ids, p, steps=6)[0] for b, p in presses.items()}
    record = record_prefill(model, ids)
    states = {b: derived_prefill(record, p)[0] for b, p in presses.items()}
    seen: list = []
    inner: list = []

    def look(module: nn.Module, args: tuple, kwargs: dict) -> None:
        seen.append(getattr(module, MASKED_KEYS, None))
        if module.layer_idx == 0 and not inner:  # once, inside the first pass over states[0.1]
            inner.append(None)
            inner[0] = _decode(model, states[0.3], 6)

    handles = [module.register_forward_pre_hook(look, with_kwargs=True) for module in attention_modules(model)]
    try:
        assert _decode(model, states[0.1], 6) == refs[0.1]
        teacher_forced_logprobs(model, states[0.3], refs[0.3])
        extend(model, states[0.1], random_ids(4, seed=11))
    finally:
        for handle in handles:
            handle.remove()
    assert inner == [refs[0.3]] and seen and all(mask is None for mask in seen)
    assert not _masks_left(model)


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


def test_non_derivable_presses_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A subclass of a press the fast path knows is refused by its class, whatever it does; a known class whose
    ``compress`` reads the live cache or writes into the record (as a changed kvpress might) is caught as it runs,
    and a record written into stays refused. Seeded bugs caught: ``is_derivable`` by ``isinstance``; the version
    check dropped."""
    model = tiny_model("llama", layers=2)
    record = record_prefill(model, random_ids(40, seed=8))
    for press in (_HookPress(), _CacheReader(), _InPlace()):
        assert not is_derivable(press)
        with pytest.raises(NotDerivableError, match=f"does not know {type(press).__name__}"):
            derive_cache(record, press)
    monkeypatch.setattr(FullPress, "compress", _CacheReader.compress)
    with pytest.raises(NotDerivableError, match="past_key_values"):
        derive_cache(record, FullPress())
    monkeypatch.setattr(FullPress, "compress", _InPlace.compress)
    with pytest.raises(NotDerivableError, match="in place"):
        derive_cache(record, FullPress())
    monkeypatch.undo()
    with pytest.raises(NotDerivableError, match="no longer valid"):
        derive_cache(record, FullPress())


def test_record_memory_and_window_check() -> None:
    model = tiny_model("mistral", layers=2)
    record = record_prefill(model, random_ids(30, seed=9))
    per_layer = 30 * (2 * 2 * 16 + 64) * 4  # keys + values (2 kv heads x 16) + hidden (64), float32
    assert 2 * per_layer <= record.nbytes() < 2 * per_layer + 30 * 64 * 4 * 4
    with pytest.raises(ValueError, match="selection window"):
        derive_cache(record, SnapKVPress(compression_ratio=0.5, window_size=30))


def _tail_presses() -> dict[str, BasePress]:
    return {
        "snapkv": make_press("snapkv", budget=0.3, window_size=WINDOW),
        "pyramidkv": make_press("pyramidkv", budget=0.3, window_size=WINDOW),
        "pyramidkv-kvpress": make_press("pyramidkv-kvpress", budget=0.3, window_size=WINDOW),
        "adakv": make_press("adakv", budget=0.3, window_size=WINDOW),
        "streamingllm": make_press("streamingllm", budget=0.3),
        "ripplekv": RippleKVPress(press=SnapKVPress(window_size=WINDOW), budget=0.3, scores=SCORES),
        "ripplekv-streaming": RippleKVPress(press=StreamingLLMPress(), budget=0.25, scores=SCORES, floor=4),
        "knorm": KnormPress(compression_ratio=0.6),
        "tova": TOVAPress(compression_ratio=0.6),
        "full": FullPress(),
    }


def test_hidden_states_needed_reads_the_declared_windows() -> None:
    presses = _tail_presses()
    assert hidden_states_needed(presses["snapkv"]) == WINDOW + 1  # SnapKV checks q_len > window
    assert hidden_states_needed(presses["adakv"]) == WINDOW + 1
    assert hidden_states_needed(presses["tova"]) == 1
    for name in ("streamingllm", "ripplekv-streaming", "knorm", "full"):
        assert hidden_states_needed(presses[name]) == 0, name
    assert hidden_states_needed(ExpectedAttentionPress(compression_ratio=0.5)) is None
    assert hidden_states_needed(_InPlace()) is None  # not declared: the whole prompt
    assert hidden_states_tail(presses.values()) == WINDOW + 1
    assert hidden_states_tail([*presses.values(), ExpectedAttentionPress()]) is None
    assert hidden_states_tail([]) == 0


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tail_record_derives_the_caches_of_a_full_record(attn: str) -> None:
    model = enable_varlen_attention(tiny_model("llama", layers=LAYERS, attn=attn))
    ids = random_ids(80, seed=12)
    presses = {k: p for k, p in _tail_presses().items() if attn == "sdpa" or k != "adakv"}  # AdaKV refuses eager
    tail = hidden_states_tail(presses.values())
    full, lean = record_prefill(model, ids, hidden_tail=None), record_prefill(model, ids, hidden_tail=tail)
    assert lean.hidden_tokens == tail and full.hidden_tokens == 80
    assert torch.equal(lean.next_logits, full.next_logits)
    for name, press in presses.items():
        a, b = derived_prefill(full, press)[0], derived_prefill(lean, press)[0]
        _assert_same_cache(a.cache, b.cache)
        _assert_same_masks(a.cache, b.cache)
        assert _decode(model, a) == _decode(model, b), name
    # the whole prompt's hidden states of every layer are not held
    assert lean.nbytes() < 0.6 * full.nbytes()
    cache_bytes = sum(t.numel() * t.element_size() for layer in full.layers for t in (layer.keys, layer.values))
    assert lean.nbytes() < (2.0 if attn == "eager" else 1.25) * cache_bytes  # eager: + tail attention weights


def test_tail_record_refuses_a_press_needing_more() -> None:
    model = enable_varlen_attention(tiny_model("llama", layers=LAYERS))
    ids = random_ids(60, seed=13)
    record = record_prefill(model, ids, hidden_tail=WINDOW + 1)
    with pytest.raises(NotDerivableError, match="every prompt position.*last 9 of 60"):
        derived_prefill(record, ExpectedAttentionPress(compression_ratio=0.5))
    with pytest.raises(NotDerivableError, match="last 17 prompt positions"):
        derived_prefill(record, make_press("snapkv", budget=0.3, window_size=16))
    # a record holding every position derives them all
    whole = record_prefill(model, ids, hidden_tail=None)
    press = ExpectedAttentionPress(compression_ratio=0.5)
    _assert_same_cache(derived_prefill(whole, press)[0].cache, prefill(model, ids, press).cache)
    with pytest.raises(ValueError, match="hidden_tail must be"):
        record_prefill(model, ids, hidden_tail=-1)


def test_a_record_is_bounded_by_default_and_says_how_to_keep_everything() -> None:
    from kvpress import ExpectedAttentionPress

    from ripplekv.presses.registry import make_press
    from ripplekv_eval.fastpath.derive import NotDerivableError, derive_cache
    from ripplekv_eval.fastpath.hidden_tail import DEFAULT_HIDDEN_TAIL
    from ripplekv_eval.fastpath.record import record_prefill
    from tests.conftest import random_ids, tiny_model

    model = tiny_model("llama", layers=2)
    ids = random_ids(200)
    bounded = record_prefill(model, ids)
    assert bounded.hidden_tokens == DEFAULT_HIDDEN_TAIL == 65 < 200  # SnapKV's window + 1, not every position
    derive_cache(bounded, make_press("snapkv", budget=0.3))  # what SnapKV reads is there
    with pytest.raises(NotDerivableError, match="hidden_tail=None"):
        derive_cache(bounded, make_press("snapkv", budget=0.3, scorer=ExpectedAttentionPress()))
    assert record_prefill(model, ids, hidden_tail=None).hidden_tokens == 200
