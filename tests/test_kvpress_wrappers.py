"""Every method as a kvpress user runs it: bare and inside kvpress's ``ComposedPress``, on a tiny random Llama.

The way kvpress 0.5.5's generic press test (``tests/presses/test_presses.py::test_presses_run``) tries a press and
its wrappers: ``post_init_from_model`` on the bare press, then ``ComposedPress([press])`` applied with its own
context manager; here followed by a few greedy decoding steps (``model.generate``). A composition of one press must
keep what the press keeps alone, so the composed run is compared with the bare one token for token and tensor for
tensor. ``ComposedPress`` accepts any press but kvpress's AdaKV and KVzip, so every method of
:data:`ripplekv.presses.METHODS` is tried in it; the one a wrapper cannot run (SqueezeAttention, which reads the
residual stream its own context manager captures) must say so.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from kvpress import ComposedPress
from kvpress.presses.base_press import BasePress
from transformers import DynamicCache

from ripplekv.models.cache import cache_tensors
from ripplekv.presses.registry import METHODS, make_press
from ripplekv.profiling.damage_profile import ORACLE_METHOD, make_damage_profile
from tests.conftest import random_ids, synthetic_profile, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

BUDGET = 0.3
WINDOW = 4
PROMPT = 96
STEPS = 3
WRAPPER_REFUSED = {"squeezeattention": "squeezeattention reads each decoder layer's input residual stream"}
"""Methods kvpress's wrappers cannot drive, and the start of the error that says so."""


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_model("llama", layers=3)


def _press(model: Any, name: str) -> BasePress:
    profile = synthetic_profile(model)
    if name == ORACLE_METHOD:  # ripplekv-oracle takes a damage profile
        profile = make_damage_profile(profile.model, [profile.scores], BUDGET, {"description": "t"}, "snapkv", 4, "t")
    return make_press(name, budget=BUDGET, profile=profile, window_size=WINDOW)


def _run(model: Any, press: BasePress) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[int]]:
    """The prefill's compressed cache (kvpress's generic test: one forward over a fresh cache), then the tokens of a
    prefill and a few greedy decoding steps under the same press."""
    ids = random_ids(PROMPT, seed=3)
    with torch.no_grad(), press(model):
        cache = DynamicCache()
        model(ids, past_key_values=cache)
        tokens = model.generate(ids, max_new_tokens=STEPS, do_sample=False, min_new_tokens=STEPS)
    return [(k.clone(), v.clone()) for k, v in cache_tensors(cache)], tokens[0, PROMPT:].tolist()


@pytest.mark.parametrize("name", METHODS)
def test_every_method_runs_bare_and_composed(model: Any, name: str) -> None:
    bare_cache, bare_tokens = _run(model, _press(model, name))
    assert len(bare_tokens) == STEPS
    press = _press(model, name)
    press.post_init_from_model(model)  # as kvpress's generic test does before wrapping
    composed = ComposedPress([press])
    if name in WRAPPER_REFUSED:
        with pytest.raises(RuntimeError, match=WRAPPER_REFUSED[name]):
            _run(model, composed)
        return
    cache, tokens = _run(model, composed)
    assert tokens == bare_tokens
    assert len(cache) == len(bare_cache)
    for (k, v), (bare_k, bare_v) in zip(cache, bare_cache):
        assert torch.equal(k, bare_k) and torch.equal(v, bare_v)
    if name != "full":  # kvpress's generic test reads the ratio; ComposedPress multiplies its presses' retained parts
        assert composed.compression_ratio == pytest.approx(1 - BUDGET)


def test_a_refused_wrapper_leaves_the_press_usable(model: Any) -> None:
    """The refusal happens before the press collects anything, so the press then runs bare as before."""
    press = _press(model, "squeezeattention")
    reference = _run(model, _press(model, "squeezeattention"))[1]
    with pytest.raises(RuntimeError, match="Apply the press directly"):
        _run(model, ComposedPress([press]))
    assert press._pending == {}
    assert _run(model, press)[1] == reference
