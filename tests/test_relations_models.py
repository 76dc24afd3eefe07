"""Relations of the model-side code (issue 26): which KV head a query head reads (``h // (heads // kv_heads)``), what
a masked entry gets (zero attention, whatever its score), which layers are local, how a prompt is cut into chunks,
and what a memo entry is keyed by. Each test names the seeded bug it was checked to catch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from kvpress import ExpectedAttentionPress, SnapKVPress
from transformers import DynamicCache, Gemma3Config, MistralConfig, PretrainedConfig, Qwen2Config

from ripplekv.allocation.dynamickv import DynamicKVRule
from ripplekv.allocation.per_prompt import PerPromptSchedule
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.attention_masks import headwise_attention_mask
from ripplekv.models.chunked_prefill import chunk_bounds, prefill_in_chunks
from ripplekv.models.layer_types import NoGlobalLayersError, compressed_layers, sliding_layers
from ripplekv.models.shared_prefix import SharedPrefix, shared_prefix_attention
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress
from ripplekv.presses.registry import make_press
from ripplekv_eval.fastpath.derive import recorded_statistics
from ripplekv_eval.fastpath.padded import KeyValidity, RaggedLayer
from ripplekv_eval.fastpath.record import record_prefill
from ripplekv_eval.fastpath.recording_press import MomentsExpectedAttentionPress, QueryMoments
from ripplekv_eval.fastpath.score_memo import ScoreMemo
from tests.conftest import random_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

HEADS, KV_HEADS = 6, 2  # groups of 3: h // 3 and h % 2 disagree on heads 1, 2, 3, 4


def _kv_head(h: int, heads: int = HEADS, kv_heads: int = KV_HEADS) -> int:
    return h // (heads // kv_heads)


def _validity(rows: int, kv_heads: int, cached: int, seed: int) -> torch.Tensor:
    """Random per-(row, KV head) validity, every KV head of every row seeing a different set."""
    generator = torch.Generator().manual_seed(seed)
    valid = torch.rand(rows, kv_heads, cached, generator=generator) > 0.4
    valid[..., -1] = True  # nobody sees nothing
    return valid


# ------------------------------------------------------------------------------------ GQA: the KV head of a query


def test_a_padded_batchs_mask_gives_each_query_head_its_own_kv_heads_validity() -> None:
    """``KeyValidity.mask``: query head h of row r sees cached entry j exactly when KV head h // 3 of row r may;
    the appended tokens are causal. Seeded bugs caught: ``h % kv_heads`` (``repeat`` for ``repeat_interleave``);
    ``<`` for ``<=`` in the causal part (a token not seeing itself)."""
    valid = _validity(2, KV_HEADS, 7, seed=1)
    mask = KeyValidity((valid,)).mask(0, query_len=3, key_len=7 + 4, heads=HEADS)
    for row in range(2):
        for h in range(HEADS):
            for q in range(3):
                assert mask[row, h, q, :7].tolist() == valid[row, _kv_head(h)].tolist()
                assert mask[row, h, q, 7:].tolist() == [j <= q + 1 for j in range(4)]  # 1 token appended before


def test_a_ragged_rows_mask_gives_each_query_head_its_own_kv_heads_validity() -> None:
    """``RaggedLayer.row_mask`` likewise for a row with compacted head-wise entries.
    Seeded bug caught: ``h % kv_heads`` (``repeat`` for ``repeat_interleave``)."""
    valid = _validity(1, KV_HEADS, 5, seed=2)[0]
    keys = torch.randn(1, KV_HEADS, 5, 4)
    layer = RaggedLayer([(keys, keys.clone(), valid)], room=2)
    layer.update(torch.randn(1, KV_HEADS, 2, 4), torch.randn(1, KV_HEADS, 2, 4))
    mask = layer.row_mask(0, query_len=2, heads=HEADS)
    for h in range(HEADS):
        for q in range(2):
            assert mask[0, h, q, :5].tolist() == valid[_kv_head(h)].tolist()
            assert mask[0, h, q, 5:].tolist() == [j <= q for j in range(2)]


def test_adakvs_headwise_mask_bars_every_query_head_of_the_masked_kv_head_only() -> None:
    """``headwise_attention_mask``: a masked (KV head, position) is hidden from exactly the query heads of that KV
    head. Seeded bug caught: ``h % kv_heads``."""
    keep = torch.ones(KV_HEADS, 6, dtype=torch.bool)
    keep[torch.tensor([0, 1, 1]), torch.tensor([2, 0, 3])] = False
    mask = headwise_attention_mask(None, keep, HEADS, query_len=1, key_len=6)
    hidden = {(0, 2), (1, 0), (1, 3)}
    for h in range(HEADS):
        for p in range(6):
            assert bool(mask[0, h, 0, p]) == ((_kv_head(h), p) not in hidden), (h, p)


def _attention_by_hand(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, prefix: SharedPrefix, scale: float
) -> torch.Tensor:
    """Plain softmax attention of each row over prefix + its own tokens (causal), query head h on KV head h // g."""
    batch, heads, new, _ = query.shape
    kv_heads = prefix.keys.shape[1]
    out = torch.zeros(batch, new, heads, query.shape[-1], dtype=torch.float64)
    for row in range(batch):
        values = prefix.values[0].double()
        delta_rows = 0 if prefix.value_delta is None else prefix.value_delta.shape[0]
        if row >= batch - delta_rows:
            values = values + prefix.value_delta[row - (batch - delta_rows)].double()
        for h in range(heads):
            g = _kv_head(h, heads, kv_heads)
            keys = torch.cat([prefix.keys[0, g].double(), key[row, g].double()])
            vals = torch.cat([values[g], value[row, g].double()])
            scores = query[row, h].double() @ keys.T * scale
            length = prefix.keys.shape[2]
            for q in range(new):
                scores[q, length + q + 1 :] = -math.inf
            out[row, :, h] = scores.softmax(dim=-1) @ vals
    return out


