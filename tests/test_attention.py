"""Multi-token passes over per-layer compressed caches equal token-by-token decoding."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from ripplekv.models.attention import VARLEN_PREFIX, enable_varlen_attention, uses_varlen_attention
from ripplekv.models.attention_masks import PaddedBatchError, fit_attention_mask
from ripplekv.models.cache import cache_from_tensors, cache_tensors, layer_lengths
from tests.conftest import random_ids, tiny_model


def _compressed_cache(model, ids: torch.Tensor, keep: list[int], seed: int = 0) -> DynamicCache:
    cache = DynamicCache()
    with torch.no_grad():
        model(ids, past_key_values=cache, use_cache=True)
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for (keys, values), n in zip(cache_tensors(cache), keep):
        idx = torch.randperm(ids.shape[1], generator=generator)[:n]
        pairs.append((keys[:, :, idx], values[:, :, idx]))
    return cache_from_tensors(pairs)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_multi_token_pass_matches_token_by_token(arch: str, attn: str) -> None:
    model = enable_varlen_attention(tiny_model(arch, layers=4, attn=attn))
    ids, new = random_ids(40, 1), random_ids(7, 2)
    keep = [30, 12, 40, 25]  # layer 0 shorter and longer than others
    positions = torch.arange(40, 47)
    with torch.no_grad():
        cache = _compressed_cache(model, ids, keep)
        together = model(new, past_key_values=cache, cache_position=positions, position_ids=positions[None]).logits
        cache = _compressed_cache(model, ids, keep)
        steps = [
            model(
                new[:, i : i + 1],
                past_key_values=cache,
                cache_position=positions[i : i + 1],
                position_ids=positions[None, i : i + 1],
            ).logits
            for i in range(7)
        ]
    assert layer_lengths(cache) == [n + 7 for n in keep]
    torch.testing.assert_close(together, torch.cat(steps, dim=1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_registered_attention_runs_under_kvpress_patch(attn: str) -> None:
    """Importing kvpress after the variants are registered wraps them (``attention_patch``), and the wrapper passes
    ``dropout`` as the sixth positional argument, as transformers' own functions take it."""
    from kvpress.attention_patch import attention_patch
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = enable_varlen_attention(tiny_model("llama", layers=2, attn=attn))
    module = model.model.layers[0].self_attn
    function = ALL_ATTENTION_FUNCTIONS[VARLEN_PREFIX + attn]
    generator = torch.Generator().manual_seed(0)
    heads, kv_heads, head_dim = model.config.num_attention_heads, model.config.num_key_value_heads, module.head_dim
    query = torch.randn(1, heads, 3, head_dim, generator=generator)
    key, value = (torch.randn(1, kv_heads, 9, head_dim, generator=generator) for _ in range(2))
    with torch.no_grad():
        direct, _ = function(module, query, key, value, None, dropout=0.0, scaling=module.scaling)
        patched, _ = attention_patch(function)(module, query, key, value, None, 0.0, scaling=module.scaling)
    torch.testing.assert_close(patched, direct, atol=0, rtol=0)


def test_plain_sdpa_fails_on_variable_lengths() -> None:
    """The problem this module solves: stock sdpa cannot run a multi-token pass over such a cache."""
    model = tiny_model("llama", layers=3)
    cache = _compressed_cache(model, random_ids(30, 1), [20, 10, 25])
    positions = torch.arange(30, 35)
    with pytest.raises(RuntimeError), torch.no_grad():
        model(random_ids(5, 2), past_key_values=cache, cache_position=positions, position_ids=positions[None])


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_uniform_cache_unchanged(attn: str) -> None:
    """On ordinary caches the variable-length variant computes exactly what the stock one computes."""
    ids = random_ids(33, 3)
    stock = tiny_model("qwen2", layers=3, attn=attn)
    varlen = enable_varlen_attention(tiny_model("qwen2", layers=3, attn=attn))
    assert uses_varlen_attention(varlen) and not uses_varlen_attention(stock)
    with torch.no_grad():
        a_cache, b_cache = DynamicCache(), DynamicCache()
        a = stock(ids[:, :30], past_key_values=a_cache).logits
        b = varlen(ids[:, :30], past_key_values=b_cache).logits
        assert torch.equal(a, b)
        a = stock(ids[:, 30:], past_key_values=a_cache).logits
        b = varlen(ids[:, 30:], past_key_values=b_cache).logits
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_fit_mask_shapes_and_causality() -> None:
    assert fit_attention_mask(None, 1, 50) is None
    assert fit_attention_mask(None, 8, 8) is None
    built = fit_attention_mask(None, 3, 6)
    assert built.shape == (1, 1, 3, 6)
    assert built[0, 0].tolist() == [[True] * 4 + [False] * 2, [True] * 5 + [False], [True] * 6]
    additive = fit_attention_mask(None, 3, 6, additive=True)
    assert additive.dtype == torch.float32 and (additive[0, 0] == 0).tolist() == built[0, 0].tolist()
    layer0 = fit_attention_mask(None, 3, 10)
    fitted = fit_attention_mask(layer0, 3, 6)
    assert torch.equal(fitted, built)
    with pytest.raises(ValueError, match="inconsistent"):
        fit_attention_mask(None, 5, 3)


def test_padded_batch_is_an_error() -> None:
    model = enable_varlen_attention(tiny_model("llama", layers=2))
    cache = _compressed_cache(model, random_ids(20, 1).expand(2, 20), [10, 15])
    positions = torch.arange(20, 23)
    padding = torch.ones(2, 23, dtype=torch.long)
    padding[1, 0] = 0
    with pytest.raises(PaddedBatchError, match="padded batch"), torch.no_grad():
        model(
            random_ids(3).expand(2, 3),
            past_key_values=cache,
            attention_mask=padding,
            cache_position=positions,
            position_ids=positions[None],
        )
