"""Relations the core promises, not only shapes (issue 18): each test names the seeded bug it was checked to catch.

* a profile's scores against its per-sample scores (order, weighting, which signal);
* every setting of a profiling run against what a resumed checkpoint accepts, one case per field of the key, and
  a guard that fails when :class:`ProfilingConfig` gains a field the cases do not cover;
* the refusals of a derived prefill against those of a direct prefill;
* fidelity metrics on a model whose vocabulary has stop tokens, at the first positions too (``min_new_tokens``);
* each validator at its exact boundary.

``benchmarks/mutation.py`` runs these with each module's own tests (``docs/mutation.md``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ripplekv.allocation.budget import AllocationConfig, BudgetSpec, compression_ratio_keeping
from ripplekv.inference.generate import extend, greedy_decode, kept_tokens, prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.presses.registry import make_press
from ripplekv.profiling.calibration import CalibrationSample, CalibrationSet
from ripplekv.profiling.checkpoint import Checkpoint, SampleScores
from ripplekv.profiling.sensitivity import (
    ProfilingConfig,
    assemble_profile,
    calibration_ids,
    checkpoint_key,
    profile_model,
    score_sample,
)
from ripplekv_eval.fastpath.derive import derived_prefill, residual_statistics_of
from ripplekv_eval.fastpath.fidelity import Fidelity, fidelity, teacher_forced_logprobs
from ripplekv_eval.fastpath.record import record_prefill
from ripplekv_eval.running.budget_rows import row_budget, row_value
from ripplekv_eval.running.rows import greedy_agreement
from tests.conftest import random_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOW = 8


class CharTokenizer:
    """One token per character (byte values up to 255)."""

    def __call__(self, text: str, add_special_tokens: bool = False, return_tensors: str | None = None) -> dict:
        ids = [min(ord(c), 255) for c in text]
        return {"input_ids": torch.tensor([ids]) if return_tensors == "pt" else ids}


def _calibration(n: int, question: str = "") -> CalibrationSet:
    samples = tuple(
        CalibrationSample(
            context=f"sample {i}: " + "a lazy dog sleeps in the sun. " * (1 + i),
            continuation=f"then {i} words",
            question=question,
        )
        for i in range(n)
    )
    return CalibrationSet(samples=samples, description="relations")


# ------------------------------------------------------------------- a profile's scores and its per-sample scores


def test_profile_scores_are_the_unweighted_mean_of_sample_scores_in_sample_order() -> None:
    """Seeded bugs caught: samples taken in the order they finished (``list(done.values())``); a mean weighted
    by context or continuation tokens; ``local_scores`` averaged from the KL scores; a sample left out."""
    calibration = _calibration(3)
    done = {  # finished in reverse order, with unequal lengths: an order or a weighting shows
        2: SampleScores(kl=(0.9, 0.0, 3.0), local=(0.5, 0.5, 0.5), context_tokens=30, continuation_tokens=2),
        0: SampleScores(kl=(0.3, 1.0, 0.0), local=(0.1, 0.2, 0.3), context_tokens=10, continuation_tokens=7),
        1: SampleScores(kl=(0.0, 2.0, 0.0), local=(0.0, 0.1, 0.9), context_tokens=20, continuation_tokens=4),
    }
    identity = {"num_hidden_layers": 3, "config_hash": "h"}
    profile = assemble_profile(identity, "w", calibration, ProfilingConfig(), done)
    rows = [done[i].kl for i in range(3)]
    assert profile.sample_scores == tuple(rows)
    assert profile.scores == tuple(float(x) for x in np.mean(np.array(rows, dtype=np.float64), axis=0))
    assert profile.scores == pytest.approx((0.4, 1.0, 1.0), abs=1e-15)
    local = np.mean(np.array([done[i].local for i in range(3)], dtype=np.float64), axis=0)
    assert profile.local_scores == tuple(float(x) for x in local)
    assert profile.calibration["context_tokens"] == [10, 20, 30]
    assert profile.calibration["continuation_tokens"] == [7, 4, 2]
    assert profile.calibration["samples"] == 3 and profile.weights_fingerprint == "w"
    del done[1]
    with pytest.raises(ValueError, match=r"sample\(s\) \[1\] of 3"):
        assemble_profile(identity, "w", calibration, ProfilingConfig(), done)


def test_profile_model_scores_each_sample_with_its_own_index_and_averages_them() -> None:
    """Seeded bugs caught: every sample's noise seeded with index 0 (or ``index + 1``); a sample's ids taken from
    another sample; the profile's mean not over its own sample rows."""
    model = tiny_model("llama", layers=2)
    calibration, config = _calibration(2), ProfilingConfig(alpha=0.5, seed=3)
    profile = profile_model(model, CharTokenizer(), calibration, config)
    for index, sample in enumerate(calibration.samples):
        context_ids, continuation_ids = calibration_ids(model, CharTokenizer(), sample, config)
        direct = score_sample(model, context_ids, continuation_ids, config, sample_index=index)
        assert profile.sample_scores[index] == direct.kl
        assert profile.calibration["context_tokens"][index] == direct.context_tokens
    assert profile.scores == tuple(float(x) for x in np.mean(np.array(profile.sample_scores), axis=0))


