"""Per-layer budget schedules (allocation.schedules, .budget): uniform (SnapKV), pyramid (PyramidKV), profile."""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvpress import PyramidKVPress

from ripplekv.allocation.budget import (
    AllocationConfig,
    BudgetSchedule,
    BudgetSpec,
    ProfileSchedule,
    TokenBudgetError,
    allocate,
)
from ripplekv.allocation.schedules import PyramidSchedule, UniformSchedule

PROPERTY = settings(max_examples=300, deadline=None)

# A budget as keyword arguments: a kept fraction (budget=) or an average token count per layer (tokens=).
budgets = st.one_of(
    st.floats(min_value=0.0, max_value=1.0, exclude_min=True).map(lambda b: {"budget": b}),
    st.integers(min_value=1, max_value=20_000).map(lambda t: {"tokens": t}),
)
layer_counts = st.integers(min_value=1, max_value=64)
prompt_lengths = st.integers(min_value=1, max_value=10_000)
floors = st.integers(min_value=0, max_value=128)
windows = st.integers(min_value=1, max_value=128)
betas = st.integers(min_value=1, max_value=40)
score_lists = st.lists(st.floats(-10, 10), min_size=1, max_size=64)


def _check_invariants(schedule: BudgetSchedule, n_layers: int, prompt_tokens: int, floor: int) -> tuple[int, ...]:
    """Exact total, every budget in [min(floor, prompt, average), prompt]."""
    average = BudgetSpec(schedule.budget, schedule.tokens).average(prompt_tokens)
    assert schedule.spec.average(prompt_tokens) == average
    result = schedule.layer_budgets(n_layers, prompt_tokens, floor)
    assert isinstance(result, tuple) and len(result) == n_layers
    assert all(isinstance(b, int) for b in result)
    assert sum(result) == n_layers * average
    assert min(result) >= min(floor, prompt_tokens, average)
    assert max(result) <= prompt_tokens
    return result


@PROPERTY
@given(budgets, layer_counts, prompt_lengths, floors)
def test_uniform_invariants(budget, n_layers, prompt_tokens, floor):
    result = _check_invariants(UniformSchedule(**budget), n_layers, prompt_tokens, floor)
    assert set(result) == {BudgetSpec(**budget).average(prompt_tokens)}


@PROPERTY
@given(budgets, layer_counts, prompt_lengths, floors, windows, betas)
def test_pyramid_invariants(budget, n_layers, prompt_tokens, floor, window, beta):
    schedule = PyramidSchedule(**budget, window_size=window, beta=beta)
    average = BudgetSpec(**budget).average(prompt_tokens)
    if average <= window:  # nothing beyond the window to distribute: SnapKV's uniform budgets
        assert schedule.layer_budgets(n_layers, prompt_tokens, floor) == (average,) * n_layers
        return
    result = _check_invariants(schedule, n_layers, prompt_tokens, floor)
    assert all(a >= b for a, b in zip(result, result[1:])), "non-increasing in depth"
    assert min(result) >= min(max(floor, window), average) >= window  # the window is always kept
    # Where no bound binds, each layer gets its capacity's exact share of SnapKV's total, up to rounding.
    capacities = schedule.capacities(n_layers, prompt_tokens)
    assert all(window <= c <= prompt_tokens for c in capacities)
    assert all(a >= b for a, b in zip(capacities, capacities[1:]))
    shares = [Fraction(c * n_layers * average, sum(capacities)) for c in capacities]
    if all(max(floor, window) <= s <= prompt_tokens for s in shares):
        assert all(abs(b - s) < 1 for b, s in zip(result, shares))


@PROPERTY
@given(budgets, score_lists, prompt_lengths, floors, st.floats(1.0, 20.0), st.floats(1.0, 10.0))
def test_profile_invariants_and_unchanged_rule(budget, scores, prompt_tokens, floor, ratio, gamma):
    schedule = ProfileSchedule(**budget, scores=scores, ratio=ratio, gamma=gamma)
    result = _check_invariants(schedule, len(scores), prompt_tokens, floor)
    config = AllocationConfig(ratio=ratio, gamma=gamma)
    assert result == allocate(scores, prompt_tokens, floor, config=config, **budget).budgets


