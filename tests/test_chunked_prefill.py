"""Chunked prefill: a record made chunk by chunk holds what a one-pass record holds, and derives the same caches.

The prompt runs in chunks of ``prefill_chunk`` tokens over its growing cache (``ripplekv.models.chunked_prefill``);
the record joins the chunks (``RecordingPress.assemble``). Every test compares against the one-pass record
(``prefill_chunk=None``) on tiny float32 models: the caches to float rounding, the hidden-state tail the presses
read, their kwargs, the per-prompt residual statistics, the tokens every derivable press keeps and the greedy
answers. Prompts within the chunk are prefilled exactly as before (bit for bit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
import torch
from kvpress import ExpectedAttentionPress

from ripplekv.allocation.per_prompt import TokenStatistic
from ripplekv.allocation.squeezeattention import (
    squeeze_layer_statistic,
    squeeze_statistic_of_similarities,
    squeeze_token_similarities,
)
from ripplekv.inference.generate import Prefill, greedy_decode, prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.cache import ReservedLayer, lean_fork
from ripplekv.models.chunked_prefill import DEFAULT_PREFILL_CHUNK, check_prefill_chunk, chunk_bounds
from ripplekv.models.headwise import headwise_of
from ripplekv.presses.registry import make_press
from ripplekv.profiling import sensitivity
from ripplekv.profiling.sensitivity import ProfilingConfig, score_sample
from ripplekv_eval.fastpath.derive import derived_prefill, residual_statistics_of
from ripplekv_eval.fastpath.fidelity import fidelity, logprob_rows, row_blocks
from ripplekv_eval.fastpath.hidden_tail import hidden_states_tail
from ripplekv_eval.fastpath.record import PrefillRecord, record_prefill
from ripplekv_eval.running.config import EvalConfig
from tests.conftest import random_ids, synthetic_profile, tiny_model
from tests.test_device import DeviceSpy

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOW = 8
PROMPT = 100
# rounding of float32 passes over other shapes: the tiny models' keys are O(1)-O(10), their differences ~1e-5
ATOL, RTOL = 5e-5, 1e-5
# SnapKV-family methods (the record keeps the window's tail) and every per-prompt rule
TAIL_METHODS = ("snapkv", "pyramidkv", "ripplekv", "adakv", "cake", "squeezeattention", "dynamickv", "lava")
# methods scored by ExpectedAttention (the record keeps every position's hidden states)
EXPECTED_METHODS = ("snapkv", "ripplekv", "cake", "squeezeattention")


def _model(arch: str = "llama", attn: str = "sdpa", seed: int = 1) -> Any:
    kwargs: dict[str, Any] = {}
    if arch == "gemma3":  # sliding layers of a short window among the global ones: their 4D masks are recorded
        kwargs = {"layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": 16}
    return enable_varlen_attention(tiny_model(arch, layers=4, seed=seed, attn=attn, **kwargs))


def _presses(model: Any, methods: Sequence[str], expected: bool = False) -> dict[str, Any]:
    profile = synthetic_profile(model)
    scorer = {"scorer": ExpectedAttentionPress()} if expected else {}
    return {m: make_press(m, budget=0.3, profile=profile, window_size=WINDOW, **scorer) for m in methods}


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


def _kwargs_match(direct: dict[str, Any], chunked: dict[str, Any]) -> None:
    assert set(direct) == set(chunked)
    for key, want in direct.items():
        got = chunked[key]
        if isinstance(want, tuple):
            assert isinstance(got, tuple) and len(got) == len(want), key
            for w, g in zip(want, got):
                _close(w, g)
        elif isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor), key
            if want.dtype in (torch.bool, torch.long):
                assert torch.equal(want, got), key
            else:
                _close(want, got)
        else:
            assert got == want, key


def _records_match(direct: PrefillRecord, chunked: PrefillRecord) -> None:
    assert chunked.prompt_tokens == direct.prompt_tokens and chunked.hidden_tokens == direct.hidden_tokens
    _close(direct.next_logits, chunked.next_logits)
    for want, got in zip(direct.layers, chunked.layers, strict=True):
        assert got.module is want.module
        _close(want.keys, got.keys)
        _close(want.values, got.values)
        _close(want.hidden_states, got.hidden_states)
        assert (want.attentions is None) == (got.attentions is None)
        if want.attentions is not None:
            _close(want.attentions, got.attentions)
        _kwargs_match(dict(want.kwargs), dict(got.kwargs))
        assert set(want.statistics) == set(got.statistics)
        for name, stat in want.statistics.items():
            for w, g in zip(stat, got.statistics[name], strict=True):
                assert abs(w - g) < 1e-6, (name, w, g)  # the rounding of the inputs only (a chunk mean: ~1e-3)


def _kept_indices(record: PrefillRecord, state: Prefill) -> list[list[list[int]]]:
    """Per layer and KV head, the sorted prompt positions the derived cache keeps (AdaKV: those not masked)."""
    masked: dict[int, set[tuple[int, int]]] = {}
    for index, layer in enumerate(state.cache.layers):
        mask = headwise_of(layer)
        if mask is not None:
            masked[index] = {(int(h), int(p)) for _, h, p in zip(*mask.indices)}
    found = []
    for index, (full, layer) in enumerate(zip(record.layers, state.cache.layers)):
        heads = []
        for head in range(full.keys.shape[1]):
            same = (layer.keys[0, head, :, None, :] == full.keys[0, head, None, :, :]).all(-1)  # (kept, prompt)
            positions = same.float().argmax(-1).tolist()
            assert bool(same.any(-1).all()), f"layer {index} holds a key that is not one of the prompt's"
            heads.append(sorted(p for p in positions if (head, p) not in masked.get(index, set())))
        found.append(heads)
    return found


# ---------------------------------------------------------------------------------------------------- the record


@pytest.mark.parametrize("chunk", [1, 7, 32, 50], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize(
    ("arch", "attn"), [("llama", "sdpa"), ("llama", "eager"), ("qwen2", "sdpa"), ("gemma3", "sdpa")]
)
@pytest.mark.parametrize("tail", [WINDOW + 1, None, 0], ids=["tail", "all", "none"])
def test_a_chunked_record_holds_what_one_pass_records(chunk: int, arch: str, attn: str, tail: int | None) -> None:
    """Cache, hidden-state tail, kwargs (position embeddings, positions, 4D masks), eager attention weights and the
    SqueezeAttention statistic, for chunks that divide the prompt (50), that do not (7, 32: a last chunk shorter
    than the tail), and of one token. Seeded bugs this catches: the tail taken from the first chunk (or any chunk
    but the last ones), a statistic averaged per chunk instead of per token, a mask or weights padded wrongly."""
    model = _model(arch, attn)
    ids = random_ids(PROMPT, seed=3)
    statistics = residual_statistics_of(_presses(model, ["squeezeattention"]).values())
    direct = record_prefill(model, ids, tail, statistics, prefill_chunk=None)
    chunked = record_prefill(model, ids, tail, statistics, prefill_chunk=chunk)
    _records_match(direct, chunked)
    # nothing more held (tensors every layer shares are joined once), but the int64 positions: one pass's
    # position_ids is a view of its cache_position, the chunks' are joined apart
    assert direct.nbytes() <= chunked.nbytes() <= direct.nbytes() + 8 * PROMPT


def test_a_prompt_within_the_chunk_is_prefilled_exactly_as_in_one_pass() -> None:
    model = _model()
    ids = random_ids(PROMPT, seed=4)
    statistics = residual_statistics_of(_presses(model, ["squeezeattention"]).values())
    direct = record_prefill(model, ids, WINDOW + 1, statistics, prefill_chunk=None)
    for chunk in (PROMPT, DEFAULT_PREFILL_CHUNK):
        same = record_prefill(model, ids, WINDOW + 1, statistics, prefill_chunk=chunk)
        assert torch.equal(same.next_logits, direct.next_logits)
        for want, got in zip(direct.layers, same.layers):
            assert torch.equal(want.keys, got.keys) and torch.equal(want.hidden_states, got.hidden_states)
            assert want.statistics == got.statistics


def test_the_chunked_cache_is_one_buffer_per_layer() -> None:
    """The chunks write into a buffer of the prompt's size per layer (no concatenation per chunk); the record's
    keys and values are those buffers, contiguous, in an ordinary cache."""
    record = record_prefill(_model(), random_ids(PROMPT, seed=5), WINDOW + 1, prefill_chunk=16)
    for layer in record.layers:
        assert layer.keys.is_contiguous() and layer.keys.shape[2] == PROMPT
        assert layer.keys.untyped_storage().nbytes() == layer.keys.numel() * layer.keys.element_size()
    assert all(type(layer).__name__ == "DynamicLayer" for layer in record.full_cache().layers)
    reserved = ReservedLayer(4)
    reserved.update(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8))
    with pytest.raises(ValueError, match="holds 4 tokens, 5 needed"):
        reserved.update(torch.zeros(1, 2, 2, 8), torch.zeros(1, 2, 2, 8))


def test_squeeze_statistic_over_parts_is_the_mean_over_tokens_exactly() -> None:
    """Per-token similarities of unequal parts, reduced once, are the whole prompt's statistic bit for bit; the mean
    of the parts' means (the seeded bug) is not."""
    generator = torch.Generator().manual_seed(0)
    residual = torch.randn(1, 53, 16, generator=generator)
    attention = torch.randn(1, 53, 16, generator=generator)
    whole = squeeze_layer_statistic(residual, attention)
    cuts = [(0, 7), (7, 32), (32, 52), (52, 53)]
    parts = [squeeze_token_similarities(residual[:, a:b], attention[:, a:b]) for a, b in cuts]
    assert squeeze_statistic_of_similarities(parts) == whole
    assert float(torch.stack([p.mean() for p in parts]).mean()) != pytest.approx(whole.similarity, abs=1e-6)
    press = _presses(tiny_model("llama", layers=2), ["squeezeattention"])["squeezeattention"]
    statistic = residual_statistics_of([press])["squeezeattention"]
    assert isinstance(statistic, TokenStatistic) and statistic(residual, attention) == whole
    with pytest.raises(ValueError, match="no per-token"):
        squeeze_statistic_of_similarities([])