# ----------------------------------------------------- every setting of a run against what its checkpoint accepts

BASE = ProfilingConfig()
MODEL_BASE = ProfilingConfig(continuation="model")
# field -> (the run the checkpoint was made by, the same run with only that field changed)
CONFIG_CASES: dict[str, tuple[ProfilingConfig, ProfilingConfig]] = {
    "alpha": (BASE, dataclasses.replace(BASE, alpha=0.25)),
    "repeats": (BASE, dataclasses.replace(BASE, repeats=2)),
    "seed": (BASE, dataclasses.replace(BASE, seed=1)),
    "max_context_tokens": (BASE, dataclasses.replace(BASE, max_context_tokens=64)),
    "continuation": (BASE, MODEL_BASE),
    "answer_tokens": (MODEL_BASE, dataclasses.replace(MODEL_BASE, answer_tokens=8)),  # only the model's answers
    "max_continuation_tokens": (BASE, dataclasses.replace(BASE, max_continuation_tokens=4)),
    "precision": (BASE, dataclasses.replace(BASE, precision="model")),
    "prefill_chunk": (BASE, dataclasses.replace(BASE, prefill_chunk=64)),  # chunks round otherwise: in the key
}
IDENTITY = {"num_hidden_layers": 2, "config_hash": "arch"}


def _resumed(path: Path, made_by: dict[str, Any], resumed_by: dict[str, Any]) -> dict[int, SampleScores]:
    """The samples a run keyed ``resumed_by`` takes from a checkpoint of one sample written by ``made_by``."""
    first = Checkpoint(path, made_by)
    first.add(0, SampleScores(kl=(0.1, 0.2), local=(0.3, 0.4), context_tokens=5, continuation_tokens=2))
    first.close()
    return Checkpoint(path, resumed_by).done


def test_every_profiling_setting_has_a_checkpoint_case() -> None:
    """Fails when ProfilingConfig gains a field: add its case to CONFIG_CASES (and to the key, if it changes what
    is measured)."""
    assert set(CONFIG_CASES) == {f.name for f in dataclasses.fields(ProfilingConfig)}
    for name, (made_by, changed) in CONFIG_CASES.items():
        differing = [
            f.name for f in dataclasses.fields(ProfilingConfig) if getattr(made_by, f.name) != getattr(changed, f.name)
        ]
        assert differing == [name]