def test_shared_prefix_attention_is_plain_causal_attention_with_query_head_h_on_kv_head_h_over_groups() -> None:
    """Shared-prefix attention equals brute force: rows over the prefix (plus a value delta for the last rows) and
    their own tokens, causal, query head h on KV head h // 3; a later token gets exactly zero weight.
    Seeded bugs caught: ``h % kv_heads`` (queries viewed ``(batch, groups, kv_heads, ...)``, heads put back the same
    way); the causal fill ``-inf`` replaced by ``0`` (later tokens attended)."""
    generator = torch.Generator().manual_seed(3)
    batch, new, length, dim = 3, 4, 9, 8
    query = torch.randn(batch, HEADS, new, dim, generator=generator)
    key = torch.randn(batch, KV_HEADS, new, dim, generator=generator)
    value = torch.randn(batch, KV_HEADS, new, dim, generator=generator)
    prefix = SharedPrefix(
        torch.randn(1, KV_HEADS, length, dim, generator=generator),
        torch.randn(1, KV_HEADS, length, dim, generator=generator),
        torch.randn(1, KV_HEADS, length, dim, generator=generator),  # the last row sees values + delta
    )
    got = shared_prefix_attention(query, key, value, prefix, scaling=0.3)
    want = _attention_by_hand(query, key, value, prefix, 0.3)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------- a padded batch's masked entries


