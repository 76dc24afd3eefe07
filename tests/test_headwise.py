"""Head-wise masks held by the cache layer (``models/headwise.py``): validation, the kvpress hand-over, forks."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.cache_utils import DynamicSlidingWindowLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ripplekv.inference.generate import greedy_decode, prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.attention_functions import CACHE_KWARG
from ripplekv.models.cache import OverlayLayer, cache_from_layers, dynamic_layer, fork_cache, lean_fork
from ripplekv.models.headwise import MASKED_KEYS, HeadwiseMask, MaskedLayer, attention_modules, headwise_of, take_mask
from ripplekv.presses.registry import make_press
from ripplekv_eval.fastpath.derive import derive_cache, derived_prefill
from ripplekv_eval.fastpath.record import record_prefill
from tests.conftest import random_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

KV_HEADS, LENGTH = 2, 6


def _indices(batch: list[int], head: list[int], position: list[int]) -> tuple[torch.Tensor, ...]:
    return torch.tensor(batch), torch.tensor(head), torch.tensor(position)


def _masked_layer() -> MaskedLayer:
    keys = torch.randn(1, KV_HEADS, LENGTH, 4)
    return MaskedLayer(keys, keys.clone(), HeadwiseMask(_indices([0, 0], [0, 1], [2, 5]), KV_HEADS, LENGTH))


def test_a_headwise_mask_is_validated_once_with_clear_errors() -> None:
    """Seeded bug caught: the position check against ``kv_heads`` instead of ``length``."""
    mask = HeadwiseMask(_indices([0, 0], [1, 1], [0, 5]), KV_HEADS, LENGTH)
    assert mask.entries == 2
    assert mask.keep(LENGTH + 1).tolist() == [[True] * 7, [False, True, True, True, True, False, True]]
    for indices, match in (
        (_indices([1], [0], [0]), "batch size 1"),
        (_indices([0], [2], [0]), "2 KV heads"),
        (_indices([0], [0], [LENGTH]), "6 positions"),
        ((torch.tensor([0]), torch.tensor([0])), "index tensors"),
    ):
        with pytest.raises(ValueError, match=match):
            HeadwiseMask(indices, KV_HEADS, LENGTH)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="point outside the cached keys"):
        mask.attention_mask(None, 4, query_len=2, key_len=LENGTH + 1, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="2 heads x 6 positions over keys of shape"):
        MaskedLayer(torch.zeros(1, KV_HEADS, 5, 4), torch.zeros(1, KV_HEADS, 5, 4), mask)


def test_take_mask_moves_kvpress_masks_into_the_layer() -> None:
    """Seeded bug caught: ``vars(module).get`` instead of ``pop`` (the mask left on the module)."""
    module, layer = (
        nn.Linear(1, 1),
        dynamic_layer(torch.zeros(1, KV_HEADS, LENGTH, 4), torch.zeros(1, KV_HEADS, LENGTH, 4)),
    )
    assert take_mask(module, layer) is layer and headwise_of(layer) is None
    indices = _indices([0], [1], [3])
    setattr(module, MASKED_KEYS, indices)
    masked = take_mask(module, layer)
    assert isinstance(masked, MaskedLayer) and masked.keys is layer.keys and MASKED_KEYS not in vars(module)
    assert all(a is b for a, b in zip(headwise_of(masked).indices, indices))  # type: ignore[union-attr]
    sliding = DynamicSlidingWindowLayer(4)
    sliding.lazy_initialization(layer.keys, layer.values)
    sliding.keys, sliding.values = layer.keys, layer.values
    setattr(module, MASKED_KEYS, indices)
    with pytest.raises(ValueError, match="sliding-window layers"):
        take_mask(module, sliding)


def test_forks_keep_the_mask_and_appended_tokens_are_seen_by_every_head() -> None:
    """Seeded bugs caught: ``lean_fork`` or ``OverlayLayer.fork`` dropping the mask."""
    layer = _masked_layer()
    fork = fork_cache(cache_from_layers([layer])).layers[0]
    assert type(fork) is MaskedLayer and fork is not layer and fork.headwise is layer.headwise
    fork.update(torch.randn(1, KV_HEADS, 1, 4), torch.randn(1, KV_HEADS, 1, 4))
    assert layer.get_seq_length() == LENGTH and fork.get_seq_length() == LENGTH + 1
    lean = lean_fork(cache_from_layers([layer])).layers[0]
    assert isinstance(lean, OverlayLayer) and lean.headwise is layer.headwise
    assert lean.fork().headwise is layer.headwise
    plain = dynamic_layer(layer.keys, layer.values)
    assert lean_fork(cache_from_layers([plain])).layers[0].headwise is None
    mask = layer.headwise.attention_mask(None, 4, query_len=2, key_len=LENGTH + 2, device=torch.device("cpu"))
    assert mask.shape == (1, 4, 2, LENGTH + 2) and mask[..., LENGTH].all() and not mask[0, 2:, :, 5].any()


def test_the_attention_function_refuses_masks_it_cannot_apply() -> None:
    model = enable_varlen_attention(tiny_model("llama", layers=2, attn="eager"))
    module = attention_modules(model)[0]
    cache = cache_from_layers([_masked_layer(), _masked_layer()])
    query, key = torch.randn(1, 4, 1, 4), torch.randn(1, KV_HEADS, LENGTH + 1, 4)
    for name, kwargs in (("ripplekv_eager", {}), ("ripplekv_sdpa", {"sliding_window": 4})):
        with pytest.raises(ValueError, match="need sdpa attention over a global layer"):
            ALL_ATTENTION_FUNCTIONS[name](module, query, key, key, None, scaling=0.5, **kwargs, **{CACHE_KWARG: cache})


def test_stale_kvpress_masks_belong_to_no_cache() -> None:
    """A mask a press used directly left on a module is neither taken into a new cache nor left there. Seeded bug
    caught: ``discard_masks`` before the derivation removed."""
    model = enable_varlen_attention(tiny_model("llama", layers=2))
    ids = random_ids(40, seed=2)
    record = record_prefill(model, ids)
    snap, adakv = make_press("snapkv", budget=0.3, window_size=8), make_press("adakv", budget=0.3, window_size=8)
    stale = _indices([0], [0], [1])
    for module in attention_modules(model):
        setattr(module, MASKED_KEYS, stale)
    assert all(headwise_of(layer) is None for layer in derive_cache(record, snap).layers)
    for module in attention_modules(model):
        setattr(module, MASKED_KEYS, stale)
    assert all(headwise_of(layer) is None for layer in prefill(model, ids, snap).cache.layers)
    assert all(MASKED_KEYS not in vars(module) for module in attention_modules(model))
    state = derived_prefill(record, adakv)[0]
    assert greedy_decode(model, state, 5, set(), fork=lean_fork) == greedy_decode(model, state, 5, set())