@pytest.mark.parametrize("field", sorted(CONFIG_CASES))
def test_a_checkpoint_is_not_resumed_by_a_run_with_one_other_setting(
    field: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Seeded bugs caught (one case each): any field left out of :func:`checkpoint_key` (``seed``, ``repeats``,
    ``max_context_tokens``, ``precision``, ``answer_tokens``, ...)."""
    made_by, changed = CONFIG_CASES[field]
    calibration = _calibration(1, question="What sleeps?")
    key = checkpoint_key(IDENTITY, "w", calibration, made_by)
    assert _resumed(tmp_path / "same.jsonl", key, checkpoint_key(IDENTITY, "w", calibration, made_by)).keys() == {0}
    with caplog.at_level(logging.WARNING, logger="ripplekv.profiling.checkpoint"):
        taken = _resumed(tmp_path / "other.jsonl", key, checkpoint_key(IDENTITY, "w", calibration, changed))
    assert taken == {}
    assert "made by another run" in caplog.text


@pytest.mark.parametrize(
    "change",
    ["architecture", "weights", "context", "continuation", "question", "samples"],
)
def test_a_checkpoint_is_not_resumed_for_another_model_or_calibration_set(change: str, tmp_path: Path) -> None:
    """Seeded bugs caught: the weights fingerprint or the config hash left out of the key; a calibration digest
    blind to a sample's text; for the model's own answers, a key blind to the prompts' questions (a real bug,
    fixed: the set's sha256 leaves the question out)."""
    config = MODEL_BASE if change == "question" else BASE
    calibration = _calibration(2, question="What sleeps?")
    identity, weights = dict(IDENTITY), "w"
    other = calibration
    if change == "architecture":
        identity = {**IDENTITY, "config_hash": "other"}
    elif change == "weights":
        weights = "w2"
    elif change == "samples":
        other = CalibrationSet(calibration.samples[:1], calibration.description)
    else:
        first = dataclasses.replace(calibration.samples[0], **{change: getattr(calibration.samples[0], change) + "!"})
        other = CalibrationSet((first, *calibration.samples[1:]), calibration.description)
    key = checkpoint_key(IDENTITY, "w", calibration, config)
    assert _resumed(tmp_path / "c.jsonl", key, checkpoint_key(identity, weights, other, config)) == {}


def test_settings_left_out_of_the_key_do_not_change_what_is_measured() -> None:
    """What the key leaves out for text continuations (``answer_tokens``; the questions) leaves the ids alone,
    and a description is not part of it. Seeded bug caught: ``answer_tokens`` read by text continuations (the room
    left for the continuation)."""
    model = tiny_model("llama", layers=2)
    model.config.max_position_embeddings = 48  # the context is cut to make room for the continuation
    sample = _calibration(1, question="What sleeps?").samples[0]
    ids = calibration_ids(model, CharTokenizer(), sample, BASE)
    assert ids[0].shape[1] + ids[1].shape[1] == 48
    other = calibration_ids(
        model, CharTokenizer(), dataclasses.replace(sample, question="?"), dataclasses.replace(BASE, answer_tokens=3)
    )
    assert all(torch.equal(a, b) for a, b in zip(ids, other))
    calibration = _calibration(1)
    renamed = CalibrationSet(calibration.samples, "another description")
    assert checkpoint_key(IDENTITY, "w", calibration, BASE) == checkpoint_key(IDENTITY, "w", renamed, BASE)


def test_a_context_longer_than_its_room_keeps_its_last_tokens() -> None:
    """A context cut to its room (the position limit less the continuation, ``max_context_tokens``, or the limit
    less the model's answer after the question) keeps its last tokens, so the continuation still follows the text it
    was written after, and the question stays in. Seeded bug caught: the first ``room`` tokens kept
    (``context_ids[:, :room]``)."""
    model = tiny_model("llama", layers=2)
    model.config.max_position_embeddings = 40
    context = "".join(chr(33 + i) for i in range(60))  # 60 distinct characters: which ones are kept shows
    sample = CalibrationSample(context=context, continuation="then", question=" Why?")

    def ords(text: str) -> list[int]:
        return [ord(c) for c in text]

    context_ids, continuation_ids = calibration_ids(model, CharTokenizer(), sample, BASE)
    assert context_ids[0].tolist() == ords(context[-(40 - 4) :]) and continuation_ids[0].tolist() == ords("then")
    capped, _ = calibration_ids(model, CharTokenizer(), sample, dataclasses.replace(BASE, max_context_tokens=10))
    assert capped[0].tolist() == ords(context[-10:])
    own = dataclasses.replace(MODEL_BASE, answer_tokens=6)
    prompt, answer = calibration_ids(model, CharTokenizer(), sample, own)
    assert answer is None and prompt[0].tolist() == ords((context + " Why?")[-(40 - 6) :])


# ------------------------------------------------------------ derived prefill refuses what the direct one refuses


def _outcome(call: Any) -> tuple[str, str] | list[int]:
    try:
        state = call()
    except Exception as error:  # noqa: BLE001 - the refusal itself is compared
        return type(error).__name__, str(error)
    return kept_tokens(state[0] if isinstance(state, tuple) else state)


@pytest.fixture(scope="module")
def small_model():
    return enable_varlen_attention(tiny_model("llama", layers=2))


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("snapkv", {"budget": 0.5}),
        ("pyramidkv", {"budget": 0.5}),
        ("snapkv", {"tokens": 4}),
        ("adakv", {"budget": 0.5}),
        ("cake", {"budget": 0.5}),
        ("squeezeattention", {"budget": 0.5}),
    ],
)
def test_derived_prefill_refuses_exactly_what_a_direct_prefill_refuses(small_model, name: str, kwargs: dict) -> None:
    """At prompts one shorter than, as long as and one longer than the selection window, the derived prefill
    refuses with the same exception class and message as the direct prefill, and otherwise keeps the same tokens.
    Seeded bug caught: :func:`~ripplekv_eval.fastpath.derive.derive_cache` without ``check_prompt_length`` (or with
    ``<`` for ``<=`` there)."""
    press = make_press(name, window_size=WINDOW, **kwargs)
    outcomes = []
    for n in (WINDOW - 1, WINDOW, WINDOW + 1, 3 * WINDOW):
        ids = random_ids(n, seed=n)
        direct = _outcome(lambda ids=ids: prefill(small_model, ids, press))
        statistics = residual_statistics_of([press])
        derived = _outcome(
            lambda ids=ids, statistics=statistics: derived_prefill(
                record_prefill(small_model, ids, residual_statistics=statistics), press
            )
        )
        assert derived == direct, n
        outcomes.append(direct)
    assert [isinstance(o, tuple) for o in outcomes] == [True, True, False, False]  # refused up to the window
    assert "selection window" in outcomes[1][1]


