"""Profiling over the model's own answer (``ProfilingConfig(continuation="model")``) on tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from ripplekv.inference.generate import greedy_decode, prefill
from ripplekv.profiling.calibration import (
    CalibrationSample,
    CalibrationSet,
    load_jsonl_calibration,
    load_longbench_calibration,
)
from ripplekv.profiling.sensitivity import (
    ProfilingConfig,
    calibration_ids,
    checkpoint_key,
    greedy_continuation,
    profile_model,
    score_sample,
)
from tests.conftest import random_ids, tiny_model
from tests.test_profiling import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def _continuation(model: torch.nn.Module, ids: torch.Tensor, cap: int) -> list[int]:
    cache = DynamicCache()
    with torch.no_grad():
        logits = model(ids, past_key_values=cache, use_cache=True).logits[:, -1]
    return greedy_continuation(model, cache, logits, ids.shape[1], cap)[0].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_continuation_is_the_eval_answer(arch: str) -> None:
    model = tiny_model(arch, layers=2)
    ids = random_ids(30)
    free = _continuation(model, ids, 6)
    assert free == greedy_decode(model, prefill(model, ids), 6, set(), min_new_tokens=1)
    # the first token can never end the answer; a later stop token ends it and is kept
    model.generation_config.eos_token_id = [free[0]]
    alt = _continuation(model, ids, 6)
    assert alt[0] != free[0] and alt == greedy_decode(model, prefill(model, ids), 6, {free[0]}, min_new_tokens=1)
    stops = {free[0], alt[2]}
    model.generation_config.eos_token_id = sorted(stops)
    stopped = _continuation(model, ids, 6)
    assert stopped == greedy_decode(model, prefill(model, ids), 6, stops, min_new_tokens=1)
    first_stop = next(i for i, t in enumerate(alt) if i > 0 and t in stops)
    assert stopped == alt[: first_stop + 1] and len(stopped) <= 3


def test_model_continuation_scores_equal_teacher_forcing_that_answer() -> None:
    model = tiny_model("llama", layers=3)
    ctx = random_ids(40)
    own = score_sample(model, ctx, None, ProfilingConfig(alpha=0.5, continuation="model", answer_tokens=5))
    answer = torch.tensor([_continuation(model, ctx, 5)])
    forced = score_sample(model, ctx, answer, ProfilingConfig(alpha=0.5))
    assert own == forced and own.continuation_tokens == 5


def test_profile_over_the_models_answers_records_it(tmp_path: Path) -> None:
    model = tiny_model("llama", layers=2)
    samples = (
        CalibrationSample("some context " * 3, " gold answer", question=" Q: what? A:"),
        CalibrationSample("other words " * 4, " another", question=" Q: who? A:"),
    )
    calibration = CalibrationSet(samples, "qa")
    config = ProfilingConfig(alpha=0.5, continuation="model", answer_tokens=4)
    context, continuation = calibration_ids(model, CharTokenizer(), samples[0], config)
    assert continuation is None and context.shape[1] == len(samples[0].context + samples[0].question)
    text_context, text_continuation = calibration_ids(model, CharTokenizer(), samples[0], ProfilingConfig())
    assert text_context.shape[1] == len(samples[0].context) and text_continuation.shape[1] == len(" gold answer")
    profile = profile_model(model, CharTokenizer(), calibration, config)
    assert profile.calibration["continuation"] == "model" and profile.calibration["answer_tokens"] == 4
    assert all(1 <= n <= 4 for n in profile.calibration["continuation_tokens"])
    plain = profile_model(model, CharTokenizer(), calibration, ProfilingConfig(alpha=0.5))
    assert "continuation" not in plain.calibration and plain.scores != profile.scores
    identity = {"config_hash": "h"}
    assert checkpoint_key(identity, "w", calibration, config) != checkpoint_key(
        identity, "w", calibration, ProfilingConfig(alpha=0.5)
    )
    with pytest.raises(ValueError, match="continuation must be one of"):
        ProfilingConfig(continuation="gold")
    with pytest.raises(ValueError, match="answer_tokens"):
        ProfilingConfig(continuation="model", answer_tokens=0)


def test_loaders_carry_the_question(tmp_path: Path) -> None:
    record = {"input": "Who?", "context": "A text.", "answers": ["Ann"], "length": 2}
    (tmp_path / "qa.jsonl").write_text(json.dumps(record) + "\n")
    sample = load_longbench_calibration(tmp_path).samples[0]
    assert sample.continuation == "\n\nQuestion: Who?\nAnswer: Ann"  # unchanged: profiles keep their hashes
    assert sample.question == "\n\nQuestion: Who?\nAnswer:"
    path = tmp_path / "own.jsonl"
    path.write_text(json.dumps({"context": "c", "continuation": "x", "question": " q?"}) + "\n")
    assert load_jsonl_calibration(path).samples[0].question == " q?"


def test_capped_continuation_equals_the_cut_text_and_is_recorded() -> None:
    model = tiny_model("llama", layers=2)
    long_answer = " a long gold answer that goes on"
    samples = (CalibrationSample("some context " * 3, long_answer),)
    calibration = CalibrationSet(samples, "qa")
    capped = ProfilingConfig(alpha=0.5, max_continuation_tokens=6)
    _, continuation = calibration_ids(model, CharTokenizer(), samples[0], capped)
    assert continuation.shape[1] == 6
    profile = profile_model(model, CharTokenizer(), calibration, capped)
    assert profile.calibration["max_continuation_tokens"] == 6 and profile.calibration["continuation_tokens"] == [6]
    cut = CalibrationSet((CalibrationSample(samples[0].context, long_answer[:6]),), "qa")
    assert profile.scores == profile_model(model, CharTokenizer(), cut, ProfilingConfig(alpha=0.5)).scores
    whole = ProfilingConfig(alpha=0.5)
    assert "max_continuation_tokens" not in profile_model(model, CharTokenizer(), calibration, whole).calibration
    identity = {"config_hash": "h"}
    assert checkpoint_key(identity, "w", calibration, capped) != checkpoint_key(identity, "w", calibration, whole)
    longer = ProfilingConfig(alpha=0.5, max_continuation_tokens=100)  # longer than the text: whole
    assert calibration_ids(model, CharTokenizer(), samples[0], longer)[1].shape[1] == len(long_answer)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_continuation_tokens"):
            ProfilingConfig(max_continuation_tokens=bad)
