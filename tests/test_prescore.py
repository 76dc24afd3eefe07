"""ExpectedAttention prescored by the record: no layer's whole hidden states are kept, the same caches are derived.

A record made with ``prescore`` (``ripplekv_eval.fastpath.record.record_prefill``) computes ExpectedAttention's scores
while the prefill runs and keeps only the hidden-state tail the other presses read. One pass: kvpress's own score on
the layer's whole input, so every derived cache equals the one derived from a record of every hidden state, bit
for bit. Chunks: the scores come from query moments merged chunk by chunk (``ripplekv_eval.fastpath.recording_press``),
equal to the one-pass scores up to rounding, keeping the same tokens.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from kvpress import AdaKVPress, DecodingPress, ExpectedAttentionPress, SnapKVPress
from kvpress.utils import get_prerope_query_states

from ripplekv.inference.generate import prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.headwise import headwise_of
from ripplekv.presses.registry import make_press
from ripplekv_eval.fastpath.derive import (
    NotDerivableError,
    compressed_prefill_in_chunks,
    derived_prefill,
    residual_statistics_of,
)
from ripplekv_eval.fastpath.hidden_tail import hidden_states_needed, hidden_states_tail, prescored_scorers
from ripplekv_eval.fastpath.record import record_prefill
from ripplekv_eval.fastpath.recording_press import MomentsExpectedAttentionPress, QueryMoments, RecordingPress
from ripplekv_eval.fastpath.score_memo import MemoizedScorerPress, ScoreMemo, scorer_key
from tests.conftest import random_ids, synthetic_profile, tiny_model
from tests.test_chunked_prefill import _kept_indices

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOW = 8
PROMPT = 100
# every schedule that scores through the record's memo (the uniform one, the depth and profile rules, the per-prompt
# rules); AdaKV calls its scorer itself and is tested apart
METHODS = ("snapkv", "pyramidkv", "ripplekv", "ripplekv-local", "cake", "squeezeattention", "dynamickv", "lava")


def _model(seed: int = 2) -> Any:
    return enable_varlen_attention(tiny_model("llama", layers=4, seed=seed))


def _presses(model: Any, scorer: ExpectedAttentionPress | None = None) -> dict[str, Any]:
    profile = synthetic_profile(model)
    scorer = ExpectedAttentionPress() if scorer is None else scorer
    return {m: make_press(m, budget=0.3, profile=profile, window_size=WINDOW, scorer=scorer) for m in METHODS}


def _same_cache(a: Any, b: Any) -> bool:
    return all(
        torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)
        for x, y in zip(a.cache.layers, b.cache.layers, strict=True)
    )


def test_a_prescored_record_keeps_the_tail_and_derives_bit_for_bit() -> None:
    """In one pass the record holds the window's tail of the hidden states, not all of them, and every schedule over
    ExpectedAttention derives the very cache a record of every hidden state gives. Seeded bug: prescoring the cut
    tail instead of the layer's whole input changes the scores (and the caches)."""
    model = _model()
    ids = random_ids(PROMPT, seed=6)
    presses = _presses(model)
    prescore = prescored_scorers(presses.values())
    assert [type(s) for s in prescore] == [ExpectedAttentionPress]  # one scorer, however many presses share it
    everything = [*presses.values(), make_press("full")]
    assert hidden_states_tail(everything) is None  # without prescoring: every hidden state
    tail = hidden_states_tail(everything, prescore)
    assert tail == WINDOW + 1  # the per-prompt rules' window statistics, SnapKV-style
    statistics = residual_statistics_of(presses.values())
    reference = record_prefill(model, ids, None, statistics, prefill_chunk=None)
    record = record_prefill(model, ids, tail, statistics, prefill_chunk=None, prescore=prescore)
    assert record.hidden_tokens == tail < reference.hidden_tokens == PROMPT
    assert record.nbytes() < reference.nbytes()
    for name, press in presses.items():
        want, _ = derived_prefill(reference, press)
        got, _ = derived_prefill(record, press)
        assert _same_cache(want, got), name