# ----------------------------------------------------------------- fidelity over a vocabulary with stop tokens


@pytest.fixture(scope="module")
def stop_case(small_model):
    """A prompt whose full cache's first argmax is made a stop token, with ids 0 and 1 stop tokens too."""
    state = prefill(small_model, random_ids(40, seed=4))
    stops = {0, 1, int(state.next_logits.argmax())}
    return state, stops


@pytest.mark.parametrize("min_new_tokens", [0, 1, 2])
def test_greedy_agreement_is_greedy_decodings_choice_at_each_position(small_model, stop_case, min_new_tokens) -> None:
    """``greedy_agreement`` counts the positions where greedy decoding over the candidate, forced along the answer,
    picks the answer's token, stop tokens banned exactly at the first ``min_new_tokens`` positions. Seeded bugs
    caught: the ban over ``min_new_tokens + 1`` (or ``- 1``) positions, no ban, the ban applied everywhere."""
    full, stops = stop_case
    answer = greedy_decode(small_model, full, 6, stops, min_new_tokens=min_new_tokens)
    assert answer[0] not in stops or min_new_tokens == 0
    reference = teacher_forced_logprobs(small_model, full, answer)
    assert greedy_agreement(reference, answer, stops, min_new_tokens) == 1.0  # decoding agrees with itself
    candidate_state = prefill(small_model, random_ids(40, seed=4), make_press("snapkv", budget=0.2, window_size=4))
    candidate = teacher_forced_logprobs(small_model, candidate_state, answer)
    picks = []
    for i in range(len(answer)):
        forced = extend(small_model, candidate_state, torch.tensor([answer[:i]])) if i else candidate_state
        picks.append(greedy_decode(small_model, forced, 1, stops, min_new_tokens=max(0, min_new_tokens - i))[0])
    expected = float(np.mean([p == t for p, t in zip(picks, answer)]))
    assert greedy_agreement(candidate, answer, stops, min_new_tokens) == pytest.approx(expected, abs=1e-12)
    # the KL of the full cache with itself is zero whatever the stops
    assert fidelity(reference, reference, answer).kl == 0.0


