"""Promises of the profiling code that surviving mutants showed untested (``benchmarks/mutation.py``,
``docs/mutation.md``); the other modules' are in ``tests/test_contracts.py``.

Each test names, in its docstring, the mutants it kills.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import random
import weakref
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import ripplekv.profiling.calibration as calibration
import ripplekv.profiling.haystack as haystack
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.cache import PassThroughLayer, PreallocatedLayer
from ripplekv.profiling import passes
from ripplekv.profiling.damage_profile import damage_budget, make_damage_profile
from ripplekv.profiling.divergence import kl_divergence, relative_change
from ripplekv.profiling.haystack import NeedlePrompt, build_needle_prompt, encode, token_stream
from ripplekv.profiling.noise import ContinuationBuffers, noise_generator
from ripplekv.profiling.passes import CleanPass, Float32Head, Float32Layers, can_share_prefix
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv.profiling.sensitivity import ProfilingConfig, score_sample
from tests.conftest import random_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

# ------------------------------------------------------------------------------------------------ passes


class _Half(nn.Module):
    """A stand-in decoder layer: one bfloat16 parameter of ``numel`` elements (on the meta device: no memory)."""

    def __init__(self, numel: int, device: str = "meta") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(numel, dtype=torch.bfloat16, device=device))


def test_float32_layer_copies_are_kept_up_to_exactly_max_bytes() -> None:
    """A copy that brings the kept bytes exactly to ``max_bytes`` is kept; the next byte over is copied anew.
    Kills ``<`` for ``<=`` in :meth:`Float32Layers.__getitem__`."""
    layers = Float32Layers([_Half(10, "cpu"), _Half(1, "cpu")], max_bytes=10 * 4)
    assert layers[0] is layers[0]  # 40 float32 bytes: exactly the bound
    assert layers[1] is not layers[1]  # 4 more: over it
    assert layers[0].weight.dtype == torch.float32


def test_float32_layer_copies_kept_by_default_are_2_gib() -> None:
    """``MAX_LAYER_COPY_BYTES``, the default bound of :class:`Float32Layers`, is 2 GiB of float32 copies: a layer
    of 2**29 float32 values is kept, one more value is not (meta tensors: nothing allocated). Kills
    ``2 * 2**31`` for ``2 * 2**30``."""
    layers = Float32Layers([_Half(2**29), _Half(1)])
    assert layers[0] is layers[0]
    assert layers[1] is not layers[1]


def test_float32_head_chunks_never_pass_max_head_bytes_while_one_row_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vocabulary chunks of :class:`Float32Head` take at most ``MAX_HEAD_BYTES`` whenever one row fits (one
    row when it does not), with the same logits. Kills ``max(2, ...)`` for ``max(1, ...)``."""
    model = tiny_model("llama", layers=1)
    hidden = torch.randn(1, 3, 64, generator=torch.Generator().manual_seed(0))
    whole = Float32Head(model)(hidden)
    row_bytes = 64 * 4
    for limit in (row_bytes, row_bytes + 1, row_bytes - 1):
        monkeypatch.setattr(passes, "MAX_HEAD_BYTES", limit)
        head = Float32Head(model)
        assert head.chunk == 1, limit
        torch.testing.assert_close(head(hidden), whole)


def test_perturbed_passes_see_a_cache_as_long_as_the_context() -> None:
    """Every decoder layer of the perturbed passes sees a cache whose length is the context's (as the clean pass
    does), in the shared-prefix path as in the generic one. Kills ``shape[-3]`` (the KV heads) for
    ``shape[-2]`` in the :class:`PassThroughLayer` of :func:`batched_by_depth`."""
    n_ctx, config = 9, ProfilingConfig(alpha=0.5, repeats=1)
    for model, kind in (
        (enable_varlen_attention(tiny_model("llama", layers=2)), PassThroughLayer),
        (tiny_model("llama", layers=2), PreallocatedLayer),
    ):
        assert can_share_prefix(model, n_ctx + 3) is (kind is PassThroughLayer)
        seen: list[int] = []

        def hook(module: nn.Module, args: tuple, kwargs: dict, kind: type = kind, seen: list = seen) -> None:
            layers = kwargs["past_key_values"].layers
            index = module.self_attn.layer_idx
            if index < len(layers) and type(layers[index]) is kind:
                seen.append(layers[index].get_seq_length())

        handles = [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer in model.model.layers]
        try:
            score_sample(model, random_ids(n_ctx, 1), random_ids(3, 2), config)
        finally:
            for handle in handles:
                handle.remove()
        assert seen and set(seen) == {n_ctx}, (kind, seen)


# ------------------------------------------------------------------------------------------------ noise