@pytest.mark.parametrize("chunk", [1, 7, 32], ids=lambda c: f"chunk{c}")
def test_a_chunked_prescored_record_keeps_the_same_tokens(chunk: int) -> None:
    """In chunks (the first ``n_sink`` positions falling in several when ``chunk`` is 1) the scores come from the
    merged query moments: equal to kvpress's one-pass scores to float32 rounding, and every schedule keeps the same
    positions per layer and head. Seeded bugs: moments merged without the between-chunk term, the averaged RoPE at
    the last chunk's length instead of the prompt's: both change the scores beyond rounding."""
    model = _model()
    ids = random_ids(PROMPT, seed=6)
    presses = _presses(model)
    prescore = prescored_scorers(presses.values())
    tail = hidden_states_tail([*presses.values(), make_press("full")], prescore)
    statistics = residual_statistics_of(presses.values())
    reference = record_prefill(model, ids, None, statistics, prefill_chunk=None)
    record = record_prefill(model, ids, tail, statistics, prefill_chunk=chunk, prescore=prescore)
    assert record.hidden_tokens == tail
    key = scorer_key(prescore[0])
    for index, layer in enumerate(reference.layers):
        want = prescore[0].score(layer.module, layer.hidden_states, layer.keys, layer.values, None, {})
        got = record.memo.get("scores", key, index, record.layers[index].keys, lambda: None)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
    for name, press in presses.items():
        want_state, _ = derived_prefill(reference, press)
        got_state, _ = derived_prefill(record, press)
        assert _kept_indices(record, got_state) == _kept_indices(reference, want_state), name


def _masks(state: Any) -> list[tuple[int, list[torch.Tensor]]]:
    """AdaKV's masked key indices per layer (held by its derived cache's layers)."""
    masks = [(index, headwise_of(layer)) for index, layer in enumerate(state.cache.layers)]
    return [(index, list(mask.indices)) for index, mask in masks if mask is not None]


def test_adakv_scores_through_the_memo_and_other_settings_are_refused() -> None:
    """The fast path hands kvpress's AdaKV (``make_press("adakv")``'s, or a bare one) a MemoizedScorerPress, so over
    ExpectedAttention it is prescored too: from a tail record it masks exactly what it masks from a record of every
    hidden state, and the memo's scores survive AdaKV's in-place safeguard. An ExpectedAttention of other settings
    than the prescored one still reads every position: deriving it from a tail record is refused, never scored from
    the tail."""
    model = _model()
    ids = random_ids(PROMPT, seed=6)
    presses = [make_press("adakv", budget=b, window_size=WINDOW, scorer=ExpectedAttentionPress()) for b in (0.3, 0.1)]
    prescore = prescored_scorers(presses)
    assert [type(s) for s in prescore] == [ExpectedAttentionPress]
    assert hidden_states_tail(presses, prescore) == 0
    reference = record_prefill(model, ids, None, prefill_chunk=None)
    record = record_prefill(model, ids, WINDOW + 1, prefill_chunk=None, prescore=prescore)
    for press in presses:  # the second budget reads the scores the first one's AdaKV was given
        want, _ = derived_prefill(reference, press)
        got, _ = derived_prefill(record, press)
        for (layer_w, mask_w), (layer_g, mask_g) in zip(_masks(want), _masks(got), strict=True):
            assert layer_w == layer_g and all(torch.equal(a, b) for a, b in zip(mask_w, mask_g, strict=True))
        direct, _ = derived_prefill(record_prefill(model, ids, None, prefill_chunk=None), press)  # no shared memo
        for (_, mask_d), (_, mask_g) in zip(_masks(direct), _masks(got), strict=True):
            assert all(torch.equal(a, b) for a, b in zip(mask_d, mask_g, strict=True))
    bare = AdaKVPress(ExpectedAttentionPress(compression_ratio=0.7))
    assert hidden_states_needed(bare, record.prescored) == 0
    want, got = derived_prefill(reference, bare)[0], derived_prefill(record, bare)[0]
    for (layer_w, mask_w), (layer_g, mask_g) in zip(_masks(want), _masks(got), strict=True):
        assert layer_w == layer_g and all(torch.equal(a, b) for a, b in zip(mask_w, mask_g, strict=True))
    other = make_press("snapkv", budget=0.3, scorer=ExpectedAttentionPress(n_sink=2))
    assert hidden_states_needed(other, record.prescored) is None
    with pytest.raises(NotDerivableError, match="reads every prompt position"):
        derived_prefill(record, other)
    derived_prefill(record, make_press("snapkv", budget=0.3, scorer=ExpectedAttentionPress()))  # the prescored one


def test_only_expected_attention_is_prescored() -> None:
    with pytest.raises(ValueError, match="prescores ExpectedAttentionPress only"):
        RecordingPress(prescore=(SnapKVPress(),))  # type: ignore[arg-type]