def test_greedy_agreement_by_hand_at_the_boundaries() -> None:
    """Rows whose argmax is a stop token at the first positions; stop ids outside the vocabulary (-1, vocab) ban
    nothing. Seeded bugs caught: ``0 < i`` or ``i <= vocab`` in the bounds of the banned ids (a stop id -1 would
    ban the last token), the ban over one position too many or too few."""
    vocab = 5
    candidate = torch.full((4, vocab), -5.0, dtype=torch.float64)
    candidate[:, 0] = 0.0  # the argmax of every row is stop token 0
    candidate[:, 4] = -1.0  # then the last token of the vocabulary
    candidate[:, 2] = -2.0
    tokens = [4, 4, 0, 0]
    assert greedy_agreement(candidate, tokens, {0}, min_new_tokens=2) == 1.0
    assert greedy_agreement(candidate, tokens, {0}, min_new_tokens=1) == 0.75
    assert greedy_agreement(candidate, tokens, {0}, min_new_tokens=3) == 0.75
    assert greedy_agreement(candidate, tokens, {0}, min_new_tokens=0) == 0.5
    assert greedy_agreement(candidate, [0, 0, 0, 0], {-1, vocab, 7}, min_new_tokens=4) == 1.0
    assert greedy_agreement(candidate, [4, 4, 4, 4], {0, -1}, min_new_tokens=4) == 1.0
    assert greedy_agreement(candidate, [4, 2, 2, 2], {0, 4}, min_new_tokens=4) == 0.75
    assert greedy_agreement(candidate, [2, 2, 2, 2], {0, 4}, min_new_tokens=4) == 1.0
    with pytest.raises(ValueError, match="does not match 3 tokens"):
        greedy_agreement(candidate, [0, 0, 0], {0})
    with pytest.raises(ValueError, match="does not match 0 tokens"):
        greedy_agreement(candidate[:0], [], {0})
    with pytest.raises(ValueError, match="does not match"):
        greedy_agreement(candidate[0], [0] * vocab, {0})


def test_fidelity_top1_is_the_unbanned_argmax_and_kl_the_mean_over_positions() -> None:
    """``fidelity``'s top-1 is the plain argmax (no stop ban), and its KL the unweighted mean over rows. Seeded
    bugs caught: the sum over positions for the mean, ``p >= 0`` (NaN from a zero-probability reference entry),
    ``candidate - reference`` for ``reference - candidate``."""
    reference = torch.log_softmax(torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]], dtype=torch.float64), dim=-1)
    candidate = torch.log_softmax(torch.tensor([[0.0, 2.0, -1.0], [1.0, 0.0, 0.0]], dtype=torch.float64), dim=-1)
    p = reference.exp()
    rows = (p * (reference - candidate)).sum(-1)
    result = fidelity(reference, candidate, [1, 0])
    assert result.kl == pytest.approx(float(rows.mean()), rel=1e-15) and result.kl > 0
    assert result.top1 == 1.0 and result.positions == 2
    sparse = reference.clone()
    sparse[0, 2] = -math.inf  # p = 0 there: contributes 0, not NaN
    sparse[0] = torch.log_softmax(sparse[0], dim=-1)
    expected = float(torch.where(sparse.exp() > 0, sparse.exp() * (sparse - candidate), 0.0).sum(-1).mean())
    assert fidelity(sparse, candidate, [1, 0]).kl == pytest.approx(expected, rel=1e-15)


