"""Presses in kvpress's own pipeline, on a model loaded the usual way (``AutoModelForCausalLM.from_pretrained``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kvpress  # noqa: F401  (registers the "kv-press-text-generation" pipeline)
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, pipeline

from ripplekv.inference.generate import extend, greedy_decode, prefill
from ripplekv.models.attention import uses_varlen_attention
from ripplekv.models.cache import layer_lengths
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.presses.registry import make_press
from ripplekv.profiling.calibration import CalibrationSample, CalibrationSet
from ripplekv.profiling.sensitivity import ProfilingConfig, profile_model
from tests.conftest import save_tiny_model_dir

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with one step. " * 8
CONTEXT = TEXT[:380]
QUESTION = "What does the fox do?"
WINDOW = 8
BUDGET = 0.3
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny-pipeline"), [TEXT], vocab_size=256)


def _load(model_dir: Path) -> tuple[Any, Any]:
    """The usual way: from_pretrained (sdpa by default), no ripplekv loader."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.bos_token = tokenizer.eos_token  # kvpress's pipeline prepends bos_token to a template-less context
    return model, tokenizer


@pytest.fixture(scope="module")
def profile_path(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, tokenizer = _load(model_dir)
    samples = tuple(CalibrationSample(context=TEXT[i * 90 : i * 90 + 200], continuation=" one step") for i in (0, 1))
    profile = profile_model(model, tokenizer, CalibrationSet(samples, "tiny"), ProfilingConfig(repeats=1))
    return profile.save(tmp_path_factory.mktemp("profile") / "tiny.profile.json")


def _reference_answer(model: Any, tokenizer: Any, press: Any) -> str:
    """What the pipeline must answer: compress the context, run the question over it, decode greedily."""
    context_ids = tokenizer.encode(tokenizer.bos_token + CONTEXT, return_tensors="pt", add_special_tokens=False)
    question_ids = tokenizer.encode(QUESTION + "\n", return_tensors="pt", add_special_tokens=False)
    state = extend(model, prefill(model, context_ids, press), question_ids)
    tokens = greedy_decode(model, state, NEW_TOKENS, {tokenizer.eos_token_id})
    return tokenizer.decode(tokens, skip_special_tokens=True)


@pytest.mark.parametrize("method", ["ripplekv", "pyramidkv", "snapkv"])
def test_pipeline_question_over_a_per_layer_compressed_cache(model_dir: Path, profile_path: Path, method: str) -> None:
    model, tokenizer = _load(model_dir)
    assert model.config._attn_implementation == "sdpa" and not uses_varlen_attention(model)
    press = make_press(method, budget=BUDGET, profile=str(profile_path), window_size=WINDOW)
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    cache = DynamicCache()
    answer = pipe(CONTEXT, question=QUESTION, press=press, max_new_tokens=NEW_TOKENS, cache=cache)["answer"]
    assert isinstance(answer, str)
    lengths = layer_lengths(cache)
    n_context = len(tokenizer.encode(tokenizer.bos_token + CONTEXT, add_special_tokens=False))
    # the pipeline removed the answer from the cache: what is left is the compressed context
    assert lengths == list(press.layer_budgets(3, n_context))
    if method == "snapkv":  # uniform budgets: the model's attention is left as it was
        assert not uses_varlen_attention(model) and len(set(lengths)) == 1
    else:
        assert uses_varlen_attention(model) and len(set(lengths)) > 1
    assert answer == _reference_answer(model, tokenizer, press)


def test_attention_without_a_variable_length_variant_is_a_clear_error(model_dir: Path, profile_path: Path) -> None:
    model, _ = _load(model_dir)
    model.config._attn_implementation = "flex_attention"  # no variable-length variant (not run: refused first)
    press = make_press("pyramidkv", budget=BUDGET, window_size=WINDOW)
    assert isinstance(press, LayerBudgetPress)
    refused = "cannot attend over: load the model with attn_implementation='sdpa'"
    with pytest.raises(ValueError, match=refused), torch.no_grad(), press(model):
        pass