def _clean(layers: int = 2, tokens: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Made-up prefilled ``(keys, values)``, ``(1, 2 KV heads, tokens, 4)`` per layer."""
    generator = torch.Generator().manual_seed(0)
    return [tuple(torch.randn(1, 2, tokens, 4, generator=generator) for _ in range(2)) for _ in range(layers)]


def test_continuation_buffers_take_one_row_no_room_and_one_layer() -> None:
    """The least buffers: ``batch`` 1, ``room`` 0, a one-layer model. Kills ``batch <= 1`` / ``batch < 2`` for
    ``batch < 1``, ``room < 1`` for ``room < 0`` and ``clean[1]`` for ``clean[0]`` (the prefix of layer 0)."""
    clean = _clean(layers=1)
    buffers = ContinuationBuffers(clean, room=0, batch=1)
    assert buffers.prefix == 5 and buffers.keys[0].shape == (1, 2, 5, 4) == buffers.values[0].shape
    assert torch.equal(buffers.keys[0], clean[0][0]) and torch.equal(buffers.values[0], clean[0][1])
    cache = buffers.perturbed_cache(0, 0.5, noise_generator(0, 0, 0))
    assert cache.layers[0].values.shape == (1, 2, 5, 4) and not torch.equal(cache.layers[0].values, clean[0][1])


def test_continuation_buffers_refuse_each_bad_size_alone() -> None:
    """No rows, or negative room, each with the other size valid. Kills ``and`` for ``or``."""
    clean = _clean()
    for batch, room in ((0, 3), (2, -1)):
        with pytest.raises(ValueError, match="batch >= 1 and room >= 0"):
            ContinuationBuffers(clean, room=room, batch=batch)


def test_noise_seeds_are_the_64_bit_state_of_a_seed_sequence() -> None:
    """The noise stream of ``(seed, sample, layer)`` is seeded by both 32-bit words of
    ``SeedSequence([seed, sample, layer])``, high word first: 64 bits (with 32, the birthday bound makes two of
    ~10^5 streams likely to coincide), and a profile reproducible from its seed alone. Kills ``>>`` for ``<<`` and
    ``state[1]`` for ``state[0]``."""
    for triple in ((0, 0, 0), (7, 3, 11), (2**31, 1000, 40)):
        high, low = np.random.SeedSequence(list(triple)).generate_state(2, dtype=np.uint32)
        assert noise_generator(*triple).initial_seed() == (int(high) << 32) + int(low)


# ------------------------------------------------------------------------------------------------ divergence


def test_a_tensor_of_the_wrong_rank_is_named_as_such() -> None:
    """One side 3-D, the other not: the error says which ranks it got (not a shape mismatch), for either side.
    Kills ``and`` for ``or`` in the rank check of both signals."""
    three, two = torch.zeros(1, 4, 6), torch.zeros(4, 6)
    for signal in (kl_divergence, relative_change):
        for reference, other, ranks in ((three, two, "3D and 2D"), (two, three, "2D and 3D")):
            with pytest.raises(ValueError, match=f"rows, positions, size.*got {ranks}"):
                signal(reference, other)


def test_a_reference_has_one_row_or_as_many_as_the_other() -> None:
    """Two reference rows against two rows (of three positions) pair row by row; two against three are refused.
    Kills ``other.shape[1]`` (the positions) for ``other.shape[0]`` (the rows)."""
    generator = torch.Generator().manual_seed(0)
    reference, other = torch.randn(2, 3, 5, generator=generator), torch.randn(2, 3, 5, generator=generator)
    for signal in (kl_divergence, relative_change):
        paired = signal(reference, other)
        assert paired.shape == (2,)
        for row in range(2):
            torch.testing.assert_close(paired[row : row + 1], signal(reference[row : row + 1], other[row : row + 1]))
        with pytest.raises(ValueError, match="does not match"):
            signal(reference, torch.randn(3, 3, 5, generator=generator))
        with pytest.raises(ValueError, match="does not match"):
            signal(torch.randn(3, 3, 5, generator=generator), torch.randn(2, 3, 5, generator=generator))


def test_relative_change_is_the_mean_over_positions_of_each_row() -> None:
    """``||p - r|| / ||r||`` per position, averaged over positions: one value per row. Kills ``mean(-2)`` for
    ``mean(-1)``."""
    reference = torch.tensor([[[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]]])  # norms 5, 1, 2
    perturbed = torch.stack([reference[0] + torch.tensor([1.0, 0.0]), reference[0] * 2.0])  # rows 2, positions 3
    got = relative_change(reference, perturbed)
    assert got.dtype == torch.float64 and got.shape == (2,)
    torch.testing.assert_close(got, torch.tensor([(1 / 5 + 1 / 1 + 1 / 2) / 3, 1.0], dtype=torch.float64))


# ------------------------------------------------------------------------------------------------ damage profiles

MODEL = {"num_hidden_layers": 2, "config_hash": "x"}


def _damage(rows: list[list[float]], budget: float = 0.2, layers: int = 2) -> SensitivityProfile:
    return make_damage_profile({**MODEL, "num_hidden_layers": layers}, rows, budget, {"d": 1}, "snapkv", 4, "t")


def test_damage_rows_of_unequal_width_are_refused_whatever_the_first() -> None:
    """Rows of different lengths, and no layer at all, are refused; one layer is a profile. Kills ``and`` for
    ``or`` and ``width <= 1`` for ``width < 1``."""
    for rows in ([[0.1, 0.2], [0.1]], [[0.1], [0.1, 0.2]], [[]]):
        with pytest.raises(ValueError, match="one value per layer"):
            _damage(rows)
    assert _damage([[0.3], [0.1]], layers=1).scores == pytest.approx((0.2,))


def test_damage_of_rounding_size_below_zero_is_accepted_up_to_exactly_minus_1e9() -> None:
    """A damage down to -1e-9 (float rounding of a zero KL) is accepted, anything below refused. Kills ``>`` for
    ``>=``."""
    assert _damage([[-1e-9, 0.0]]).sample_scores == ((-1e-9, 0.0),)
    with pytest.raises(ValueError, match="non-finite or negative"):
        _damage([[-1.1e-9, 0.0]])


def test_a_damage_budget_of_zero_is_refused() -> None:
    """Zero is no budget, both when making a damage profile and when reading one; the least float above it is one.
    Kills ``budget < 0`` for ``budget <= 0`` in :func:`make_damage_profile` and :func:`damage_budget`."""
    with pytest.raises(ValueError, match="positive number"):
        _damage([[0.1, 0.2]], budget=0)
    with pytest.raises(ValueError, match="positive number"):
        _damage([[0.1, 0.2]], budget=0.0)
    profile = _damage([[0.1, 0.2]], budget=5e-324)
    assert damage_budget(profile) == 5e-324
    for zero in (0, 0.0):
        with pytest.raises(ValueError, match="budget must be a positive number"):
            damage_budget(dataclasses.replace(profile, extra={**profile.extra, "budget": zero}))


def test_a_damage_profile_records_no_noise_and_one_measurement() -> None:
    """``alpha`` 0 (no noise was added: the module docstring) and ``repeats`` 1 (one measurement per prompt and
    layer), seed 0. Kills ``alpha=1.0`` and ``repeats=2``."""
    profile = _damage([[0.1, 0.2], [0.3, 0.4]])
    assert (profile.alpha, profile.repeats, profile.seed) == (0.0, 1, 0)


# ------------------------------------------------------------------------------------------------ essays, needles


class _Chars:
    """One token per character (ids are code points): token counts are character counts, decoding is exact."""

    def __call__(self, text: str, add_special_tokens: bool = False, verbose: bool = False) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: Any, **kwargs: Any) -> str:
        return "".join(chr(i) for i in ids)


class _MergedSentenceEnds(_Chars):
    """Characters, except that a ``.`` followed by a capital is one token (id 0x110000 + the capital's code point),
    as BPE merges ``.T``: text cut between the two takes a token more than it did whole."""

    def __call__(self, text: str, add_special_tokens: bool = False, verbose: bool = False) -> dict:
        ids, i = [], 0
        while i < len(text):
            if text[i] == "." and i + 1 < len(text) and text[i + 1].isupper():
                ids.append(0x110000 + ord(text[i + 1]))
                i += 2
            else:
                ids.append(ord(text[i]))
                i += 1
        return {"input_ids": ids}

    def decode(self, ids: Any, **kwargs: Any) -> str:
        return "".join("." + chr(i - 0x110000) if i >= 0x110000 else chr(i) for i in ids)


def _essays(monkeypatch: pytest.MonkeyPatch, *texts: str) -> tuple[tuple[str, str], ...]:
    """Make ``texts`` the essay corpus (files ``e0.txt``, ...) of the calibration and the needle prompts."""
    corpus = tuple((f"e{i}.txt", text) for i, text in enumerate(texts))
    monkeypatch.setattr(haystack, "essays", lambda: corpus)
    monkeypatch.setattr(calibration, "essays", lambda: corpus)
    return corpus


def _words(n: int, seed: int) -> str:
    """``n`` characters of lower-case words and spaces, without a sentence end."""
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefgh      ") for _ in range(n)).replace("  ", " x")[:n]


def _needle_length(monkeypatch: pytest.MonkeyPatch, seed: int = 0) -> int:
    _essays(monkeypatch, _words(400, 0))
    return len(build_needle_prompt(_Chars(), 300, seed=seed).needle)


def _haystack_of(prompt: NeedlePrompt) -> str:
    """The haystack of a prompt whose needle is at its end."""
    assert prompt.context.endswith(" " + prompt.needle), prompt.context
    return prompt.context[: -len(prompt.needle) - 1]


def test_the_haystack_is_cut_to_whole_sentences_from_its_second_half(monkeypatch: pytest.MonkeyPatch) -> None:
    """A haystack cut mid-sentence drops the fragment after its last sentence end when that end is in its second
    half (from exactly half its length, rounded down), and is kept whole otherwise, also when it holds no sentence
    end at all. Kills, in ``_trim_to_sentence``, ``or`` for ``and``, ``>`` for ``>=``, ``/`` for ``//`` and
    ``ends[-2]`` for ``ends[-1]``."""
    extra = _needle_length(monkeypatch) + 2
    budget = 41  # haystack tokens (characters) before the cut to sentences: half of it is 20
    cases = [
        (_words(60, 1), None),  # no sentence end: kept whole
        ("a" * 19 + ". " + _words(60, 2), 20),  # its only sentence end at 20 = 41 // 2: cut there
        ("a" * 19 + "." + "B" * 60, 20),  # the same, no space after the end ("deep.The")
        ("a" * 9 + ". " + _words(60, 3), None),  # its only end in the first half: kept whole
        ("a" * 9 + ". " + "b" * 18 + ". " + _words(60, 4), 30),  # ends at 10 and 30: cut at the last
    ]
    for text, cut in cases:
        _essays(monkeypatch, text)
        prompt = build_needle_prompt(_Chars(), budget + extra, depth=1.0)
        assert _haystack_of(prompt) == text[: budget if cut is None else cut].rstrip(), (text, cut)


def test_a_needle_at_depth_0_opens_the_context_and_at_depth_1_closes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Depth 0 is the very start of the haystack and depth 1 its very end, also when the haystack does not end with
    a sentence (its end is then a boundary too). Kills ``[1, *ends]`` for ``[0, *ends]`` and ``==`` for ``!=`` in
    ``_insert_needle``."""
    extra = _needle_length(monkeypatch) + 2
    for text in ("Ab. Cd. Ef. " * 10, _words(100, 5), "Ab. Cd. " + _words(100, 6)):
        _essays(monkeypatch, text)
        first = build_needle_prompt(_Chars(), 40 + extra, depth=0.0)
        assert first.context.startswith(first.needle + " "), first.context
        last = build_needle_prompt(_Chars(), 40 + extra, depth=1.0)
        assert last.context.endswith(" " + last.needle), last.context


def test_a_needle_prompt_may_take_exactly_its_context_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt of exactly ``context_tokens`` tokens is built, not refused: a haystack of sentences without spaces
    between them ("Ab.Cd.") takes the needle and two spaces at a middle boundary. Kills ``>=`` for ``>`` in the
    final check of :func:`build_needle_prompt`."""
    extra = _needle_length(monkeypatch) + 2
    _essays(monkeypatch, "Ab.Cd.Ef." * 30)
    prompt = build_needle_prompt(_Chars(), 60 + extra, depth=0.5)
    assert prompt.context_tokens == 60 + extra == len(prompt.context)
    assert f". {prompt.needle} " in prompt.context  # between two sentences of the haystack


def test_a_needle_prompt_shrinks_its_haystack_when_the_seams_add_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """When re-tokenizing the haystack with the needle in it takes more tokens than ``context_tokens`` (the needle
    splits a merged token), the haystack is cut shorter by the excess until the prompt fits: never more than
    ``context_tokens``. Kills ``+=`` for ``-=`` and ``count + context_tokens`` for ``count - context_tokens`` in the
    shrink step (which no other test reached)."""
    extra = _needle_length(monkeypatch) + 2
    _essays(monkeypatch, "Ab.Cd.Ef.Gh." * 40)
    tokenizer, shrunk = _MergedSentenceEnds(), 0

    class Counting(_MergedSentenceEnds):
        calls = 0

        def __call__(self, text: str, **kwargs: Any) -> dict:
            self.calls += 1
            return super().__call__(text, **kwargs)

    for budget in range(40, 52):
        counting = Counting()
        prompt = build_needle_prompt(counting, budget + extra, depth=0.5)
        assert prompt.context_tokens == len(encode(tokenizer, prompt.context)) <= budget + extra
        shrunk += counting.calls > 4  # the needle, the stream, then 2 per try: a second try
    assert shrunk >= 3


def test_needle_numbers_take_1_to_18_digits() -> None:
    """``digits`` 1 and 18 are accepted (the bounds of the check), 0 and 19 refused. Kills ``<`` for either
    ``<=`` of ``1 <= digits <= 18``."""
    tokenizer = _Chars()
    with pytest.MonkeyPatch.context() as patch:
        extra = _needle_length(patch) + 2 + 20
        for digits in (1, 18):
            assert len(build_needle_prompt(tokenizer, 60 + extra, digits=digits).answer) == digits
        for digits in (0, 19):
            with pytest.raises(ValueError, match="digits"):
                build_needle_prompt(tokenizer, 60 + extra, digits=digits)


def test_needle_numbers_range_over_every_number_of_their_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over seeds, a ``digits``-digit needle number takes the smallest and the largest ``digits``-digit number
    (1 and 9; 10 and 99). Kills ``11 ** (digits - 1)`` and ``10**digits - 2`` for the bounds of the draw."""
    _essays(monkeypatch, _words(400, 7))
    tokenizer = _Chars()
    for digits, low, high in ((1, 1, 9), (2, 10, 99)):
        numbers = {int(build_needle_prompt(tokenizer, 120, seed=s, digits=digits).answer) for s in range(1500)}
        assert min(numbers) == low and max(numbers) == high and len(numbers) == high - low + 1


def test_text_is_encoded_without_special_tokens_or_length_warnings() -> None:
    """:func:`encode` adds no special token (a BOS would shift every count by one) and lets the tokenizer warn
    about no length (essay text runs past the model's limit on purpose). Kills ``add_special_tokens=True`` and
    ``verbose=True``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel(vocab={"<s>": 0, "a": 1, "b": 2, "[UNK]": 3}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, bos_token="<s>", unk_token="[UNK]", model_max_length=4)
    assert tokenizer("a b")["input_ids"] == [0, 1, 2]  # the tokenizer adds a BOS when asked
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Collect()
    logging.getLogger("transformers").addHandler(handler)
    try:
        assert encode(tokenizer, "a b a b a b") == [1, 2, 1, 2, 1, 2]
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert messages == []


def test_the_first_tokenization_covers_6_characters_a_token_wanted() -> None:
    """:func:`token_stream` tokenizes whole texts up to ``max(1024, 6 * min_tokens)`` characters, separators
    counted, at once (6 characters a token: more than English BPE's ~4, so one pass suffices without tokenizing
    the whole corpus). Kills ``7 * min_tokens`` and ``6 / min_tokens`` for ``6 * min_tokens``, and ``-`` for ``+``
    in the character count."""
    texts = [chr(ord("a") + i % 26) * 100 for i in range(100)]  # 100 characters, 102 with a separator
    for min_tokens, whole_texts in ((10, 11), (170, 11), (1000, 59)):  # 11 * 102 >= 1024, 59 * 102 >= 6000
        joined, ids = token_stream(_Chars(), texts, min_tokens)
        assert joined == "\n\n".join(texts[:whole_texts]) and len(ids) == len(joined), min_tokens


def test_default_calibration_sizes_and_seed_are_the_documented_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """8 samples, 2,048 context and 32 continuation tokens, seed 0 (docs/cli.md), for
    :func:`default_calibration` and :func:`load_calibration`. Kills ``n_samples`` 9, ``continuation_tokens`` 33
    and ``seed`` 1 as defaults of either."""
    _essays(monkeypatch, *(_words(3000, 10 + i) for i in range(6)))
    tokenizer = _Chars()
    want = calibration.default_calibration(tokenizer, n_samples=8, context_tokens=2048, continuation_tokens=32, seed=0)
    assert len(want) == 8 and all(len(s.context) == 2048 and len(s.continuation) == 32 for s in want)
    assert calibration.default_calibration(tokenizer) == want
    assert calibration.load_calibration(None, tokenizer) == want


def test_a_calibration_window_runs_on_into_the_following_essays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sample ``i`` starts inside the ``i``-th essay of the seeded order and runs on into the next ones of that
    order (cycling), joined with blank lines. Kills ``//`` for ``%`` and ``-`` for ``+`` in the essay order."""
    corpus = _essays(monkeypatch, *(chr(ord("a") + i) * 7 for i in range(5)))  # "aaaaaaa", "bbbbbbb", ...
    names = [name for name, _ in corpus]
    samples = calibration.default_calibration(_Chars(), n_samples=5, context_tokens=12, continuation_tokens=4)
    order = [names.index(s.source.removeprefix("pg-essays:").split("@")[0]) for s in samples]
    assert sorted(order) == list(range(5))  # every essay starts one sample
    for i, sample in enumerate(samples):
        offset = int(sample.source.split("@")[1])
        stream = "\n\n".join(corpus[order[(i + j) % 5]][1] for j in range(5))
        assert 0 <= offset < 7 and sample.context + sample.continuation == stream[offset : offset + 16]


def test_a_calibration_window_may_start_at_any_token_of_its_essay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over seeds, the start offset takes every token of the first essay, its last included, and none past it.
    Kills ``first_len - 2`` for ``first_len - 1``."""
    _essays(monkeypatch, *(chr(ord("a") + i) * 3 for i in range(8)))
    offsets = {
        int(calibration.default_calibration(_Chars(), 1, 6, 2, seed=seed).samples[0].source.split("@")[1])
        for seed in range(40)
    }
    assert offsets == {0, 1, 2}


def test_a_jsonl_file_is_read_no_further_than_the_records_asked_for(tmp_path: Path) -> None:
    """``n_samples`` records are taken without reading the next line (a file still being written, or a bad line
    after them). Kills ``>`` for ``>=`` in :func:`load_jsonl_calibration`."""
    path = tmp_path / "calib.jsonl"
    good = [json.dumps({"context": f"c{i}", "continuation": f"x{i}"}) for i in range(2)]
    path.write_text("\n".join([*good, '{"context": "cut']) + "\n", encoding="utf-8")
    loaded = calibration.load_jsonl_calibration(path, n_samples=2)
    assert [s.context for s in loaded] == ["c0", "c1"]
    with pytest.raises(ValueError, match="invalid JSON"):
        calibration.load_jsonl_calibration(path, n_samples=3)


def test_the_checkpoint_key_names_a_chunk_only_when_it_is_not_the_default() -> None:
    """A run with the default prefill chunk keeps the key that checkpoints written before the chunk existed have,
    so they resume. Kills ``!=`` for ``==`` in the key's chunk entry (moved here from test_chunked_prefill.py)."""
    from ripplekv.profiling.calibration import CalibrationSample, CalibrationSet
    from ripplekv.profiling.sensitivity import checkpoint_key

    calibration = CalibrationSet((CalibrationSample("a b c", "d"),), "test")
    default = checkpoint_key({"config_hash": "h"}, "w", calibration, ProfilingConfig())
    assert "prefill_chunk" not in default
    chunked = checkpoint_key({"config_hash": "h"}, "w", calibration, ProfilingConfig(prefill_chunk=512))
    assert chunked["prefill_chunk"] == 512


# ------------------------------------------------------------------------------------------------ survivors, round 2


def test_a_noise_spec_is_frozen() -> None:
    """What a sample's perturbed rows get cannot change while its passes run. Kills ``@dataclass(frozen=False)`` on
    :class:`passes.NoiseSpec`."""
    spec = passes.NoiseSpec(alpha=0.5, repeats=2, seed=0, sample=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.alpha = 1.0  # type: ignore[misc]


def test_the_shared_prefix_pass_drops_each_float32_layer_copy_after_its_layer() -> None:
    """:func:`batched_by_depth` runs each layer once, so the float32 copy of a bfloat16 layer is not kept: when a
    layer runs, no earlier layer's copy is alive (kept, they would hold up to ``MAX_LAYER_COPY_BYTES`` of device
    memory till the pass ends). Kills ``keep_copies=True`` for ``False`` in :func:`batched_by_depth`."""
    model = enable_varlen_attention(tiny_model("llama", layers=3)).to(torch.bfloat16)
    assert can_share_prefix(model, 12)
    copies: list[weakref.ref] = []
    alive: list[int] = []

    def hook(module: nn.Module, args: tuple) -> None:
        if module.self_attn.q_proj.weight.dtype == torch.float32:  # a float32 copy, not the model's own layer
            gc.collect()
            alive.append(sum(ref() is not None for ref in copies))
            copies.append(weakref.ref(module))

    handles = [layer.register_forward_pre_hook(hook) for layer in model.model.layers]  # deep-copied with the layer
    try:
        score_sample(model, random_ids(9, 1), random_ids(3, 2), ProfilingConfig(alpha=0.5, repeats=1))
    finally:
        for handle in handles:
            handle.remove()
    assert alive == [0, 0, 0]


def test_calibration_sets_are_frozen() -> None:
    """A calibration set (hashed into a checkpoint key) cannot change once made. Kills ``@dataclass(frozen=False)``
    on :class:`CalibrationSet`."""
    calib = calibration.CalibrationSet((calibration.CalibrationSample("a b c", "d"),), "test")
    with pytest.raises(dataclasses.FrozenInstanceError):
        calib.description = "other"  # type: ignore[misc]


def test_the_first_tokenization_stops_at_exactly_1024_characters() -> None:
    """Texts whose characters, separators counted, reach 1,024 exactly are enough for a first tokenization of few
    tokens: 8 texts of 126 characters (128 with a separator), not a 9th. Kills ``max(1025, ...)`` for
    ``max(1024, ...)`` in :func:`token_stream`."""
    texts = [chr(ord("a") + i) * 126 for i in range(20)]
    joined, ids = token_stream(_Chars(), texts, 10)
    assert joined == "\n\n".join(texts[:8]) and len(ids) == 8 * 126 + 7 * 2


class _Overlong(_Chars):
    """Characters, except that the first ``tries`` prompts (a needle after some haystack) take ``excess`` tokens
    more than ``context_tokens``: every try of :func:`build_needle_prompt` overshoots by ``excess``."""

    def __init__(self, context_tokens: int, tries: int, excess: int = 1) -> None:
        self.context_tokens, self.tries, self.excess = context_tokens, tries, excess

    def __call__(self, text: str, add_special_tokens: bool = False, verbose: bool = False) -> dict:
        ids = [ord(c) for c in text]
        if self.tries and " The special magic number " in text:
            self.tries -= 1
            ids += [ord(" ")] * (self.context_tokens + self.excess - len(ids))
        return {"input_ids": ids}


def test_a_needle_prompt_takes_8_tries_to_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt that still overshoots after 7 shrinks fits at the 8th try; one that overshoots 8 times is refused.
    Kills ``range(9)`` for ``range(8)`` in :func:`build_needle_prompt`."""
    extra = _needle_length(monkeypatch) + 2
    _essays(monkeypatch, _words(400, 1))
    size = 60 + extra  # a haystack of 60 tokens, then 1 fewer per try
    prompt = build_needle_prompt(_Overlong(size, tries=7), size, depth=1.0)
    assert prompt.context_tokens == len(prompt.context) <= size and len(_haystack_of(prompt)) <= 60 - 7
    with pytest.raises(ValueError, match="could not fit"):
        build_needle_prompt(_Overlong(size, tries=8), size, depth=1.0)


def test_a_needle_prompt_may_shrink_its_haystack_to_exactly_32_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """A haystack of 33 tokens that overshoots by 1 is tried again at 32 tokens, the least allowed, and fits; one
    that overshoots by 2 would go to 31 and is refused. Kills ``<=`` for ``<`` in the shrink step's floor."""
    extra = _needle_length(monkeypatch) + 2
    _essays(monkeypatch, _words(400, 1))
    size = 33 + extra
    prompt = build_needle_prompt(_Overlong(size, tries=1, excess=1), size, depth=1.0)
    assert prompt.context_tokens == len(prompt.context) <= size and len(_haystack_of(prompt)) <= 32
    with pytest.raises(ValueError, match="could not fit"):
        build_needle_prompt(_Overlong(size, tries=1, excess=2), size, depth=1.0)


def test_a_clean_pass_is_frozen() -> None:
    """What the clean pass leaves is shared by every perturbed pass: it cannot be rebound. Kills
    ``@dataclass(frozen=False)`` on :class:`CleanPass`."""
    clean = CleanPass(clean=(), calls=(), new_tokens=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        clean.new_tokens = 2  # type: ignore[misc]


def _meta_lm(vocab: int, width: int) -> Any:
    """A stand-in causal LM for :class:`Float32Head`: a bfloat16 output projection on the meta device (no memory)."""
    decoder = SimpleNamespace(layers=[], norm=nn.Identity())
    head = nn.Linear(width, vocab, bias=False, device="meta", dtype=torch.bfloat16)
    config = SimpleNamespace(get_text_config=lambda: SimpleNamespace())
    return SimpleNamespace(get_decoder=lambda: decoder, get_output_embeddings=lambda: head, config=config)


def test_float32_head_casts_its_weight_once_up_to_exactly_256_mib() -> None:
    """``MAX_HEAD_BYTES`` is 256 MiB: an output projection of 2**13 rows of width 2**13 (2**28 float32 bytes) is
    cast to float32 once, at construction; one row more is cast in chunks of 2**13 rows on each call. Kills
    ``256 * 3**20`` for ``256 * 2**20`` and ``rows < self.chunk`` for ``rows <= self.chunk``."""
    assert passes.MAX_HEAD_BYTES == 256 * 2**20 == 2**13 * 2**13 * 4
    whole = Float32Head(_meta_lm(2**13, 2**13))
    assert whole.chunk == 2**13 and whole._float_weight is not None
    assert whole._float_weight.dtype == torch.float32
    chunked = Float32Head(_meta_lm(2**13 + 1, 2**13))
    assert chunked.chunk == 2**13 and chunked._float_weight is None


def test_a_one_layer_model_is_profiled_on_both_paths() -> None:
    """A model of a single decoder layer is profiled, by the shared-prefix pass and by the generic one alike, with
    the same score. Kills ``clean.clean[1]`` for ``clean.clean[0]`` in ``_input`` (a one-layer cache has no layer
    1)."""
    config = ProfilingConfig(alpha=0.5, repeats=2)
    context, continuation = random_ids(9, 1), random_ids(3, 2)
    generic = score_sample(tiny_model("llama", layers=1), context, continuation, config)
    shared = score_sample(enable_varlen_attention(tiny_model("llama", layers=1)), context, continuation, config)
    assert len(generic.kl) == len(generic.local) == 1 and generic.kl[0] > 0
    assert shared.kl == pytest.approx(generic.kl, rel=1e-4) and shared.local == pytest.approx(generic.local, rel=1e-4)


class _Words:
    """One token per whitespace-separated word."""

    def __call__(self, text: str, add_special_tokens: bool = False, verbose: bool = False) -> dict:
        return {"input_ids": [len(word) for word in text.split()]}


def test_token_stream_stops_at_exactly_min_tokens_and_doubles_a_short_guess() -> None:
    """Texts of 10 words (99 characters, 101 with a separator, 10 tokens). 110 tokens wanted: the first guess of
    1,024 characters takes 11 texts, exactly enough. 111 wanted: those fall short, and the guess doubles to 2,048
    characters, 21 texts; 211 wanted: 1,266, then 2,532 characters, 26 texts. Kills ``>`` for ``>=`` in the
    check of the tokens, and ``char_budget *= 3`` for ``*= 2`` (31 and 38 texts), a line no other test ran."""
    texts = [" ".join([chr(ord("a") + i % 26) * 9] * 10) for i in range(60)]
    for min_tokens, used in ((110, 11), (111, 21), (211, 26)):
        joined, ids = token_stream(_Words(), texts, min_tokens)
        assert joined == "\n\n".join(texts[:used]) and len(ids) == 10 * used, min_tokens


def test_a_haystack_keeps_its_fragment_after_a_sentence_end_in_its_first_half(monkeypatch: pytest.MonkeyPatch) -> None:
    """A haystack of 41 tokens whose only sentence end is at 13, 15 or 19, in its first half (before 41 // 2 = 20)
    though not in its first third, is kept whole. Kills ``len(text) // 3`` for ``len(text) // 2`` in
    ``_trim_to_sentence``."""
    extra = _needle_length(monkeypatch) + 2
    for end in (13, 15, 19):
        text = "a" * (end - 1) + ". " + _words(60, end)
        _essays(monkeypatch, text)
        prompt = build_needle_prompt(_Chars(), 41 + extra, depth=1.0)
        assert _haystack_of(prompt) == text[:41].rstrip(), end


# ------------------------------------------------------------------------------------------------ survivors, round 3


def test_a_decoder_stack_needs_both_its_layers_and_its_final_norm() -> None:
    """:func:`passes.decoder_of` refuses a decoder without ``layers`` and one without ``norm`` (the profiling passes
    need both), and returns one with both. Kills ``and`` for ``or`` in its check."""
    for decoder in (SimpleNamespace(layers=[]), SimpleNamespace(norm=nn.Identity())):
        with pytest.raises(ValueError, match="no decoder `layers`/`norm`"):
            passes.decoder_of(SimpleNamespace(get_decoder=lambda decoder=decoder: decoder))
    whole = SimpleNamespace(layers=[], norm=nn.Identity())
    assert passes.decoder_of(SimpleNamespace(get_decoder=lambda: whole)) is whole


def test_the_shared_prefix_pass_serves_sliding_layers_up_to_exactly_their_window() -> None:
    """A sliding-window layer of window ``W`` sees the whole sequence while it has at most ``W`` tokens: a Gemma 3
    with a sliding layer of window 8 takes the shared-prefix pass for 8 tokens (with the generic pass's scores), not
    for 9; a window is no bound for a model whose layers are all global. Kills ``>`` for ``>=`` and ``any(...)`` for
    ``not any(...)`` in :func:`can_share_prefix`."""
    config = ProfilingConfig(alpha=0.5, repeats=1)
    context, continuation = random_ids(5, 1), random_ids(3, 2)
    mixed = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}
    shared = enable_varlen_attention(tiny_model("gemma3", layers=2, **mixed))
    assert can_share_prefix(shared, 8) and not can_share_prefix(shared, 9)
    generic = score_sample(tiny_model("gemma3", layers=2, **mixed), context, continuation, config)
    fast = score_sample(shared, context, continuation, config)
    assert fast.kl == pytest.approx(generic.kl, rel=1e-4) and fast.local == pytest.approx(generic.local, rel=1e-4)
    full = enable_varlen_attention(tiny_model("gemma3", layers=2, sliding_window=8))
    assert can_share_prefix(full, 9) and can_share_prefix(full, 100)


def test_the_model_head_soft_caps_its_logits_as_the_model_does() -> None:
    """:class:`passes.ModelHead` (the ``"model"`` precision's head) applies the config's ``final_logit_softcapping``
    ``c`` as ``tanh(z / c) * c``: the model's own logits, from the hidden states entering the final norm, and those
    of :class:`Float32Head` for a float32 model. Kills ``/`` for ``*`` and ``*`` for ``/`` in the capping (a line no
    test ran)."""
    model = tiny_model("gemma3", layers=1)
    model.config.final_logit_softcapping = 2.0
    entering: list[torch.Tensor] = []
    handle = model.model.norm.register_forward_pre_hook(lambda module, args: entering.append(args[0]))
    try:
        with torch.no_grad():
            logits = model(random_ids(6, 1)).logits
    finally:
        handle.remove()
    head = passes.ModelHead(model)
    assert head.softcap == 2.0 and 1.0 < float(logits.abs().max()) < 2.0  # the cap bends the logits
    with torch.no_grad():
        torch.testing.assert_close(head(entering[0]), logits)
        torch.testing.assert_close(Float32Head(model)(entering[0]), logits)


class _TupleLayer(nn.Module):
    """A decoder layer that returns ``(hidden_states, None)``, as transformers' layers did before 4.54 (and remote
    code models still may)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.inner, self.self_attn = layer, layer.self_attn

    def forward(self, hidden: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, None]:
        return self.inner(hidden, **kwargs), None


def test_the_continuation_passes_take_the_hidden_states_of_a_tuple_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoder layers that return a tuple give the scores of the same layers returning the hidden states alone, on
    both paths: the hidden states are the tuple's first entry. Kills ``out[1]`` for ``out[0]`` in ``_hidden``."""
    from ripplekv.profiling import sensitivity

    def tupled(run: Callable) -> Callable:
        def wrapped(model: Any, *args: Any) -> Any:
            decoder = model.get_decoder()
            layers = decoder.layers
            decoder.layers = nn.ModuleList(_TupleLayer(layer) for layer in layers)  # the passes only
            try:
                return run(model, *args)
            finally:
                decoder.layers = layers

        return wrapped

    config = ProfilingConfig(alpha=0.5, repeats=2)
    context, continuation = random_ids(9, 1), random_ids(3, 2)
    models = (tiny_model("llama", layers=2), enable_varlen_attention(tiny_model("llama", layers=2)))
    want = [score_sample(model, context, continuation, config) for model in models]
    for name in ("layer_by_layer", "batched_by_depth"):
        monkeypatch.setattr(sensitivity, name, tupled(getattr(sensitivity, name)))
    for model, scores in zip(models, want):
        got = score_sample(model, context, continuation, config)
        assert got.kl == pytest.approx(scores.kl, rel=1e-6) and got.local == pytest.approx(scores.local, rel=1e-6)


class _OneByteLayer(nn.Module):
    """A decoder layer whose parameters are an empty bfloat16 tensor (so :class:`Float32Layers` copies it) and one
    int8 byte (which ``.float()`` keeps): a float32 copy of 1 byte. It runs a float32 layer it holds unregistered,
    and passes each copy of itself that runs to ``note`` (a function: deep copies share it)."""

    def __init__(self, layer: nn.Module, note: Callable[[nn.Module], None]) -> None:
        super().__init__()
        self.empty = nn.Parameter(torch.zeros(0, dtype=torch.bfloat16))
        self.byte = nn.Parameter(torch.zeros(1, dtype=torch.int8), requires_grad=False)
        self.held, self.note = [layer], note

    @property
    def self_attn(self) -> nn.Module:
        return self.held[0].self_attn

    def forward(self, hidden: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if self.empty.dtype == torch.float32:  # a copy
            self.note(self)
        return self.held[0](hidden, **kwargs)


def test_the_shared_prefix_pass_keeps_no_float32_layer_copy_however_small() -> None:
    """:func:`batched_by_depth` runs each layer once and keeps none of its float32 copies, not even one of a single
    byte: when a copy runs, no earlier copy is alive. Kills ``max_bytes=... else 1`` for ``else 0`` in the
    arithmetic of the passes."""
    copies: list[weakref.ref] = []
    alive: list[int] = []

    def note(copy: nn.Module) -> None:
        gc.collect()
        alive.append(sum(ref() is not None for ref in copies))
        copies.append(weakref.ref(copy))

    model = enable_varlen_attention(tiny_model("llama", layers=3))
    model.model.layers = nn.ModuleList(_OneByteLayer(layer, note) for layer in model.model.layers)
    assert can_share_prefix(model, 12)
    scores = score_sample(model, random_ids(9, 1), random_ids(3, 2), ProfilingConfig(alpha=0.5, repeats=1))
    assert len(scores.kl) == 3 and alive == [0, 0, 0]


def test_a_profile_names_its_prefill_chunk_only_when_it_is_not_the_default() -> None:
    """The calibration record of a profile names the prefill chunk (512, or None: one pass) when it is not the
    default, and not for the default (as profiles made before the chunk existed). Kills ``!=`` for ``==`` in
    :func:`assemble_profile`."""
    from ripplekv.models.identity import model_identity
    from ripplekv.profiling.calibration import CalibrationSample, CalibrationSet
    from ripplekv.profiling.checkpoint import SampleScores
    from ripplekv.profiling.sensitivity import assemble_profile

    identity = model_identity(tiny_model("llama", layers=2))
    calib = CalibrationSet((CalibrationSample("a b c", "d"),), "test")
    done = {0: SampleScores((0.2, 0.1), (0.3, 0.4), 3, 1)}
    default = assemble_profile(identity, "w", calib, ProfilingConfig(), done)
    assert "prefill_chunk" not in default.calibration and default.scores == (0.2, 0.1)
    for chunk in (512, None):
        chunked = assemble_profile(identity, "w", calib, ProfilingConfig(prefill_chunk=chunk), done)
        assert chunked.calibration["prefill_chunk"] == chunk