# ---------------------------------------------------------------------------- validators at their exact bounds


def test_fidelity_bounds() -> None:
    """Seeded bugs caught: ``positions < 0`` (or ``<= 1``), ``0.0 < top1`` or ``top1 < 1.0``, ``0 < t`` or
    ``t <= vocab`` for token ids."""
    assert Fidelity(kl=0.0, top1=0.0, positions=1).positions == 1
    assert Fidelity(kl=0.0, top1=1.0, positions=1).top1 == 1.0
    with pytest.raises(ValueError, match="positions"):
        Fidelity(kl=0.0, top1=0.5, positions=0)
    for bad in (math.nextafter(0.0, -1.0), math.nextafter(1.0, 2.0)):
        with pytest.raises(ValueError, match="top1"):
            Fidelity(kl=0.0, top1=bad, positions=1)
    logprobs = torch.log_softmax(torch.zeros(2, 4, dtype=torch.float64), dim=-1)
    assert fidelity(logprobs, logprobs, [0, 3]).positions == 2  # the first and the last id of the vocabulary
    for bad in ([0, 4], [-1, 0]):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            fidelity(logprobs, logprobs, bad)


@pytest.mark.parametrize(
    ("field", "accepted", "refused"),
    [
        ("alpha", 0.0, -5e-324),
        ("repeats", 1, 0),
        ("max_context_tokens", 1, 0),
        ("answer_tokens", 1, 0),
        ("max_continuation_tokens", 1, 0),
    ],
)
def test_profiling_config_bounds(field: str, accepted: Any, refused: Any) -> None:
    """Seeded bugs caught: ``> 0`` for ``>= 0`` (alpha) and ``> 1`` for ``>= 1`` / ``< 0`` for ``< 1`` (the
    counts)."""
    assert getattr(ProfilingConfig(**{field: accepted}), field) == accepted
    with pytest.raises(ValueError, match=field):
        ProfilingConfig(**{field: refused})


def test_allocation_and_budget_bounds() -> None:
    """Seeded bugs caught: ``ratio < 0`` for ``<= 0``, ``gamma <= 1`` for ``< 1``, ``budget > 1`` read as
    ``>= 1``, ``tokens < 1`` as ``<= 1``, the kept-token range of :func:`compression_ratio_keeping` off by one at
    either end."""
    assert AllocationConfig(ratio=5e-324).ratio == 5e-324
    with pytest.raises(ValueError, match="ratio"):
        AllocationConfig(ratio=0.0)
    assert AllocationConfig(gamma=1.0).gamma == 1.0
    with pytest.raises(ValueError, match="gamma"):
        AllocationConfig(gamma=math.nextafter(1.0, 0.0))
    assert BudgetSpec(budget=1.0) == BudgetSpec(budget=1.0)
    with pytest.raises(ValueError, match="above 1"):
        BudgetSpec(budget=math.nextafter(1.0, 2.0))
    assert BudgetSpec(tokens=1) == BudgetSpec(tokens=1)
    assert row_value(BudgetSpec(tokens=2)) == 2  # the smallest token count with a row value
    with pytest.raises(ValueError, match="tokens must be >= 1"):
        BudgetSpec(tokens=0)
    assert row_budget(1) == BudgetSpec(budget=1.0)
    assert row_budget(math.nextafter(0.0, 1.0)) == BudgetSpec(budget=5e-324)
    with pytest.raises(ValueError):
        row_budget(0.0)
    assert compression_ratio_keeping(1, 10) == pytest.approx(0.9) and compression_ratio_keeping(10, 10) == 0.0
    assert compression_ratio_keeping(1, 1) == 0.0
    for kept, total in ((0, 10), (11, 10), (1, 0)):
        with pytest.raises(ValueError):
            compression_ratio_keeping(kept, total)
