"""Token scores and per-prompt statistics computed once per prefill record: the same caches, fewer scorings."""

from __future__ import annotations

import pytest
import torch
from kvpress import KnormPress, RandomPress, SnapKVPress

from ripplekv.inference import prefill
from ripplekv.models.cache import layer_lengths
from ripplekv.presses import make_press
from ripplekv.presses.score_memo import ScoreMemo, memoized, scorer_key, token_scores
from ripplekv_eval.fastpath.derive import derive_cache
from ripplekv_eval.fastpath.record import record_prefill, residual_statistics_of
from tests.conftest import random_ids, tiny_model

LAYERS = 4
PROMPT = 96
WINDOW = 8


def _presses(scorer: str) -> list:
    names = ("snapkv", "pyramidkv", "cake", "dynamickv", "lava", "adakv", "squeezeattention")
    return [
        make_press(name, budget, window_size=WINDOW, scorer=scorer)
        for name in names
        for budget in (0.2, 0.5)
        if not (name == "adakv" and scorer != "snapkv")
    ]


def _cache_tensors(cache) -> list[torch.Tensor]:  # noqa: ANN001
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


@pytest.mark.parametrize("scorer", ["snapkv", "expected_attention"])
def test_memoised_derivations_equal_direct_prefills(scorer: str) -> None:
    """Every press derived from one record (scores memoised across them) keeps exactly what a direct prefill with
    the press keeps (no memo there). Seeded bug caught: entries keyed without the layer and its key tensor."""
    model = tiny_model("llama", layers=LAYERS)
    ids = random_ids(PROMPT, seed=3)
    presses = _presses(scorer)
    statistics = residual_statistics_of(presses)
    shared = record_prefill(model, ids, None, statistics)
    together = [derive_cache(shared, press) for press in presses]
    assert shared.memo.hits > 0, "the memo was never used"
    for press, cache in zip(presses, together):
        direct = prefill(model, ids, press)
        assert layer_lengths(cache) == layer_lengths(direct.cache)
        for a, b in zip(_cache_tensors(cache), _cache_tensors(direct.cache)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=type(press).__name__)


def test_scores_are_memoised_per_scorer_setting_and_per_key_tensor() -> None:
    model = tiny_model("llama", layers=LAYERS)
    record = record_prefill(model, random_ids(PROMPT, seed=4))
    layer = record.layers[1]
    args = (layer.module, layer.hidden_states, layer.keys, layer.values, layer.attentions, dict(layer.kwargs))
    memo = ScoreMemo()
    with memoized(memo):
        eight = token_scores(SnapKVPress(window_size=8, compression_ratio=0.5), *args)
        again = token_scores(SnapKVPress(window_size=8, compression_ratio=0.9), *args)  # the ratio is not read
        sixteen = token_scores(SnapKVPress(window_size=16), *args)
        other_keys = layer.keys.clone()
        token_scores(SnapKVPress(window_size=8), layer.module, layer.hidden_states, other_keys, *args[3:])
    assert again is eight and memo.hits == 1 and memo.misses == 3
    assert not torch.equal(eight, sixteen)
    assert torch.equal(eight, SnapKVPress(window_size=8).score(*args))


def test_scorers_that_may_read_their_ratio_are_never_memoised() -> None:
    assert scorer_key(SnapKVPress()) is not None and scorer_key(KnormPress()) is not None
    assert scorer_key(RandomPress(seed=0)) is None  # not on the list

    class Subclass(KnormPress):  # may read more than Knorm: computed each time
        pass

    assert scorer_key(Subclass()) is None
    model = tiny_model("llama", layers=LAYERS)
    record = record_prefill(model, random_ids(PROMPT, seed=5))
    layer = record.layers[0]
    args = (layer.module, layer.hidden_states, layer.keys, layer.values, layer.attentions, dict(layer.kwargs))
    memo = ScoreMemo()
    with memoized(memo):
        token_scores(RandomPress(seed=0), *args)
        token_scores(RandomPress(seed=0), *args)
    assert memo.hits == memo.misses == 0


def test_no_memo_outside_a_derivation() -> None:
    model = tiny_model("llama", layers=LAYERS)
    record = record_prefill(model, random_ids(PROMPT, seed=6))
    layer = record.layers[0]
    args = (layer.module, layer.hidden_states, layer.keys, layer.values, layer.attentions, dict(layer.kwargs))
    first, second = token_scores(SnapKVPress(), *args), token_scores(SnapKVPress(), *args)
    assert first is not second and torch.equal(first, second)