def _padded_pass(model, valid: torch.Tensor, poison: float) -> torch.Tensor:  # noqa: ANN001
    """One decoding step of a 2-row padded batch of random caches whose masked entries hold ``poison`` keys;
    returns layer 0's attention weights ``(rows, heads, 1, cached + 1)``."""
    generator = torch.Generator().manual_seed(0)
    cache = DynamicCache()
    rows, kv_heads, cached = valid.shape
    dtype = model.dtype
    for layer in range(model.config.num_hidden_layers):
        keys = torch.randn(rows, kv_heads, cached, 16, generator=generator).to(dtype)
        values = torch.randn(rows, kv_heads, cached, 16, generator=generator).to(dtype)
        keys[~valid] = poison  # a huge score against every query, of one sign or the other
        cache.update(keys, values, layer)
    validity = KeyValidity((valid,) * model.config.num_hidden_layers)
    position = torch.tensor([cached])
    with torch.no_grad():
        out = model(
            torch.tensor([[5], [7]]),
            past_key_values=cache,
            use_cache=True,
            cache_position=position,
            position_ids=position.expand(rows, 1),
            key_validity=validity,
            output_attentions=True,
        )
    return out.attentions[0].detach()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_masked_entries_of_a_padded_batch_get_exactly_zero_attention_whatever_their_score(dtype: torch.dtype) -> None:
    """Eager attention over a padded batch: every entry a row's KV head may not see gets weight exactly 0 in each
    of that KV head's query heads, even when its key scores +-1e4 against the query (the mask is the dtype's most
    negative number, not a moderate constant), and the weights of the entries it sees sum to 1.
    Seeded bugs caught: the additive mask's value ``finfo(dtype).min`` replaced by ``-1e4`` (in memory only:
    attention_functions.py is another agent's file); ``h % kv_heads`` in ``KeyValidity.mask``."""
    model = enable_varlen_attention(tiny_model("llama", layers=1, seed=1, attn="eager")).to(dtype)
    valid = torch.ones(2, 2, 6, dtype=torch.bool)  # the tiny model's 4 query heads over 2 KV heads
    valid[0, 0, :2] = False
    valid[0, 1, 3] = False
    valid[1, 1, :4] = False
    for poison in (3e4, -3e4):
        weights = _padded_pass(model, valid, poison).float()
        for row in range(2):
            for h in range(4):
                seen = valid[row, h // 2]
                assert bool((weights[row, h, 0, :6][~seen] == 0).all()), (poison, row, h)
                assert float(weights[row, h, 0].sum()) == pytest.approx(1.0, abs=1e-2)
                assert bool((weights[row, h, 0, :6][seen] > 0).any())


# ----------------------------------------------------------------------------------- which layers are local


def test_gemma3s_sliding_and_chunked_layers_are_local_and_only_the_global_ones_are_compressed() -> None:
    """From the text config's ``layer_types`` (a multimodal Gemma 3 config's text config): sliding and chunked
    layers are local, the full-attention ones compressed, in order.
    Seeded bugs caught: only ``sliding_attention`` counted local; the sliding layers compressed instead of the
    global ones; the multimodal config read instead of its text config."""
    types = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    multimodal = Gemma3Config(text_config={"num_hidden_layers": 5, "layer_types": types})
    assert sliding_layers(multimodal) == (True, False, True, True, False)
    assert compressed_layers(multimodal) == (1, 4)
    chunked = PretrainedConfig(num_hidden_layers=3, layer_types=["chunked_attention", "full_attention"] + ["x"])
    assert sliding_layers(chunked) == (True, False, False)
    assert compressed_layers(chunked) == (1, 2)


def test_qwen2_sliding_layers_are_those_beyond_max_window_layers_and_mistral_v01_has_no_global_layer() -> None:
    """Qwen 2 with ``use_sliding_window`` slides from ``max_window_layers`` on; a config without ``layer_types``
    but with a ``sliding_window`` (Mistral v0.1) slides everywhere, one with neither nowhere.
    Seeded bugs caught: a missing ``layer_types`` read as no sliding layer; ``sliding_window is None`` inverted."""
    qwen = Qwen2Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=16, max_window_layers=3)
    assert compressed_layers(qwen) == (0, 1, 2)
    mistral = MistralConfig(num_hidden_layers=3, sliding_window=8)
    assert sliding_layers(mistral) == (True, True, True)
    with pytest.raises(NoGlobalLayersError):
        compressed_layers(mistral)
    assert compressed_layers(MistralConfig(num_hidden_layers=3, sliding_window=None)) == (0, 1, 2)


# ------------------------------------------------------------------------------------------- chunked prefill


@pytest.mark.parametrize(("tokens", "chunk"), [(10, 3), (9, 3), (1, 5), (5, 5), (6, 5), (7, None)])
def test_chunk_bounds_tile_the_prompt_in_order_with_only_the_last_chunk_shorter(tokens: int, chunk: int) -> None:
    """Consecutive, starting at 0, ending at the prompt's end, each exactly ``chunk`` long but the last.
    Seeded bugs caught: the last chunk not cut at the prompt's end; one chunk for a prompt of ``chunk + 1``."""
    bounds = chunk_bounds(tokens, chunk)
    assert bounds[0][0] == 0 and bounds[-1][1] == tokens
    assert all(end == start for (_, end), (start, _) in zip(bounds, bounds[1:]))
    size = tokens if chunk is None else chunk
    assert all(end - start == size for start, end in bounds[:-1])
    assert 1 <= bounds[-1][1] - bounds[-1][0] <= size
    assert len(bounds) == (1 if chunk is None else math.ceil(tokens / chunk))


def test_each_chunk_is_announced_before_its_pass_over_the_cache_of_the_chunks_before_it() -> None:
    """``before_chunk(start, end)`` runs once per chunk, in order, when the cache holds exactly the ``start``
    tokens before it (a hook recording per chunk sees that chunk's pass next), and the chunked cache and logits
    are the one-pass ones. Seeded bug caught: the hook called after the chunk's pass."""
    model = tiny_model("llama", layers=2, seed=2)
    ids = random_ids(23, seed=1)
    seen: list[tuple[int, int, int]] = []
    cache = DynamicCache()

    def before(start: int, end: int) -> None:
        seen.append((start, end, cache.get_seq_length()))

    chunked, logits = prefill_in_chunks(model, ids, 8, cache=cache, before_chunk=before)
    assert seen == [(0, 8, 0), (8, 16, 8), (16, 23, 16)]
    whole, whole_logits = prefill_in_chunks(model, ids, None)
    torch.testing.assert_close(logits, whole_logits, atol=1e-5, rtol=1e-5)
    for a, b in zip(chunked.layers, whole.layers):
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------- what a memo is keyed by