def test_pyramid_at_2048_tokens_and_10_percent_is_a_strict_pyramid_with_snapkvs_total():
    """The issue's acceptance test: 30 layers, window 64, 10% of 2,048 tokens."""
    snapkv = UniformSchedule(0.1).layer_budgets(30, 2048, 64)
    pyramid = PyramidSchedule(0.1, window_size=64).layer_budgets(30, 2048, 64)
    assert all(a > b for a, b in zip(pyramid, pyramid[1:])), pyramid
    assert sum(pyramid) == sum(snapkv) == 30 * 204
    assert min(pyramid) >= 64 and max(pyramid) <= 2048
    # kvpress 0.5.5's PyramidKVPress keeps the same count in every layer there (its fallback, 205 = round(204.8))
    press = PyramidKVPress(compression_ratio=0.9, window_size=64)
    config = SimpleNamespace(num_hidden_layers=30)
    kvpress_budgets = {press.get_layer_budget(SimpleNamespace(config=config, layer_idx=i), 2048) for i in range(30)}
    assert kvpress_budgets == {205}


def test_pyramid_capacities_follow_the_authors_code():
    # C = int(2048 * 0.1) = 204, W = 64: min_num = 140 // 20 = 7, max_num = 280 - 7 = 273, steps = 266 // 29 = 9
    capacities = PyramidSchedule(0.1, window_size=64).capacities(30, 2048)
    assert capacities == tuple(273 - 9 * layer + 64 for layer in range(30))
    assert sum(capacities) == 6195  # 1.2% over SnapKV's 6,120: rescaled by layer_budgets
    # max_num capped at n - W: C = 180, W = 8, n = 200: max_num = 192, min_num = 344 - 192 = 152, steps = 40 // 3
    assert PyramidSchedule(0.9, window_size=8).capacities(4, 200) == (200, 187, 174, 161)
    # rescaled to 720: shares 199.45, 186.48, 173.52, 160.55, rounded by largest remainder
    assert PyramidSchedule(0.9, window_size=8).layer_budgets(4, 200, 8) == (199, 186, 174, 161)
    assert PyramidSchedule(0.5, window_size=8).layer_budgets(1, 200, 8) == (100,)
    # beta = 1: min_num = C - W, max_num = C - W: uniform
    assert set(PyramidSchedule(0.5, window_size=8, beta=1).layer_budgets(5, 300, 8)) == {150}


def test_pyramid_window_not_smaller_than_the_budget_keeps_snapkv_budgets():
    """No tokens beyond the window to distribute (the authors' code asserts): every layer keeps C, as SnapKV."""
    assert PyramidSchedule(0.03, window_size=64).layer_budgets(30, 2048, 64) == (61,) * 30
    assert PyramidSchedule(tokens=64, window_size=64).layer_budgets(30, 2048, 64) == (64,) * 30
    assert PyramidSchedule(0.1, window_size=64).layer_budgets(30, 284, 64) == (28,) * 30  # a short LongBench prompt
    assert PyramidSchedule(0.1, window_size=64).layer_budgets(30, 2048, 64)[0] == 333  # a real pyramid above it


def test_profile_schedule_checks_the_number_of_layers():
    schedule = ProfileSchedule(0.2, (1.0, 2.0, 3.0))
    schedule.check_layers(3)
    with pytest.raises(ValueError, match="3 layer scores for a model of 4 layers"):
        schedule.layer_budgets(4, 1000, 8)
    with pytest.raises(ValueError, match="3 layer scores for a model of 2 layers"):
        schedule.check_layers(2)


SCHEDULES = {
    "uniform": lambda **kw: UniformSchedule(**kw),
    "pyramid": lambda **kw: PyramidSchedule(**kw, window_size=8),
    "profile": lambda **kw: ProfileSchedule(**kw, scores=(1.0, 2.0)),
}