def test_pinned_scores_are_never_recomputed_for_other_keys() -> None:
    """A pinned score read over another key tensor raises (recomputing it would score from the tail); computed
    entries are still replaced, and ``clear`` keeps what is pinned."""
    memo = ScoreMemo()
    keys, other = torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4)
    scores = torch.arange(10.0).view(1, 2, 5)
    memo.pin("scores", "et", 0, keys, scores)
    memo.clear()
    assert memo.get("scores", "et", 0, keys, lambda: None) is scores
    with pytest.raises(ValueError, match="computed the scores of 'et' while it ran"):
        memo.get("scores", "et", 0, other, lambda: scores)
    with pytest.raises(ValueError, match="layer 1"):
        memo.get("scores", "et", 1, keys, lambda: scores)
    assert memo.get("scores", "snapkv", 0, other, lambda: scores) is scores  # not pinned: computed
    assert memo.pinned_tensors() == [scores]


# ------------------------------------------------------------------------------------------------- the moments


@torch.no_grad()
def _one_pass(module: Any, hidden: torch.Tensor, n_sink: int) -> tuple[torch.Tensor, torch.Tensor]:
    """kvpress's mean and covariance before RoPE (``get_query_statistics`` without ``apply_avg_rope``)."""
    queries = get_prerope_query_states(module, hidden[:, n_sink:])
    mu = queries.mean(dim=2, keepdim=True)
    centred = queries - mu
    return mu.squeeze(2), torch.einsum("bnsi,bnsj->bnij", centred, centred) / queries.shape[2]


def _merged(module: Any, hidden: torch.Tensor, n_sink: int, cuts: list[int]) -> QueryMoments:
    moments = QueryMoments(n_sink)
    bounds = [0, *cuts, hidden.shape[1]]
    for start, end in zip(bounds, bounds[1:]):
        moments.update(module, hidden[:, start:end], start)
    return moments


@pytest.mark.parametrize("cuts", [[], [1], [3, 4, 5], [10, 50, 51, 99], list(range(1, 120))], ids=str)
@pytest.mark.parametrize("n_sink", [0, 4])
def test_merged_moments_equal_the_one_pass_statistics(cuts: list[int], n_sink: int) -> None:
    """However the prompt is cut (chunks inside the sinks, of one position, uneven), the merged mean and covariance
    equal kvpress's one pass in float64. The queries carry a large common offset (mean ~1e3 against unit spread),
    where a float32 sum of squares around zero would lose the covariance: the chunk-centred merge keeps it.
    Seeded bug: dropping the between-chunk term of the merge leaves the covariance short."""
    model = tiny_model("llama", layers=1, seed=3).double()
    module = model.model.layers[0].self_attn
    generator = torch.Generator().manual_seed(11)
    hidden = torch.randn(1, 120, 64, generator=generator, dtype=torch.float64)
    hidden = hidden + 300.0 * torch.randn(1, 1, 64, generator=generator, dtype=torch.float64)  # the offset
    mu, cov = _merged(module, hidden, n_sink, cuts).statistics()
    want_mu, want_cov = _one_pass(module, hidden, n_sink)
    assert mu.dtype == cov.dtype == torch.float64
    scale = want_mu.abs().max()
    assert scale > 100  # the offset is there
    torch.testing.assert_close(mu, want_mu, atol=1e-6 * scale, rtol=0)
    torch.testing.assert_close(cov, want_cov, atol=1e-4 * want_cov.abs().max(), rtol=0)


def test_moments_in_bf16_are_as_exact_as_kvpress_one_pass() -> None:
    """A bf16 model: the merged statistics, rounded to bf16 once, are at least as close to the exact (float64)
    statistics of the same bf16 queries as kvpress's one pass in bf16 is."""
    model = tiny_model("llama", layers=1, seed=3).to(torch.bfloat16)
    module = model.model.layers[0].self_attn
    generator = torch.Generator().manual_seed(5)
    hidden = (torch.randn(1, 400, 64, generator=generator) + 2.0).to(torch.bfloat16)
    mu, cov = _merged(module, hidden, 4, [64, 128, 192, 256, 320]).statistics()
    assert mu.dtype == cov.dtype == torch.bfloat16
    with torch.no_grad():
        queries = get_prerope_query_states(module, hidden[:, 4:]).double()
    exact_mu = queries.mean(dim=2)
    centred = queries - exact_mu.unsqueeze(2)
    exact_cov = torch.einsum("bnsi,bnsj->bnij", centred, centred) / queries.shape[2]
    kv_mu, kv_cov = _one_pass(module, hidden, 4)
    assert kv_mu.dtype == torch.bfloat16
    for ours, theirs, exact in ((mu, kv_mu, exact_mu), (cov, kv_cov, exact_cov)):
        ours_error = (ours.double() - exact).abs().max()
        theirs_error = (theirs.double() - exact).abs().max()
        assert ours_error <= theirs_error, (float(ours_error), float(theirs_error))