@pytest.fixture(scope="module")
def recorded():  # noqa: ANN201
    return record_prefill(tiny_model("llama", layers=2, seed=4), random_ids(80, seed=2))


def _same(a: list, b: list) -> bool:
    """Two lists of statistics (named tuples of numbers and arrays) hold equal values."""
    return len(a) == len(b) and all(
        len(x) == len(y) and all(np.array_equal(np.asarray(u), np.asarray(v)) for u, v in zip(x, y))
        for x, y in zip(a, b)
    )


def _direct(press, record) -> list:  # noqa: ANN001
    """Every layer's statistic as the press computes it, no memo."""
    return [
        press.layer_statistic(layer.module, layer.hidden_states, layer.keys, layer.values, dict(layer.kwargs))
        for layer in record.layers
    ]


def test_per_prompt_statistics_are_shared_by_equal_rules_and_windows_only(recorded) -> None:  # noqa: ANN001
    """Over a record's keys: presses of one rule and window share one memo entry per layer whatever their budget;
    another window, another rule, or the same rule with other settings each get their own entry, equal to what
    the press computes without a memo. Seeded bugs caught: the statistic keyed by nothing but the rule (in
    ``fastpath.derive.recorded_statistics``); keyed by the rule's name only, not its settings, or without the
    window."""
    layers, config = recorded.layers, recorded.model.config
    presses = {
        "cake w8": make_press("cake", 0.2, window_size=8),
        "cake w8 again": make_press("cake", 0.5, window_size=8),
        "cake w16": make_press("cake", 0.2, window_size=16),
        "dynamickv w8": make_press("dynamickv", 0.2, window_size=8),
        "lava w8": make_press("lava", 0.2, window_size=8),
    }
    memo = ScoreMemo()
    shared = {name: recorded_statistics(press, layers, config, memo) for name, press in presses.items()}
    assert all(a is b for a, b in zip(shared["cake w8 again"], shared["cake w8"]))
    assert memo.hits == len(layers) and memo.misses == len(layers) * (len(presses) - 1)
    for name, press in presses.items():
        assert _same(shared[name], _direct(press, recorded)), name
    assert not _same(shared["cake w16"], shared["cake w8"])

    # the same rule with other settings: another entry
    other = PerPromptBudgetPress(
        press=SnapKVPress(window_size=8), schedule=PerPromptSchedule(DynamicKVRule(kernel_size=3), 0.2, 8)
    )
    memo = ScoreMemo()
    first = recorded_statistics(presses["dynamickv w8"], layers, config, memo)
    second = recorded_statistics(other, layers, config, memo)
    assert memo.misses == 2 * len(layers) and memo.hits == 0
    assert _same(second, _direct(other, recorded)) and not _same(first, second)


# ---------------------------------------------------------------------------- query moments over chunks


@pytest.mark.parametrize("cuts", [[2, 9, 30], [5, 6]], ids=str)
def test_a_chunked_prompts_moments_score_keys_as_kvpress_scores_the_whole_prompt(cuts: list[int]) -> None:
    """ExpectedAttention's scores from the moments merged over the chunks of a prompt (chunks inside the sinks
    too) equal kvpress's scores from the whole prompt's hidden states, though the press is given only the last
    chunk's: the statistics are the whole prompt's, averaged RoPE at its length. Seeded bugs caught: the sinks
    skipped in every chunk; the covariance divided by ``count - 1``; the merge's between-chunk term weighted
    ``n / total`` (not ``count * n / total``); the averaged RoPE at the last chunk's length."""
    model = tiny_model("llama", layers=1, seed=3).double()
    module = model.model.layers[0].self_attn
    module.rotary_emb = model.model.rotary_emb  # what kvpress's press context sets on every attention module
    generator = torch.Generator().manual_seed(12)
    n = 40
    hidden = torch.randn(1, n, 64, generator=generator, dtype=torch.float64) + 0.5
    keys = torch.randn(1, 2, n, 16, generator=generator, dtype=torch.float64)
    values = torch.randn(1, 2, n, 16, generator=generator, dtype=torch.float64)
    moments = QueryMoments(n_sink=4)
    bounds = [0, *cuts, n]
    for start, end in zip(bounds, bounds[1:]):
        moments.update(module, hidden[:, start:end], start)
    assert moments.count == n - 4
    press = MomentsExpectedAttentionPress(moments=moments, prompt_tokens=n, n_sink=4)
    with torch.no_grad():
        got = press.score(module, hidden[:, cuts[-1] :], keys, values, None, {})
        want = ExpectedAttentionPress(n_sink=4).score(module, hidden, keys, values, None, {})
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)