# (kwargs, what the message says); every schedule names itself first
BOUNDARY_ERRORS = [
    ({"budget": 0}, r"budget must be > 0"),
    ({"budget": 0.0}, r"budget must be > 0"),
    ({"budget": -0.5}, r"budget must be > 0"),
    ({"budget": 1.0000001}, r"above 1.*use tokens=N"),
    ({"budget": 1.5}, r"above 1.*use tokens=N"),
    ({"budget": 2}, r"above 1.*use tokens=2"),
    ({"budget": 512.0}, r"above 1.*use tokens=512"),
    ({"budget": float("nan")}, r"budget is NaN"),
    ({"budget": float("inf")}, r"budget is inf \(infinite\)"),
    ({"budget": "0.1"}, r"budget must be a real number"),
    ({"budget": True}, r"budget must be a real number"),
    ({"tokens": 0}, r"tokens must be >= 1"),
    ({"tokens": True}, r"tokens must be an integer >= 1.*a bool"),
    ({"tokens": 2.0}, r"tokens must be an integer >= 1"),
    ({"tokens": float("nan")}, r"tokens must be an integer >= 1"),
    ({"tokens": float("inf")}, r"tokens must be an integer >= 1"),
    ({"budget": 0.1, "tokens": 5}, r"not both"),
    ({}, r"no budget given"),
]


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
@pytest.mark.parametrize(("kwargs", "message"), BOUNDARY_ERRORS, ids=[str(k) for k, _ in BOUNDARY_ERRORS])
def test_invalid_budgets(kind, kwargs, message):
    make = SCHEDULES[kind]
    with pytest.raises(ValueError, match=message) as error:
        make(**kwargs)
    assert str(error.value).startswith(f"{type(make(budget=0.5)).__name__}: ")


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
def test_budget_bounds_and_kinds(kind):
    make = SCHEDULES[kind]
    assert make(budget=1).budget == 1.0 and isinstance(make(budget=1).budget, float)  # the fraction 100%
    assert make(budget=1).layer_budgets(2, 50, 1) == (50, 50)
    one = make(tokens=1)  # one token per layer: the smallest token budget, never the fraction 1.0
    assert (one.budget, one.tokens) == (None, 1) and one.layer_budgets(2, 50, 1) == (1, 1)
    assert make(tokens=np.int64(3)).tokens == 3 and type(make(tokens=np.int64(3)).tokens) is int
    assert make(budget=0.5) != make(tokens=25)  # same counts at 50 tokens, different budgets
    assert make(budget=0.5).layer_budgets(2, 50, 1) == make(tokens=25).layer_budgets(2, 50, 1)
    with pytest.raises(TypeError):
        UniformSchedule(0.1, 5)  # tokens is keyword only: a second number is never read as a token count


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
def test_compression_ratio_of_both_kinds(kind):
    make = SCHEDULES[kind]
    assert make(budget=0.25).spec.compression_ratio == 0.75
    assert make(budget=0.25).spec.compression_ratio_for(1000) == 0.75
    with pytest.raises(TokenBudgetError, match=r"tokens=100 .*compression_ratio_for\(prompt_tokens\)"):
        _ = make(tokens=100).spec.compression_ratio
    assert make(tokens=100).spec.compression_ratio_for(400) == 0.75
    assert make(tokens=100).spec.compression_ratio_for(50) == 0.0


def test_positional_budget_still_a_fraction():
    assert UniformSchedule(0.1) == UniformSchedule(budget=0.1)
    assert PyramidSchedule(0.1, 32, 10) == PyramidSchedule(budget=0.1, window_size=32, beta=10)
    assert ProfileSchedule(0.1, (1.0, 2.0)) == ProfileSchedule(budget=0.1, scores=(1.0, 2.0))
    with pytest.raises(ValueError, match="empty"):
        ProfileSchedule(tokens=5)  # scores are required


def test_token_budget_over_layers_keeps_tokens():
    schedule = ProfileSchedule(scores=(1.0, 5.0, 2.0, 9.0), tokens=40).over_layers([1, 3], 4)
    assert schedule == ProfileSchedule(scores=(5.0, 9.0), tokens=40)
    assert sum(schedule.layer_budgets(2, 1000, 1)) == 80


def test_invalid_arguments():
    for window in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="window_size must be an integer >= 1"):
            PyramidSchedule(0.1, window_size=window)
    for beta in (0, 1.5, False):
        with pytest.raises(ValueError, match="beta must be an integer >= 1"):
            PyramidSchedule(0.1, beta=beta)
    with pytest.raises(ValueError, match="NaN"):
        ProfileSchedule(0.1, (1.0, float("nan")))
    with pytest.raises(ValueError, match="empty"):
        ProfileSchedule(0.1, ())
    with pytest.raises(ValueError, match="gamma"):
        ProfileSchedule(0.1, (1.0, 2.0), gamma=0.5)
    for schedule in (UniformSchedule(0.1), PyramidSchedule(0.5, window_size=4), ProfileSchedule(0.1, (1.0,))):
        with pytest.raises(ValueError, match="n_layers must be an integer >= 1"):
            schedule.layer_budgets(0, 100, 4)
        with pytest.raises(ValueError, match="floor must be an integer >= 0"):
            schedule.layer_budgets(1, 100, -1)
        with pytest.raises(ValueError, match="prompt_tokens"):
            schedule.layer_budgets(1, 0, 4)