def test_a_statistic_that_is_not_per_token_refuses_a_chunked_prefill() -> None:
    model = _model()
    plain = {"mine": lambda residual, attention: float(residual.mean())}
    with pytest.raises(ValueError, match="mine cannot be computed over a prefill in chunks"):
        record_prefill(model, random_ids(PROMPT), residual_statistics=plain, prefill_chunk=30)
    record = record_prefill(model, random_ids(PROMPT), residual_statistics=plain, prefill_chunk=PROMPT)
    assert set(record.layers[0].statistics) == {"mine"}  # one pass: any function


# ------------------------------------------------------------------------------------------- derived caches


@pytest.mark.parametrize("chunk", [1, 7, 32], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("expected", [False, True], ids=["snapkv-scored", "expected-attention-scored"])
def test_derived_caches_keep_the_same_tokens_and_answers(chunk: int, expected: bool) -> None:
    """Every derivable method keeps the same prompt positions per layer and head from a chunked record, and greedy
    decoding over the full and the derived caches gives the same answer. ExpectedAttention reads every position's
    hidden states (the record keeps them all); SnapKV's scorer the window's tail (stitched across chunks shorter
    than it). Seeded bugs: a tail from the wrong chunk, position embeddings of the wrong positions, a statistic
    averaged per chunk: each changes kept tokens."""
    model = _model(seed=2)
    ids = random_ids(PROMPT, seed=6)
    presses = _presses(model, EXPECTED_METHODS if expected else TAIL_METHODS, expected)
    full = make_press("full")
    tail = hidden_states_tail([*presses.values(), full])
    assert (tail is None) == expected
    statistics = residual_statistics_of(presses.values())
    direct = record_prefill(model, ids, tail, statistics, prefill_chunk=None)
    chunked = record_prefill(model, ids, tail, statistics, prefill_chunk=chunk)
    answers = []
    for record in (direct, chunked):
        state, _ = derived_prefill(record, full)
        answers.append(greedy_decode(model, state, 8, set(), fork=lean_fork))
    assert answers[0] == answers[1]
    for name, press in presses.items():
        want, _ = derived_prefill(direct, press)
        got, _ = derived_prefill(chunked, press)
        assert _kept_indices(chunked, got) == _kept_indices(direct, want), name
        assert greedy_decode(model, got, 8, set(), fork=lean_fork) == greedy_decode(
            model, want, 8, set(), fork=lean_fork
        ), name


# ----------------------------------------------------------------------------------- the option and its checks


@pytest.mark.parametrize("bad", [0, -3, True, False, 2.5, "8"])
def test_a_bad_prefill_chunk_is_refused(bad: object) -> None:
    model = tiny_model("llama", layers=2)
    for make in (
        lambda: check_prefill_chunk(bad),
        lambda: chunk_bounds(10, bad),  # type: ignore[arg-type]
        lambda: record_prefill(model, random_ids(10), prefill_chunk=bad),  # type: ignore[arg-type]
        lambda: prefill(model, random_ids(10), prefill_chunk=bad),  # type: ignore[arg-type]
        lambda: ProfilingConfig(prefill_chunk=bad),  # type: ignore[arg-type]
        lambda: EvalConfig(suite="needle", prefill_chunk=bad),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValueError, match="prefill_chunk must be an integer >= 1"):
            make()


def test_chunk_bounds() -> None:
    assert chunk_bounds(10, None) == ((0, 10),)
    assert chunk_bounds(10, 10) == ((0, 10),)
    assert chunk_bounds(10, 4) == ((0, 4), (4, 8), (8, 10))
    assert chunk_bounds(3, 1) == ((0, 1), (1, 2), (2, 3))
    with pytest.raises(ValueError, match="tokens must be an int >= 1"):
        chunk_bounds(0, 4)


def test_prefill_in_chunks_without_a_press_and_refused_with_one() -> None:
    model = _model()
    ids = random_ids(PROMPT, seed=7)
    whole = prefill(model, ids)
    chunked = prefill(model, ids, prefill_chunk=13)
    for a, b in zip(whole.cache.layers, chunked.cache.layers):
        _close(a.keys, b.keys)
    assert greedy_decode(model, chunked, 6, set()) == greedy_decode(model, whole, 6, set())  # an ordinary cache
    press = make_press("snapkv", budget=0.3, window_size=WINDOW)
    with pytest.raises(ValueError, match="compresses within one pass"):
        prefill(model, ids, press, prefill_chunk=13)
    assert prefill(model, ids, press, prefill_chunk=PROMPT).prompt_tokens == PROMPT  # one pass: allowed


def test_a_chunked_record_makes_no_tensor_off_device_and_reads_nothing_back() -> None:
    model = _model()  # (Gemma 3's sliding masks cost one documented host read per pass, chunked or not)
    ids = random_ids(PROMPT, seed=8)
    statistics = residual_statistics_of(_presses(model, ["squeezeattention"]).values())
    spy = DeviceSpy()
    with spy:
        record_prefill(model, ids, WINDOW + 1, statistics, prefill_chunk=30)
    assert not spy.violations, spy.violations
    # the only host reads are the residual statistic's own (its finiteness check and its float)
    assert all("squeezeattention" in read for read in spy.host_reads), spy.host_reads


def test_eval_prefill_chunk_option() -> None:
    from ripplekv.cli.args import prefill_chunk_arg

    assert EvalConfig(suite="needle").prefill_chunk == DEFAULT_PREFILL_CHUNK
    assert EvalConfig(suite="needle", prefill_chunk=None).prefill_chunk is None
    assert prefill_chunk_arg("none") is None and prefill_chunk_arg("1024") == 1024
    for text in ("0", "-1", "x"):
        with pytest.raises(Exception, match="integer >= 1"):
            prefill_chunk_arg(text)


# -------------------------------------------------------------------------------------------------- profiling


@pytest.mark.parametrize("fast", [True, False], ids=["batched_by_depth", "layer_by_layer"])
@pytest.mark.parametrize("own_answer", [False, True], ids=["text", "model"])
def test_profiling_over_a_by_reference_fork_scores_as_over_a_copy(
    monkeypatch: pytest.MonkeyPatch, fast: bool, own_answer: bool
) -> None:
    """The clean continuation (and the model's own answer) over a by-reference fork give the scores of the copying
    passes bit for bit; a context within the chunk is prefilled as in one pass."""
    model = _model() if fast else tiny_model("llama", layers=4, seed=1)
    ctx, cont = random_ids(60, 1), None if own_answer else random_ids(6, 2)
    config = ProfilingConfig(alpha=0.5, repeats=2, seed=3, answer_tokens=5)
    lean = score_sample(model, ctx, cont, config, sample_index=1)
    monkeypatch.setattr(sensitivity, "lean_fork", lambda cache: cache)  # the passes over the cache itself
    copied = score_sample(model, ctx, cont, config, sample_index=1)
    assert lean == copied
    monkeypatch.undo()
    unchunked = score_sample(model, ctx, cont, replace(config, prefill_chunk=None), 1)
    assert unchunked == lean
    chunked = score_sample(model, ctx, cont, replace(config, prefill_chunk=7), 1)
    for got, want in zip(chunked.kl + chunked.local, lean.kl + lean.local):
        assert got == pytest.approx(want, rel=1e-3, abs=1e-9)


# ------------------------------------------------------------------------------------ float64 rows by blocks


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("vocab", [256, 49152])
def test_log_softmax_and_kl_by_row_blocks_are_bit_identical(threads: int, vocab: int) -> None:
    """The float64 rows of teacher forcing and the fidelity KL, computed by blocks of rows, equal the whole-tensor
    formulas bit for bit (a lone row would reduce with another thread split: the blocks never leave one)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (1, 2, 3, 5, 21):
            generator = torch.Generator().manual_seed(rows)
            logits = torch.randn(rows, vocab, generator=generator) * 6
            other = logits + 0.2 * torch.randn(rows, vocab, generator=generator)
            old = torch.log_softmax(logits.to(torch.float64), dim=-1)
            new = logprob_rows(logits[0], logits[1:] if rows > 1 else None)
            assert torch.equal(new, old)
            cand = torch.log_softmax(other.to(torch.float64), dim=-1)
            p = old.exp()
            terms = torch.where(p > 0, p * (old - cand), torch.zeros((), dtype=torch.float64))
            assert fidelity(old, cand, [0] * rows).kl == float(terms.sum(dim=-1).mean())
            assert all(b - a >= 2 for a, b in row_blocks(rows)) or rows == 1
    finally:
        torch.set_num_threads(previous)


def test_the_chunk_is_part_of_the_resumed_configuration_only_where_a_sample_is_cut() -> None:
    """Prompts within the chunk give the results of one pass whatever the chunk (no key: older runs resume); a
    longer compressed part (the whole prompt, or the context under query-agnostic) puts the chunk in the key."""
    from ripplekv_eval.running.runner import resolve_config
    from ripplekv_eval.sample import EvalSample

    model = tiny_model("llama", layers=2)
    samples = [EvalSample("a/0", "a", tuple(range(50)), 40, 3, score=lambda prediction: 0.0)]

    def key(chunk: int | None, protocol: str = "question-aware") -> Any:
        config = EvalConfig(suite="needle", methods=("full",), protocol=protocol, prefill_chunk=chunk)
        return resolve_config(config, model, samples, None).get("prefill_chunk", "absent")

    assert key(DEFAULT_PREFILL_CHUNK) == key(50) == key(None) == "absent"
    assert key(49) == 49 and key(45) == 45
    assert key(45, "query-agnostic") == "absent" and key(39, "query-agnostic") == 39
