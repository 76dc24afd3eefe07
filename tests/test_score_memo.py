"""Token scores and per-prompt statistics computed once per prefill record: the same caches, fewer scorings."""

from __future__ import annotations

import pytest
import torch
from kvpress import KnormPress, RandomPress, SnapKVPress

from ripplekv.inference.generate import prefill
from ripplekv.models.cache import layer_lengths
from ripplekv.presses.registry import make_press
from ripplekv_eval.fastpath.derive import derive_cache, residual_statistics_of
from ripplekv_eval.fastpath.record import record_prefill
from ripplekv_eval.fastpath.score_memo import MemoizedScorerPress, ScoreMemo, scorer_key
from tests.conftest import random_ids, synthetic_profile, tiny_model

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
    eight = memo.scores(SnapKVPress(window_size=8, compression_ratio=0.5), *args)
    again = memo.scores(SnapKVPress(window_size=8, compression_ratio=0.9), *args)  # the ratio is not read
    sixteen = memo.scores(SnapKVPress(window_size=16), *args)
    other_keys = layer.keys.clone()
    memo.scores(SnapKVPress(window_size=8), layer.module, layer.hidden_states, other_keys, *args[3:])
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
    memo.scores(RandomPress(seed=0), *args)
    memo.scores(RandomPress(seed=0), *args)
    assert memo.hits == memo.misses == 0


@pytest.mark.parametrize("method", ["snapkv", "adakv", "ripplekv-ada"])
def test_a_derivation_leaves_the_callers_press_as_it_was(method: str) -> None:
    """The fast path hands a copy of the press a memoizing scorer; the caller's press keeps its own scorer, and
    scoring it directly after a derivation uses no memo. Seeded bug caught: ``memoizing`` wrapping the scorer of
    the given press instead of a copy's."""
    model = tiny_model("llama", layers=LAYERS)
    profile = synthetic_profile(model) if method == "ripplekv-ada" else None
    press = make_press(method, budget=0.3, window_size=WINDOW, profile=profile)
    scorer = press.press.press if method == "adakv" else press.press
    record = record_prefill(model, random_ids(PROMPT, seed=6))
    derive_cache(record, press)
    assert (press.press.press if method == "adakv" else press.press) is scorer
    assert type(scorer) is SnapKVPress and not isinstance(scorer, MemoizedScorerPress)