def test_moments_and_their_press_refuse_bad_input() -> None:
    with pytest.raises(ValueError, match="n_sink must be an integer >= 0"):
        QueryMoments(-1)
    with pytest.raises(ValueError, match="no query after the first 4"):
        QueryMoments(4).statistics()
    model = tiny_model("llama", layers=1)
    module = model.model.layers[0].self_attn
    moments = QueryMoments(4)
    moments.update(module, torch.randn(1, 3, 64), 0)  # inside the sinks: nothing merged
    assert moments.count == 0
    with pytest.raises(ValueError, match="needs the layer's QueryMoments"):
        MomentsExpectedAttentionPress(prompt_tokens=10)
    with pytest.raises(ValueError, match="leave out 4 sink positions, the press 2"):
        MomentsExpectedAttentionPress(n_sink=2, moments=moments, prompt_tokens=10)
    with pytest.raises(ValueError, match="prompt_tokens must be an integer >= 1"):
        MomentsExpectedAttentionPress(moments=moments, prompt_tokens=0)


# ------------------------------------------------------------------------------------- the user's entry point


def _nearest_kept(reference: Any, state: Any) -> list[list[list[int]]]:
    """Per layer and KV head, the sorted prompt positions of ``state``'s keys, each matched to the nearest key of
    ``reference`` (a chunked prefill's keys differ from one pass's by rounding)."""
    found = []
    for full, layer in zip(reference.layers, state.cache.layers, strict=True):
        heads = []
        for head in range(full.keys.shape[1]):
            distance = torch.cdist(layer.keys[0, head], full.keys[0, head], compute_mode="donot_use_mm_for_euclid_dist")
            assert float(distance.min(-1).values.max()) < 1e-3  # every kept key is one of the prompt's
            heads.append(sorted(distance.argmin(-1).tolist()))
        found.append(heads)
    return found


@pytest.mark.parametrize("scorer", ["snapkv", "expected_attention"])
def test_a_compressed_prefill_in_chunks_is_the_direct_prefill(scorer: str) -> None:
    """``compressed_prefill_in_chunks``: within the chunk it is kvpress's one-pass prefill bit for bit; in chunks it
    keeps the same positions (ExpectedAttention prescored, its record holding the tail only), and a press that
    cannot be derived is refused with the reason."""
    model = _model()
    ids = random_ids(PROMPT, seed=6)
    press = make_press("ripplekv", budget=0.3, profile=synthetic_profile(model), window_size=WINDOW, scorer=scorer)
    direct = prefill(model, ids, press)
    assert _same_cache(direct, compressed_prefill_in_chunks(model, ids, press, prefill_chunk=PROMPT))
    chunked = compressed_prefill_in_chunks(model, ids, press, prefill_chunk=16)
    reference = record_prefill(model, ids, None, prefill_chunk=None)
    assert _nearest_kept(reference, chunked) == _kept_indices(reference, direct)
    with pytest.raises(NotDerivableError, match="cannot be prefilled in chunks"):
        compressed_prefill_in_chunks(model, ids, DecodingPress(base_press=SnapKVPress()), prefill_chunk=16)


def test_a_memoized_scorer_hands_out_copies() -> None:
    """Writing into the scores a MemoizedScorerPress returned (AdaKV's safeguard does) changes neither the memo's
    scores nor what the next call returns, which are what its scorer scores."""
    model = _model()
    record = record_prefill(model, random_ids(PROMPT, seed=6), prefill_chunk=None)
    layer = record.layers[1]
    args = (layer.module, layer.hidden_states, layer.keys, layer.values, None, dict(layer.kwargs))
    scorer = MemoizedScorerPress(press=SnapKVPress(window_size=WINDOW), memo=record.memo, compression_ratio=0.5)
    want = SnapKVPress(window_size=WINDOW).score(*args)
    first = scorer.score(*args)
    assert torch.equal(first, want)
    first.fill_(0.0)
    assert torch.equal(scorer.score(*args), want)
    assert record.memo.hits == 1
    with pytest.raises(TypeError, match="needs a kvpress ScorerPress"):
        MemoizedScorerPress(press=make_press("full"))  # type: ignore[arg-type]