def test_schedules_are_frozen_and_hashable():
    schedule = ProfileSchedule(0.2, [1, 2, 3])
    assert schedule.scores == (1.0, 2.0, 3.0)
    assert schedule == ProfileSchedule(0.2, (1.0, 2.0, 3.0)) and len({schedule, ProfileSchedule(0.2, (1, 2, 3))}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        schedule.budget = 0.5  # type: ignore[misc]
    assert UniformSchedule.uniform and not PyramidSchedule.uniform and not ProfileSchedule.uniform


# ----------------------------------------------------------------------------------------- `ripplekv allocate`

ALLOCATE = ["allocate", "--budget", "0.1", "--prompt-tokens", "2048"]


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 30-layer profile (SmolLM2-135M's shape) with spread-out scores, written as `ripplekv profile` writes it."""
    from ripplekv.profiling.profile import SensitivityProfile

    kl = tuple(0.001 * (1 + (7 * i) % 11) ** 2 for i in range(30))
    local = tuple(0.1 + 0.02 * ((5 * i) % 13) for i in range(30))
    profile = SensitivityProfile(
        model={"name_or_path": "synthetic", "num_hidden_layers": 30, "config_hash": "0" * 64},
        scores=kl,
        sample_scores=(kl,),
        local_scores=local,
        alpha=0.5,
        repeats=1,
        seed=0,
        calibration={"description": "synthetic"},
        library_version="test",
        created="2026-01-01T00:00:00+00:00",
    )
    return profile.save(tmp_path_factory.mktemp("profile") / "p.json")


def test_allocate_schedules_match_the_presses(profile_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ripplekv.cli.main import main
    from ripplekv.presses.registry import make_press

    for schedule, method in [("uniform", "snapkv"), ("pyramidkv", "pyramidkv"), ("ripplekv", "ripplekv")]:
        assert main([*ALLOCATE, "--profile", str(profile_path), "--schedule", schedule, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        press = make_press(method, budget=0.1, profile=profile_path)
        assert out["budgets"] == list(press.layer_budgets(30, 2048)), schedule
        assert sum(out["budgets"]) == 30 * 204
    assert main([*ALLOCATE, "--profile", str(profile_path), "--schedule", "ripplekv-local", "--json"]) == 0
    local = json.loads(capsys.readouterr().out)["budgets"]
    assert local == list(make_press("ripplekv-local", budget=0.1, profile=profile_path).layer_budgets(30, 2048))


def test_allocate_compare_and_without_profile(profile_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ripplekv.cli.main import main

    assert main([*ALLOCATE, "--profile", str(profile_path), "--compare"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[1].startswith("ripplekv setting: r 4, gamma 3 (the defaults)")  # the profile records no setting
    assert lines[2].split() == ["layer", "uniform", "pyramidkv", "ripplekv", "ripplekv-local"]
    assert len(lines) == 3 + 30 + 1 and lines[-1].split() == ["total"] + ["6120"] * 4
    pyramid = [int(line.split()[2]) for line in lines[3:33]]
    assert all(a > b for a, b in zip(pyramid, pyramid[1:]))
    # the non-profile schedules need only the number of layers
    assert main([*ALLOCATE, "--layers", "30", "--compare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["budgets"]) == {"uniform", "pyramidkv"} and out["total"] == 6120
    assert out["budgets"]["pyramidkv"] == list(PyramidSchedule(0.1).layer_budgets(30, 2048, 64))
    with pytest.raises(SystemExit, match="needs --profile"):
        main([*ALLOCATE, "--layers", "30", "--schedule", "ripplekv"])
    with pytest.raises(SystemExit, match="--layers N"):
        main([*ALLOCATE, "--schedule", "pyramidkv"])
    # 204 tokens per layer under a 256-token window: no pyramid to build, every layer keeps 204
    assert main([*ALLOCATE, "--layers", "30", "--schedule", "pyramidkv", "--window-size", "256", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budgets"] == [204] * 30
