"""Promises of the core that surviving mutants showed untested (``benchmarks/mutation.py``, ``docs/mutation.md``).

Each test names, in its docstring, the mutants it kills.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import DynamicCache

import ripplekv.allocation.dynamickv as dynamickv
import ripplekv.allocation.squeezeattention as squeezeattention
from ripplekv.allocation.budget import (
    DEFAULT_GAMMA,
    DEFAULT_RATIO,
    AllocationConfig,
    BudgetSpec,
    ProfileSchedule,
    allocate,
    compression_ratio_keeping,
    normalize_scores,
)
from ripplekv.allocation.cake import CakeRule
from ripplekv.allocation.dynamickv import DynamicKVRule, dynamickv_layer_statistic
from ripplekv.allocation.lava import LavaRule, lava_layer_statistic
from ripplekv.allocation.per_prompt import (
    PerPromptSchedule,
    TokenStatistic,
    check_rule_call,
    fill_shares,
    layer_floor,
    top_k_counts,
)
from ripplekv.allocation.schedules import PyramidSchedule, UniformSchedule
from ripplekv.allocation.squeezeattention import (
    DEFAULT_SQUEEZE_P,
    SqueezeAttentionRule,
    kmeans_1d,
    squeeze_groups,
    squeeze_statistic_of_similarities,
    squeeze_token_similarities,
)
from ripplekv.inference.generate import extend, prefill
from ripplekv.locking import WriterBusyError
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.presses.registry import DEFAULT_WINDOW
from ripplekv.profiling import sensitivity
from ripplekv.profiling.calibration import CalibrationSample
from ripplekv.profiling.checkpoint import Checkpoint, SampleScores
from ripplekv.profiling.profile import ProfileError, SensitivityProfile
from ripplekv.profiling.sensitivity import ProfilingConfig
from ripplekv_eval.fastpath.fidelity import ROW_BLOCK, Fidelity, fidelity, row_blocks, teacher_forced_logprobs
from ripplekv_eval.reporting import stats
from ripplekv_eval.running.budget_rows import row_budget
from tests.conftest import VOCAB, random_ids, tiny_model

# ------------------------------------------------------------------------------------------------ checkpoint

ONE = SampleScores(kl=(0.1, 0.2), local=(0.3, 0.4), context_tokens=5, continuation_tokens=2)


def test_sample_scores_are_frozen_and_hashable() -> None:
    """Kills ``@dataclass(frozen=False)`` on :class:`SampleScores`."""
    assert hash(ONE) == hash(dataclasses.replace(ONE))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ONE.kl = ()  # type: ignore[misc]


def test_a_checkpoint_in_a_new_folder_is_created(tmp_path: Path) -> None:
    """Kills ``mkdir(parents=False)``."""
    path = tmp_path / "a" / "b" / "run.partial.jsonl"
    Checkpoint(path, {"k": 1}).add(0, ONE)
    assert Checkpoint(path, {"k": 1}).done == {0: ONE}


def test_nothing_after_an_unreadable_line_is_trusted(tmp_path: Path) -> None:
    """A resumed run appends after a cut line, so that line and every later one are redone, not read. Kills
    ``break -> continue`` at the unreadable line."""
    path = tmp_path / "run.jsonl"
    first = Checkpoint(path, {"k": 1})
    first.add(0, ONE)
    with path.open("a") as f:
        f.write('{"sample": 1, "kl": [0.1\n')
    first.add(2, ONE)
    first.close()
    assert Checkpoint(path, {"k": 1}).done.keys() == {0}


def test_the_warning_names_a_setting_only_one_run_has(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A key that gained a field (``precision``) is named among the differences. Kills ``set(header) & set(key)``
    for ``|``."""
    path = tmp_path / "run.jsonl"
    Checkpoint(path, {"seed": 0}).add(0, ONE)
    with caplog.at_level(logging.WARNING, logger="ripplekv.profiling.checkpoint"):
        assert Checkpoint(path, {"seed": 0, "precision": "model"}).done == {}
    assert "(precision differ)" in caplog.text


# ------------------------------------------------------------------------------------------------ allocation


def test_default_ratio_and_gamma_are_the_documented_ones() -> None:
    """``--ratio`` 4.0 and ``--gamma`` 3.0 (docs/cli.md). Kills ``DEFAULT_RATIO = 5.0``, ``DEFAULT_GAMMA = 4.0``."""
    assert (DEFAULT_RATIO, DEFAULT_GAMMA) == (4.0, 3.0)
    assert AllocationConfig() == AllocationConfig(ratio=4.0, gamma=3.0)


def test_allocate_keeps_one_token_per_layer_by_default() -> None:
    """Kills ``floor: int = 2`` in :func:`allocate`."""
    scores, steep = [0.0, 1.0, 2.0, 3.0], AllocationConfig(ratio=1000.0, gamma=1000.0)
    default = allocate(scores, tokens=1, prompt_tokens=100, config=steep)
    assert default.budgets == allocate(scores, 100, 1, tokens=1, config=steep).budgets
    assert default.budgets == (1, 1, 1, 1)
    assert allocate(scores, 100, 0, tokens=1, config=steep).budgets == (0, 0, 0, 4)


def test_allocation_is_frozen() -> None:
    """Kills ``@dataclass(frozen=False)`` on :class:`Allocation`."""
    result = allocate([0.0, 1.0], 10, budget=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.total = 0  # type: ignore[misc]


def test_compression_ratio_keeping_names_a_bad_prompt_length() -> None:
    """Kills ``or -> and`` in the ``prompt_tokens`` check of :func:`compression_ratio_keeping`."""
    with pytest.raises(ValueError, match="prompt_tokens must be an integer >= 1, got 0"):
        compression_ratio_keeping(1, 0)


def test_rounding_ties_go_to_the_less_sensitive_layer_when_ratio_is_below_one() -> None:
    """Equal clipped weights, one leftover token short for three layers: with ``ratio < 1`` the lower scores win it
    (the mirror of ``ratio > 1``). Kills ``-array -> array`` in the tie-breaking preference."""
    scores = [0.0, 0.5, 0.9, 1.0]
    below = allocate(scores, 100, tokens=2, config=AllocationConfig(ratio=0.01, gamma=2.0))
    above = allocate(scores, 100, tokens=2, config=AllocationConfig(ratio=100.0, gamma=2.0))
    assert below.weights == (1.0, 0.5, 0.5, 0.5) and below.budgets == (3, 2, 2, 1)
    assert above.weights == (1.0, 2.0, 2.0, 2.0) and above.budgets == (1, 2, 2, 3)


def test_budget_spec_kind_and_immutability() -> None:
    """Kills ``@dataclass(frozen=False)``."""
    assert hash(BudgetSpec(budget=0.5)) == hash(BudgetSpec(budget=0.5))
    with pytest.raises(dataclasses.FrozenInstanceError):
        BudgetSpec(budget=0.5).budget = 0.2  # type: ignore[misc]


def test_huge_scores_normalise_without_overflow() -> None:
    """A span that overflows is halved first: the middle score keeps its place. Kills ``array * 2`` for
    ``array / 2`` in that branch."""
    assert normalize_scores([-1e308, 1e307, 1e308]) == pytest.approx([0.0, 0.55, 1.0], rel=1e-12)


def test_a_row_value_of_zero_is_refused_as_a_row_value() -> None:
    """Kills ``float(value) < 0`` for ``<= 0`` in :func:`row_budget` (0 then fails later, as a fraction)."""
    with pytest.raises(ValueError, match="a budget value is a kept fraction in"):
        row_budget(0.0)


# ------------------------------------------------------------------------------------------------ profile


def _profile(**changes: Any) -> SensitivityProfile:
    fields = {
        "model": {"num_hidden_layers": 1, "config_hash": "h"},
        "scores": (0.5,),
        "sample_scores": ((0.5,),),
        "local_scores": (0.1,),
        "alpha": 0.5,
        "repeats": 1,
        "seed": 0,
        "calibration": {},
        "library_version": "0",
        "created": "now",
    }
    return SensitivityProfile(**{**fields, **changes})


def test_a_profile_needs_at_least_one_layer() -> None:
    """A one-layer profile is valid; zero layers or a count that is not an integer are refused with the identity's
    message. Kills ``or -> and``, ``< -> <=`` and ``1 -> 2`` in the ``num_hidden_layers`` check."""
    assert _profile().num_layers == 1
    for bad in (0, "1", None):
        with pytest.raises(ProfileError, match="lacks num_hidden_layers"):
            _profile(model={"num_hidden_layers": bad, "config_hash": "h"}, scores=(), sample_scores=(), local_scores=())


def test_a_profile_is_frozen() -> None:
    """Kills ``@dataclass(frozen=False)`` on :class:`SensitivityProfile`."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        _profile().seed = 1  # type: ignore[misc]


def test_a_profile_is_saved_as_indented_strict_json_in_a_new_folder(tmp_path: Path) -> None:
    """The file is ``json.dumps(profile, indent=2)`` and a line end, in a folder made for it; a value JSON cannot
    hold (NaN in ``extra``) refuses to save and leaves no file behind. Kills ``parents=False``, ``indent=3`` and
    ``allow_nan=True`` in :func:`write_json_atomic`."""
    profile = _profile(extra={"note": [1, 2]})
    path = profile.save(tmp_path / "new" / "folder" / "p.json")
    assert path.read_text() == json.dumps(profile.to_dict(), indent=2) + "\n"
    with pytest.raises(ValueError, match="JSON compliant"):
        _profile(extra={"bad": math.nan}).save(tmp_path / "nan.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]


# ------------------------------------------------------------------------------------------------ fidelity


def test_fidelity_refuses_what_is_not_a_matrix_of_log_probabilities() -> None:
    """A list or a one-dimensional tensor is refused as such (not by a later error). Kills ``or -> and`` in
    :func:`~ripplekv_eval.fastpath.fidelity._check_logprobs`."""
    rows = torch.zeros(2, 3, dtype=torch.float64)
    for bad in ([[0.0, 0.0, 0.0]] * 2, torch.zeros(3, dtype=torch.float64)):
        with pytest.raises(ValueError, match=r"must be a \(positions, vocab\) tensor"):
            fidelity(bad, rows, [0, 1])  # type: ignore[arg-type]


def test_a_fidelity_is_frozen() -> None:
    """Kills ``@dataclass(frozen=False)`` on :class:`Fidelity`."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        Fidelity(kl=0.0, top1=1.0, positions=1).kl = 1.0  # type: ignore[misc]


def test_teacher_forcing_two_tokens_runs_the_second_position() -> None:
    """Two forced tokens give two rows, the second the model's distribution after the first. Kills
    ``len(ids) > 2`` for ``> 1``."""
    model = enable_varlen_attention(tiny_model("llama", layers=2))
    state = prefill(model, random_ids(12, seed=1))
    rows = teacher_forced_logprobs(model, state, [5, 7])
    after = extend(model, state, torch.tensor([[5]]))
    assert rows.shape == (2, VOCAB)
    torch.testing.assert_close(rows[1], torch.log_softmax(after.next_logits.double(), dim=-1), atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------------ statistics


def test_the_levels_and_resamples_are_the_documented_ones() -> None:
    """95% intervals, level 0.05, 4000 resamples (docs/cli.md, docs/results.md). Kills ``ALPHA = 1.05`` and
    ``DEFAULT_RESAMPLES = 4001``."""
    assert (stats.CONFIDENCE, stats.ALPHA, stats.DEFAULT_RESAMPLES) == (0.95, 0.05, 4000)
    assert stats.Bootstrap().resamples == 4000


def test_settle_marks_significant_below_the_level_only() -> None:
    """A comparison is not significant until :func:`settle` says so, and then exactly when ``p_holm < 0.05``.
    Kills ``significant: bool = True`` and ``ALPHA`` changed."""
    estimate = stats.Estimate(mean=0.0, low=-1.0, high=1.0, samples=4, tasks=1)
    unsettled = stats.Comparison("a", "b", estimate, wins=1, ties=0, losses=1, p=0.01)
    assert not unsettled.significant and unsettled.vectors == 0 and math.isnan(unsettled.p_holm)
    low, high = stats.settle([unsettled, dataclasses.replace(unsettled, other="c", p=0.049)])
    assert (low.p_holm, high.p_holm) == (0.02, 0.049) and low.significant and high.significant
    (alone,) = stats.settle([dataclasses.replace(unsettled, p=0.05)])
    assert not alone.significant


def test_metric_validation_and_format_at_their_bounds() -> None:
    """Kills ``or -> and`` in the scale check (an infinite scale), ``decimals <= 0``, ``sign: bool = True``, and
    ``and`` for ``or`` in the missing-value check."""
    assert stats.Metric("m", True, 1.0, 0, "d").fmt(2.4) == "2"
    for scale in (math.inf, 0.0, -1.0):
        with pytest.raises(ValueError, match="scale"):
            stats.Metric("m", True, scale, 2, "d")
    with pytest.raises(ValueError, match="decimals"):
        stats.Metric("m", True, 1.0, -1, "d")
    metric = stats.Metric("m", True, 1.0, 2, "d")
    assert metric.fmt(1.5) == "1.50" and metric.fmt(1.5, sign=True) == "+1.50"
    assert metric.fmt(None) == "nan" and metric.fmt(math.nan) == "nan"
    with pytest.raises(dataclasses.FrozenInstanceError):
        metric.decimals = 3  # type: ignore[misc]


def test_the_metrics_of_the_results_contract() -> None:
    """Direction, scale and decimals of every reported metric. Kills any of them changed in :data:`METRICS`."""
    table = {name: (m.higher_is_better, m.scale, m.decimals) for name, m in stats.METRICS.items()}
    assert table == {
        "score": (True, 100.0, 2),
        "fidelity_kl": (False, 1.0, 4),
        "top1_agreement": (True, 1.0, 3),
        "gold_nll_delta": (False, 1.0, 4),
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.Estimate(mean=0.0, low=0.0, high=0.0, samples=1, tasks=1).mean = 1.0  # type: ignore[misc]


def test_bootstrap_defaults_and_bounds() -> None:
    """Seed 0; a confidence of 0 is refused; a task of one sample (or of equal values) adds a constant, so with
    nothing else the interval is the point, and next to a varying task it shifts that task's interval by its share.
    Kills ``seed: int = 1``, ``0.0 <= confidence``, ``> 0`` for ``== 0`` in the constant tasks and a constant
    dropped from the macro mean."""
    assert stats.Bootstrap().seed == 0
    with pytest.raises(ValueError, match="confidence"):
        stats.Bootstrap(confidence=0.0)
    bootstrap = stats.Bootstrap(2000)
    constant = bootstrap.estimate({"t": {"only": 3.0}, "u": {"a": 1.0, "b": 1.0}})
    assert (constant.mean, constant.low, constant.high, constant.samples, constant.tasks) == (2.0, 2.0, 2.0, 3, 2)
    varying = {"v": {str(i): float(i * i) for i in range(9)}}
    alone = bootstrap.estimate(varying)
    beside, higher = (bootstrap.estimate(varying | {"t": {"only": c}}) for c in (3.0, 103.0))
    assert beside.mean == (alone.mean + 3.0) / 2 and alone.low < alone.mean < alone.high
    assert beside.low < beside.mean < beside.high
    assert (higher.low - beside.low, higher.high - beside.high) == pytest.approx((50.0, 50.0), rel=1e-9)
    with pytest.raises(ValueError, match="no samples"):
        bootstrap.estimate({"t": {}})


def test_estimate_excludes_zero_strictly() -> None:
    """An interval touching 0 does not exclude it. Kills ``>=``/``<=`` and ``high < 1`` in ``excludes_zero``."""
    make = lambda low, high: stats.Estimate(mean=0.0, low=low, high=high, samples=2, tasks=1)  # noqa: E731
    assert make(1e-9, 1.0).excludes_zero() and make(-1.0, -1e-9).excludes_zero()
    assert not make(0.0, 1.0).excludes_zero() and not make(-1.0, 0.0).excludes_zero()
    assert not make(-1.0, 0.5).excludes_zero()


def test_collect_skips_missing_values_and_refuses_bad_ones() -> None:
    """A null value is skipped without ending the rows; booleans, strings and infinities are refused. Kills
    ``continue -> break`` and ``or -> and`` in :func:`collect`."""
    metric = stats.METRICS["fidelity_kl"]
    rows = [
        {"sample_id": "a", "method": "m", "budget": 0.1, "fidelity_kl": None},
        {"sample_id": "b", "method": "m", "budget": 0.1, "fidelity_kl": 0.5},
    ]
    assert stats.collect(rows, metric, lambda row: "t") == {("m", 0.1): {"t": {"b": 0.5}}}
    for bad in (True, "0.5", math.inf):
        with pytest.raises(ValueError, match="must be a finite number"):
            stats.collect([{**rows[1], "fidelity_kl": bad}], metric, lambda row: "t")


def test_paired_differences_tie_at_the_relative_tolerance() -> None:
    """A difference of exactly ``1e-12 x max(1, |x|, |y|)`` is a tie, one just above it is not, and the tolerance
    grows with the values. Kills ``<`` for ``<=``, ``/`` for ``*`` and ``max(2.0, ...)``."""

    def diff(x: float, y: float) -> float:
        return stats.paired_differences({"t": {"s": x}}, {"t": {"s": y}})["t"]["s"]

    assert stats.TIE_TOLERANCE == 1e-12
    assert diff(1e-12, 0.0) == 0.0
    assert diff(1.5e-12, 0.0) == 1.5e-12
    assert diff(1e6, 1e6 + 1e-7) == 0.0
    assert diff(3.0, 1.0) == 2.0


def test_metric_format_of_infinities() -> None:
    """Kills ``value >= 0`` (and ``> 1``) in the infinite branch of :meth:`Metric.fmt`."""
    metric = stats.METRICS["fidelity_kl"]
    assert (metric.fmt(math.inf), metric.fmt(math.inf, sign=True), metric.fmt(-math.inf)) == ("inf", "+inf", "-inf")


def test_a_reversed_comparison_is_the_negated_one() -> None:
    """SnapKV's best other method is the method compared with SnapKV: the same pair negated (difference and
    interval), with wins and losses swapped; a method without rows at a budget is left out there. Kills
    ``low=e.high`` in :func:`_negated`, ``or`` for ``and`` in the methods present, and a mutable
    :class:`Comparison` or :class:`MetricStats`."""
    metric = stats.METRICS["fidelity_kl"]
    x = {"t": {str(i): 0.1 * i for i in range(6)}}
    y = {"t": {str(i): 0.1 * i + 0.05 * (i % 3) + 0.01 for i in range(6)}}
    values = {("ripplekv", 0.2): x, ("snapkv", 0.2): y, ("adakv", 0.3): y}
    result = stats.analyse_metric(metric, values, ["ripplekv", "snapkv", "adakv"], [0.2], stats.Bootstrap(2000))
    forward = result.versus[0.2]["ripplekv"]["baseline"]
    back = result.versus[0.2]["snapkv"]["best_other"]
    a, b = forward.difference, back.difference
    assert (b.mean, b.low, b.high) == (-a.mean, -a.high, -a.low) and a.low != -a.high
    assert (back.wins, back.losses) == (forward.losses, forward.wins) and back.p == forward.p
    assert set(result.versus[0.2]) == {"ripplekv", "snapkv"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        forward.p = 0.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.family = "all"  # type: ignore[misc]


def test_sign_flip_bounds_and_defaults() -> None:
    """Seed 0; ``exact_max`` up to 20; a confidence of 0 refused; one prompt is testable; ``exact_max`` prompts are
    enumerated exactly. Kills ``seed: int = 1``, ``exact_max >= 20`` and ``> 21``, ``0.0 <= confidence``,
    ``n == 1`` for ``n == 0`` and ``n < exact_max``."""
    assert stats.SignFlip().seed == 0
    assert stats.SignFlip(exact_max=20).exact_max == 20
    with pytest.raises(ValueError, match="at most 20"):
        stats.SignFlip(exact_max=21)
    with pytest.raises(ValueError, match="confidence"):
        stats.SignFlip(confidence=0.0)
    (one,) = stats.SignFlip().test([{"t": {"a": 1.0}}])
    assert (one.p, one.vectors, one.method) == (1.0, 2, "exact")
    (three,) = stats.SignFlip(draws=999, exact_max=3).test([{"t": {"a": 1.0, "b": 2.0, "c": 3.0}}])
    assert (three.method, three.vectors, three.p) == ("exact", 8, 0.25)


def test_flip_test_is_frozen_and_excludes_zero_strictly() -> None:
    """Kills ``@dataclass(frozen=False)`` on :class:`FlipTest` and ``>=``/``<=`` in its ``excludes_zero``."""
    make = lambda low, high: stats.FlipTest(0.0, low, high, 1.0, "exact", 2, 1, 1)  # noqa: E731
    assert make(1e-9, 1.0).excludes_zero() and make(-1.0, -1e-9).excludes_zero()
    assert not make(0.0, 1.0).excludes_zero() and not make(-1.0, 0.0).excludes_zero()
    with pytest.raises(dataclasses.FrozenInstanceError):
        make(0.0, 1.0).p = 0.0  # type: ignore[misc]


def test_sign_flip_interval_at_extreme_levels() -> None:
    """A level so strict that no shift can be rejected (scipy's +1 alone reaches it) gives the whole line, and so
    does any level over one prompt (its two vectors tie at every shift). Kills ``need == 0`` left out of the whole
    line and ``max(2, ...)`` for the vectors of one prompt."""
    prompts = {"t": {str(i): 1.0 + i for i in range(20)}}  # no random vector is all-equal
    (strict,) = stats.SignFlip(draws=999, confidence=0.9999, exact_max=0).test([prompts])
    assert (strict.low, strict.high) == (-math.inf, math.inf) and strict.method == "monte-carlo"
    (loose,) = stats.SignFlip(confidence=0.3).test([{"t": {"a": 1.0}}])
    assert (loose.low, loose.high) == (-math.inf, math.inf)


def test_holm_accepts_the_bounds_of_a_p_value() -> None:
    """Kills ``0.0 < v`` for ``0.0 <= v``."""
    assert stats.holm([0.0, 1.0]) == [0.0, 1.0]
    with pytest.raises(ValueError, match="p-values"):
        stats.holm([math.nextafter(0.0, -1.0)])


# ------------------------------------------------------------------------------------------------ sensitivity


def test_profiling_defaults_are_the_documented_ones() -> None:
    """alpha 0.5, 32 answer tokens (docs/cli.md), scoring version 3 (bump it, and this test, when the arithmetic
    of a score changes: it keys every checkpoint). Kills each of those constants changed."""
    assert (sensitivity.DEFAULT_ALPHA, sensitivity.DEFAULT_ANSWER_TOKENS, sensitivity.SCORING_VERSION) == (0.5, 32, 3)
    config = ProfilingConfig()
    assert (config.alpha, config.answer_tokens) == (0.5, 32)


def test_score_sample_defaults_to_sample_zero_and_checks_its_shapes() -> None:
    """Kills ``sample_index: int = 1`` and ``and`` for ``or`` in both shape checks of :func:`score_sample`."""
    model = tiny_model("llama", layers=2)
    context, continuation, config = random_ids(10, seed=2), random_ids(3, seed=3), ProfilingConfig()
    assert sensitivity.score_sample(model, context, continuation, config) == sensitivity.score_sample(
        model, context, continuation, config, sample_index=0
    )
    for bad_context, bad_continuation in (
        (torch.cat([context, context]), continuation),  # two rows
        (context[0], continuation),  # one dimension
        (context, continuation[0]),
    ):
        with pytest.raises(ValueError, match="one sample"):
            sensitivity.score_sample(model, bad_context, bad_continuation, config)
    for bad_context, bad_continuation in ((context[:, :0], continuation), (context, continuation[:, :0])):
        with pytest.raises(ValueError, match="at least one token"):
            sensitivity.score_sample(model, bad_context, bad_continuation, config)


def test_a_continuation_cap_is_ignored_for_the_models_own_answers() -> None:
    """Kills ``or`` for ``and`` in the cap of :func:`calibration_ids` (None cannot be cut)."""

    class Chars:
        def __call__(self, text: str, add_special_tokens: bool = False, return_tensors: str | None = None) -> dict:
            return {"input_ids": torch.tensor([[min(ord(c), 255) for c in text]])}

    sample = CalibrationSample(context="a context", continuation="and more", question=" why?")
    config = ProfilingConfig(continuation="model", max_continuation_tokens=2)
    context_ids, continuation_ids = sensitivity.calibration_ids(tiny_model("llama", layers=2), Chars(), sample, config)
    assert continuation_ids is None and context_ids.shape == (1, len("a context why?"))


def test_one_token_contexts_and_continuations_are_scored() -> None:
    """Kills ``<= 1`` for ``< 1`` (and ``< 2``) in the length check of :func:`score_sample`."""
    model = tiny_model("llama", layers=2)
    scores = sensitivity.score_sample(model, random_ids(1, seed=4), random_ids(1, seed=5), ProfilingConfig())
    assert (scores.context_tokens, scores.continuation_tokens) == (1, 1) and len(scores.kl) == 2


def test_a_model_without_a_position_limit_keeps_its_context_whole() -> None:
    """Kills ``or`` for ``and`` in the cut of :func:`calibration_ids` (no limit: nothing to compare with), and a
    mutable :class:`ProfilingConfig`."""
    model = tiny_model("llama", layers=2)
    model.config.max_position_embeddings = None
    sample = CalibrationSample(context="x" * 50, continuation="yz")
    context_ids, continuation_ids = sensitivity.calibration_ids(model, _Chars(), sample, ProfilingConfig())
    assert context_ids.shape == (1, 50) and continuation_ids.shape == (1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ProfilingConfig().seed = 1  # type: ignore[misc]


class _Chars:
    """One token per character; with special tokens, a BOS id 1 first (as real tokenizers add one)."""

    def __call__(self, text: str, add_special_tokens: bool = True, return_tensors: str | None = None) -> dict:
        ids = ([1] if add_special_tokens else []) + [min(ord(c), 255) for c in text]
        return {"input_ids": torch.tensor([ids])}


def test_calibration_text_is_tokenized_without_special_tokens() -> None:
    """Kills ``add_special_tokens=True`` in :func:`calibration_ids`."""
    sample = CalibrationSample(context="abc", continuation="de")
    ids = sensitivity.calibration_ids(tiny_model("llama", layers=2), _Chars(), sample, ProfilingConfig())
    assert [t.tolist() for t in ids] == [[[97, 98, 99]], [[100, 101]]]


def test_the_models_own_answer_bans_its_stop_ids_at_the_first_token_only() -> None:
    """Stop ids 0 (the first argmax) and ``vocab`` (outside the vocabulary, ignored) at the first step; the last
    token is not run into the cache. Kills ``0 < i`` / ``1 <= i`` and ``i <= vocab`` in the banned ids and
    ``max_tokens + 1`` for the last step."""
    model = tiny_model("llama", layers=2)
    model.generation_config.eos_token_id = [0, VOCAB]
    logits = torch.zeros(1, VOCAB)
    logits[0, 0], logits[0, 7] = 5.0, 4.0  # the argmax is stop id 0, then 7
    prompt = random_ids(6, seed=6)
    cache = DynamicCache()
    model(prompt, past_key_values=cache, use_cache=True)
    answer = sensitivity.greedy_continuation(model, cache, logits, 6, max_tokens=3)
    assert answer[0, 0].item() == 7 and 1 <= answer.shape[1] <= 3
    assert cache.get_seq_length() == 6 + answer.shape[1] - 1


# ------------------------------------------------------------------------------------------------ schedules


def test_a_schedule_over_layers_takes_exactly_the_increasing_subsequences() -> None:
    """Kills ``and`` for ``or`` in both checks of the compressed layers, ``>`` for ``>=`` at the last layer,
    ``layers[0] < 1``, and ``layers[1]`` / ``layers[-2]`` for ``layers[-1]``."""
    schedule = UniformSchedule(budget=0.5)
    assert schedule.over_layers([0, 3], 4) is schedule and schedule.over_layers([1, 2], 4) is schedule
    for bad in ([], [2, 1], [0.5], [-1, 0], [0, 4], [0, 1, 4]):
        with pytest.raises(ValueError, match="compressed layers"):
            schedule.over_layers(bad, 4)


def test_schedule_defaults_and_keyword_only_tokens() -> None:
    """PyramidKV's window is SnapKV's (64); ``tokens`` is keyword only; schedules are frozen. Kills
    ``window_size: int = 65``, ``kw_only=False`` and a mutable :class:`UniformSchedule`."""
    assert PyramidSchedule(budget=0.1).window_size == DEFAULT_WINDOW == 64
    with pytest.raises(TypeError):
        PyramidSchedule(None, 64, 20, 512)  # type: ignore[misc]
    with pytest.raises(TypeError):
        ProfileSchedule(None, (1.0,), 4.0, 3.0, 512)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        UniformSchedule(budget=0.5).budget = 0.2  # type: ignore[misc]


def test_cake_spends_a_single_spare_token_by_preference() -> None:
    """One token beyond the windows goes to the preferred layer, not to the first. Kills ``spare <= 1`` for
    ``<= 0``, and a mutable :class:`CakeRule`."""
    assert CakeRule().layer_budgets(2, 100, 0, stats=[(0.0, 1.0), (1.0, 1.0)], total=9, window_size=4) == (4, 5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        CakeRule().tau1 = 2.0  # type: ignore[misc]


def test_rule_calls_refuse_no_layers_and_fractional_layers() -> None:
    """Kills ``and`` for ``or`` in the check of ``n_layers`` (an integer 0 and a fraction 1.5 each fail one side)."""
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="n_layers"):
            check_rule_call(bad, 10, 0, stats=[], total=0, window_size=0)  # type: ignore[arg-type]


def test_fill_shares_moves_the_constant_entries_only_past_the_moving_ones_bounds() -> None:
    """A moving entry (slope 1) takes what the constant one (offset 5 or 3) leaves while that fits its bounds;
    below its floor (3 + 5 > 4) it sits at the floor and the constant entry gives up the rest, 4 - 3 = 1. Kills
    ``fixed_sum - sum(lows)`` for ``+`` in the reachable bottom (the level search would return shares summing to
    8)."""
    assert fill_shares([0, 0], [1, 0], [0, 0], [10, 10], 5) == [5, 0]
    assert fill_shares([0, 3], [1, 0], [0, 0], [10, 10], 12) == [9, 3]
    assert fill_shares([0, 5], [1, 0], [3, 0], [10, 10], 4) == [3, 1]


def test_squeeze_statistic_of_two_parts_is_the_mean_over_both() -> None:
    """Two chunks of a prompt: one mean over all their tokens, (1 + 2 + 6) / 3 = 3, not the first chunk's 1.5
    (nor the mean of means, 3.75). Kills ``len(parts) == 2`` for ``== 1``."""
    parts = [torch.tensor([[1.0, 2.0]], dtype=torch.float64), torch.tensor([[6.0]], dtype=torch.float64)]
    assert squeeze_statistic_of_similarities(parts).similarity == 3.0
    assert squeeze_statistic_of_similarities(parts[:1]).similarity == 1.5


def test_squeeze_rule_takes_negative_similarities() -> None:
    """A cosine similarity may be negative (a layer whose attention output opposes its input). Kills
    ``nonnegative=True`` for ``False`` in the rule's check of the similarities."""
    sims = [(-0.5,), (-0.4,), (0.1,), (0.9,), (0.95,), (0.99,)]
    budgets = SqueezeAttentionRule(p=0.5).layer_budgets(6, 100, 0, stats=sims, total=120, window_size=0)
    assert budgets == (30, 30, 30, 10, 10, 10)


def test_dynamickv_statistic_refuses_a_2d_or_empty_tensor() -> None:
    """Kills ``and`` for ``or`` in the shape check: a 2-D tensor and an empty 3-D one each fail one side."""
    with pytest.raises(ValueError, match="non-empty"):
        dynamickv_layer_statistic(torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="non-empty"):
        dynamickv_layer_statistic(torch.ones(1, 2, 0, dtype=torch.float64))


def test_global_topk_of_one_entry_counts_it() -> None:
    """The single highest entry of all layers belongs to layer 1. Kills ``k <= 1`` for ``k <= 0``."""
    assert top_k_counts([np.array([1.0, 2.0]), np.array([3.0])], 1) == (0, 1)


def test_lava_spends_a_single_spare_token_by_entropy() -> None:
    """One token beyond the windows goes to the layer of higher entropy, not to the first. Kills ``spare <= 1``
    for ``<= 0``."""
    assert LavaRule().layer_budgets(2, 100, 0, stats=[(0.1,), (0.9,)], total=9, window_size=4) == (4, 5)


def test_the_questions_digest_of_a_checkpoint_key_is_stable() -> None:
    """The key of a profiling run with the model's own answers holds a digest of the questions, each prefixed by
    its UTF-8 length in 8 little-endian bytes: checkpoints written by earlier versions must keep resuming. Kills
    any other width of the length prefix."""
    import hashlib

    from ripplekv.profiling.calibration import CalibrationSet

    samples = (
        CalibrationSample(context="a b c", continuation="d", question="Who?"),
        CalibrationSample(context="e f g", continuation="h", question="Où ça ?"),
    )
    expected = hashlib.sha256()
    for question in ("Who?", "Où ça ?"):
        data = question.encode("utf-8")
        expected.update(len(data).to_bytes(8, "little") + data)
    assert CalibrationSet(samples, "two questions").sha256(("question",)) == expected.hexdigest()


def test_row_blocks_tile_the_rows_with_no_lone_row() -> None:
    """Blocks of ``ROW_BLOCK`` rows, in order and without gaps or overlaps, a lone last row merged into the block
    before it and nothing else merged. Kills ``== 2`` for ``== 1`` (a full last block merged) and ``blocks[2:]``
    for ``blocks[-2:]`` (overlapping blocks)."""
    assert ROW_BLOCK == 2
    assert row_blocks(1) == [(0, 1)] and row_blocks(2) == [(0, 2)]
    assert row_blocks(4) == [(0, 2), (2, 4)]
    assert row_blocks(5) == [(0, 2), (2, 5)]
    assert row_blocks(7) == [(0, 2), (2, 4), (4, 7)]
    for rows in range(2, 12):
        blocks = row_blocks(rows)
        assert blocks[0][0] == 0 and blocks[-1][1] == rows
        assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
        assert all(2 <= end - start <= ROW_BLOCK + 1 for start, end in blocks)


def test_dynamickv_update_with_nothing_to_select_still_reaches_the_last_update() -> None:
    """One spare token over 3 layers, updates after 2 layers and at the end: the first selects
    ``1 * 1 * 2 // 3 = 0`` tokens (no counts, no caps), the last selects the single highest entry (layer 0's 10).
    Kills ``break`` for the ``continue`` after an empty update (the counts would stay all zero)."""
    stats = [(np.array([10.0, 0.0]), 1), (np.array([5.0, 0.0]), 1), (np.array([1.0, 1.0]), 1)]
    assert DynamicKVRule(update_interval=2).progressive_caps(stats, 3, 1, 10) == ((10, 10, 10), (1, 0, 0))


def test_rule_calls_refuse_an_empty_or_fractional_prompt() -> None:
    """A prompt of 0 tokens (an integer) and of 1.5 tokens (a fraction) each fail one side of the check of
    ``prompt_tokens``. Kills ``and`` for ``or`` in :func:`check_rule_call`."""
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="prompt_tokens"):
            check_rule_call(1, bad, 0, stats=[()], total=0, window_size=0)  # type: ignore[arg-type]


def test_squeeze_rule_squeezes_the_higher_of_two_clusters() -> None:
    """Two distinct similarities make two clusters (fewer than the 3 asked for): the higher one is class 3, at
    ``p`` of the average, the other takes ``(L - m p) / (L - m) = 3 / 2`` of it. Kills ``len(centres) <= 2`` for
    ``< 2`` in :func:`squeeze_groups`."""
    assert squeeze_groups([0.1, 0.1, 0.9, 0.9]) == (False, False, True, True)
    assert squeeze_groups([0.1, 0.9], n_clusters=2) == (False, True)
    sims = [(0.1,), (0.1,), (0.9,), (0.9,)]
    assert SqueezeAttentionRule(p=0.5).layer_budgets(4, 100, 0, stats=sims, total=160, window_size=0) == (
        60,
        60,
        20,
        20,
    )


def test_squeeze_rule_squeezes_a_class_3_of_one_layer() -> None:
    """Three distinct similarities, one per cluster: the single layer of class 3 gets ``p`` of the average and the
    two others ``(3 - p) / 2`` each. Kills ``m == 1`` for ``m == 0`` in :meth:`SqueezeAttentionRule.weights` (it
    would hand out uniform budgets)."""
    rule = SqueezeAttentionRule(p=0.5)
    assert rule.weights([0.1, 0.5, 0.9]) == (Fraction(5, 4), Fraction(5, 4), Fraction(1, 2))
    assert rule.layer_budgets(3, 100, 0, stats=[(0.1,), (0.5,), (0.9,)], total=120, window_size=0) == (50, 50, 20)


def test_dynamickv_rule_refuses_empty_or_non_finite_scores() -> None:
    """A layer with no score and a layer with a NaN score are each refused (each fails one side of the check, the
    other layer valid). Kills ``and`` for ``or`` in the check of a layer's scores."""
    good = (np.array([1.0, 2.0]), 1)
    for bad in (np.array([]), np.array([1.0, np.nan]), np.array([np.inf])):
        with pytest.raises(ValueError, match="non-empty array of finite values"):
            DynamicKVRule().progressive_caps([good, (bad, 1)], 2, 4, 10)


def test_a_lava_rule_is_frozen() -> None:
    """A rule's settings cannot change after it is made, like every other rule's. Kills ``@dataclass(frozen=False)``
    on :class:`LavaRule`."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        LavaRule().kernel_size = 5  # type: ignore[misc]


def test_rule_calls_refuse_a_fractional_or_out_of_range_total() -> None:
    """A total of 1.5 tokens (a fraction in range) and of -1 or 21 tokens (integers outside ``[0, 2 * 10]``) each
    fail one side of the check of ``total``; 0 and 20, its bounds, pass. Kills ``and`` for ``or``, ``1 <= total``
    and ``total < n_layers * prompt_tokens`` in :func:`check_rule_call`."""
    for good in (0, 20):
        check_rule_call(2, 10, 0, stats=[(), ()], total=good, window_size=0)
    for bad in (1.5, -1, 21):
        with pytest.raises(ValueError, match="total must be an integer"):
            check_rule_call(2, 10, 0, stats=[(), ()], total=bad, window_size=0)  # type: ignore[arg-type]


def test_dynamickv_defaults_cap_a_layer_at_10_times_the_average() -> None:
    """The defaults are the authors' Llama script's (module docstring: ``kernel_size = 7``, ``avgpool``,
    ``radio_max = 10``, updates every 4 layers). 12 layers, no window, 120 tokens: an average of 10; layer 0 holds
    every top score and keeps ``radio_max * 10 = 100`` tokens, the rest going to the layers no earlier update
    capped. Kills ``radio_max: float = 11.0``."""
    assert DynamicKVRule() == DynamicKVRule(kernel_size=7, pooling="avgpool", radio_max=10.0, update_interval=4)
    assert "``radio_max = 10``" in " ".join(dynamickv.__doc__.split())
    stats = [(np.linspace(2.0, 1.0, 200), 1)] + [(np.full(200, 0.5 - 0.01 * layer), 1) for layer in range(1, 12)]
    assert DynamicKVRule().layer_budgets(12, 1000, 0, stats=stats, total=120, window_size=0) == (
        100,
        *[0] * 7,
        5,
        5,
        5,
        5,
    )


def test_dynamickv_takes_a_radio_max_of_exactly_1_and_updates_after_every_layer() -> None:
    """``radio_max`` may be 1 (``>= 1``): every layer is then capped at the average, so the budgets are uniform
    whatever the scores; ``update_interval`` may be 1 (an update after every layer). Just below each bound is
    refused. Kills ``>`` for ``>=`` in :func:`check_positive` (``strict=False``) and ``check_int(..., 2)`` for
    ``update_interval``."""
    stats = [(np.linspace(2.0, 1.0, 200), 1)] + [(np.full(200, 0.5 - 0.01 * layer), 1) for layer in range(1, 12)]
    assert DynamicKVRule(radio_max=1.0).layer_budgets(12, 1000, 0, stats=stats, total=120, window_size=0) == (10,) * 12
    assert DynamicKVRule(update_interval=1).update_steps(3) == (1, 2, 3)
    for bad in ({"radio_max": math.nextafter(1.0, 0.0)}, {"update_interval": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            DynamicKVRule(**bad)  # type: ignore[arg-type]


def test_dynamickv_spends_a_single_spare_token_by_its_count() -> None:
    """One token beyond the windows (one head): the last update counts the single highest score, layer 1's,
    which takes the token, not the first layer as an even split would. Kills ``sum(counts) == 1`` for ``== 0``."""
    stats = [(np.array([1.0, 0.0]), 1), (np.array([5.0, 0.0]), 1)]
    assert DynamicKVRule().layer_budgets(2, 100, 0, stats=stats, total=9, window_size=4) == (4, 5)


def test_lava_statistic_refuses_a_tensor_of_the_wrong_rank_on_either_side() -> None:
    """A 3-D window attention with 4-D values, and 4-D attention with 3-D values, are each refused. Kills
    ``and`` for ``or`` in the rank check of :func:`lava_layer_statistic`."""
    attention, values = torch.full((1, 2, 3, 4), 0.25), torch.ones(1, 1, 7, 2)
    lava_layer_statistic(attention, values)
    for bad_attention, bad_values in ((attention[0], values), (attention, values[0])):
        with pytest.raises(ValueError, match="must be \\(batch, heads, window, prefix_keys\\)"):
            lava_layer_statistic(bad_attention, bad_values)


def test_lava_statistic_avgpool_counts_the_zero_padding() -> None:
    """With ``pooling="avgpool"`` the mean window attention ``(a, b, c)`` of one head is pooled to
    ``((a + b) / 3, (a + b + c) / 3, (b + c) / 3)`` (width 3, stride 1, zero padding counted), times the largest
    L1 norm of a prefix value (3 here: a later value token is not read); the statistic is the entropy of the
    normalised scores over ``log 3``. Runs the average pooling (no other test does) and kills ``stride=2``."""
    attention = torch.tensor([[[[0.1, 0.2, 0.7], [0.3, 0.4, 0.3]]]], dtype=torch.float64)  # (1, 1, 2, 3)
    values = torch.tensor([[[[1.0, -2.0], [0.5, 0.5], [0.0, 1.0], [9.0, 9.0]]]], dtype=torch.float64)
    a, b, c = 0.2, 0.3, 0.5
    scores = np.array([(a + b) / 3, (a + b + c) / 3, (b + c) / 3]) * 3.0
    p = scores / (scores.sum() + 1e-16)
    expected = float(-(p * np.log(p + 1e-16)).sum() / math.log(3))
    got = LavaRule(kernel_size=3, pooling="avgpool").layer_statistic(attention, values).entropy
    assert got == pytest.approx(expected, rel=1e-12)
    assert got != pytest.approx(LavaRule(kernel_size=3).layer_statistic(attention, values).entropy, rel=1e-6)


def test_rule_calls_refuse_a_negative_or_fractional_window_or_floor() -> None:
    """A window or floor of -1 (an integer) and of 1.5 (a fraction) each fail one side of their check; 0 passes.
    Kills ``and`` for ``or`` in the check of ``window`` and ``floor`` in :func:`check_rule_call`."""
    check_rule_call(1, 10, 0, stats=[()], total=5, window_size=0)
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match="window_size must be an integer"):
            check_rule_call(1, 10, 0, stats=[()], total=5, window_size=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="floor must be an integer"):
            check_rule_call(1, 10, bad, stats=[()], total=5, window_size=0)  # type: ignore[arg-type]


def test_fill_shares_refuses_no_entries_or_any_list_of_another_length() -> None:
    """No entries at all, and slopes, lows or highs one entry short, each fail on their own. Kills ``and`` for
    ``or`` in the length check of :func:`fill_shares`."""
    good = {"offsets": [0.0, 0.0], "slopes": [1.0, 1.0], "lows": [0, 0], "highs": [5, 5], "total": 4}
    assert fill_shares(**good) == [2, 2]
    bad_calls = [{**good, "offsets": [], "slopes": [], "lows": [], "highs": [], "total": 0}]
    bad_calls += [{**good, name: good[name][:1]} for name in ("slopes", "lows", "highs")]
    for bad in bad_calls:
        with pytest.raises(ValueError, match="equally long, non-empty"):
            fill_shares(**bad)


def test_fill_shares_refuses_a_non_finite_float_and_takes_any_fraction() -> None:
    """A NaN or infinite offset or slope is refused by the finiteness check itself (not by a later failure to
    make it a fraction). Kills ``isinstance(v, Fraction)`` for ``not isinstance(...)`` in that check."""
    for offsets, slopes in (([math.nan], [1.0]), ([0.0], [math.inf])):
        with pytest.raises(ValueError, match="finite offsets and slopes"):
            fill_shares(offsets, slopes, [0], [5], 3)


def test_an_infeasible_layer_floor_is_the_integer_average() -> None:
    """Two windows of 4 tokens exceed a total of 5: the floor is lowered to ``5 // 2 = 2``, an integer (not 2.5).
    Kills ``total / n_layers`` for ``//`` in :func:`layer_floor`."""
    floor = layer_floor(2, 100, 0, total=5, window_size=4)
    assert floor == 2 and isinstance(floor, int)
    assert layer_floor(2, 100, 0, total=8, window_size=4) == 4


def test_per_prompt_schedule_defaults_and_immutability() -> None:
    """The observation window defaults to SnapKV's (kvpress's 64, as the docstring says); a schedule, like the
    :class:`TokenStatistic` a press chunks a statistic with, cannot change after it is made; a per-prompt
    schedule is never flagged uniform (its layers keep different numbers of tokens). Kills ``window_size: int =
    65``, ``@dataclass(frozen=False)`` on both classes and ``uniform = True``."""
    schedule = PerPromptSchedule(CakeRule(), 0.5)
    assert schedule.window_size == DEFAULT_WINDOW == 64
    assert "SnapKV default is 64" in " ".join(PerPromptSchedule.__doc__.split())
    with pytest.raises(dataclasses.FrozenInstanceError):
        schedule.window_size = 32  # type: ignore[misc]
    statistic = TokenStatistic(whole=sum, per_token=list, reduce=sum)
    with pytest.raises(dataclasses.FrozenInstanceError):
        statistic.whole = max  # type: ignore[misc]
    assert not PerPromptSchedule.uniform
    sims = [(0.1,), (0.1,), (0.9,), (0.9,)]
    rule_schedule = PerPromptSchedule(SqueezeAttentionRule(p=0.5), tokens=40, window_size=0)
    assert rule_schedule.layer_budgets(4, 100, 0, stats=sims) == (60, 60, 20, 20)


def test_a_per_prompt_schedule_refuses_no_layers_and_fractional_layers() -> None:
    """An integer 0 and a fraction 1.5 each fail one side of the check of ``n_layers``. Kills ``and`` for ``or``
    in :meth:`PerPromptSchedule.check_layers`."""
    schedule = PerPromptSchedule(CakeRule(), 0.5)
    assert schedule.total(2, 10) == 10
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="n_layers must be an integer"):
            schedule.total(bad, 10)  # type: ignore[arg-type]


def test_squeeze_default_p_is_the_readmes_setting() -> None:
    """``p = 8 / 21``: the README's ``--KV_class3 0.08`` at ``--ini_size 0.21`` (module docstring), the rule's
    default. Kills ``8 / 22``."""
    assert DEFAULT_SQUEEZE_P == 8 / 21 == pytest.approx(0.08 / 0.21, rel=1e-12)
    assert "``p = 8 / 21``" in " ".join(squeezeattention.__doc__.split())
    assert SqueezeAttentionRule().p == DEFAULT_SQUEEZE_P


def test_squeeze_similarities_of_a_one_token_prompt() -> None:
    """One token is a prompt (its cosine is computed); no token is refused. Kills ``<= 1`` and ``< 2`` for ``< 1``
    in the token check of :func:`squeeze_token_similarities`."""
    residual = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    output = torch.tensor([[[0.0, 1.0]]], dtype=torch.float64)
    got = squeeze_token_similarities(residual, output)
    assert got.shape == (1, 1) and float(got) == pytest.approx(1 / math.sqrt(2), rel=1e-12)
    with pytest.raises(ValueError, match="no token"):
        squeeze_token_similarities(residual[:, :0], output[:, :0])


def test_squeeze_similarities_refuse_a_non_finite_input_or_output() -> None:
    """An infinite attention output (a finite residual, so only ``h_in + o`` is non-finite) and an infinite
    residual are each refused. Kills ``and`` for ``or`` in the finiteness check of
    :func:`squeeze_token_similarities`."""
    finite = torch.ones(1, 2, 3, dtype=torch.float64)
    infinite = finite.clone()
    infinite[0, 1, 2] = math.inf
    for residual, output in ((finite, infinite), (infinite, finite)):
        with pytest.raises(ValueError, match="must be finite"):
            squeeze_token_similarities(residual, output)


def test_kmeans_and_the_squeeze_rule_take_their_smallest_cluster_counts() -> None:
    """:func:`kmeans_1d` takes one cluster (``n_clusters >= 1``: every value in it, at their mean) and the rule two
    (``>= 2``: the higher of two clusters squeezed); one less is refused by each. Kills ``check_int(..., 2)`` in
    :func:`kmeans_1d` and ``check_int(..., 3)`` in :class:`SqueezeAttentionRule`."""
    assert kmeans_1d([1.0, 3.0, 8.0], 1) == ((0, 0, 0), (4.0,))
    with pytest.raises(ValueError, match="n_clusters"):
        kmeans_1d([1.0, 3.0], 0)
    rule = SqueezeAttentionRule(p=0.5, n_clusters=2)
    assert rule.layer_budgets(4, 100, 0, stats=[(0.1,), (0.2,), (0.8,), (0.9,)], total=160, window_size=0) == (
        60,
        60,
        20,
        20,
    )
    with pytest.raises(ValueError, match="n_clusters"):
        SqueezeAttentionRule(n_clusters=1)


def test_squeeze_rule_is_frozen_and_its_weights_average_one() -> None:
    """A rule's settings cannot change after it is made; its weights are budgets relative to the average, so they
    average 1, and a single cluster (all similarities equal) gives 1 to every layer. Kills
    ``@dataclass(frozen=False)`` on :class:`SqueezeAttentionRule` and ``Fraction(2)`` for the uniform weights."""
    rule = SqueezeAttentionRule(p=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.p = 0.25  # type: ignore[misc]
    assert rule.weights([0.4, 0.4, 0.4]) == (Fraction(1),) * 3
    for similarities in ([0.1, 0.5, 0.9], [0.1, 0.1, 0.9, 0.9], [0.2, 0.3, 0.5, 0.8, 0.9]):
        assert sum(rule.weights(similarities)) == len(similarities)


def test_squeeze_statistic_joins_parts_along_their_last_dimension() -> None:
    """Per-token values are indexed by token along the last dimension (:class:`TokenStatistic`), so parts of one
    dimension (a batch of one, squeezed) are joined along it: one mean over all their tokens. Kills ``dim=1`` for
    ``dim=-1`` in :func:`squeeze_statistic_of_similarities`."""
    parts = [torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([6.0], dtype=torch.float64)]
    assert squeeze_statistic_of_similarities(parts).similarity == 3.0


def test_one_run_writes_a_checkpoint_at_a_time(tmp_path: Path) -> None:
    """A second run on a checkpoint another holds stops before it reads or restarts it (another key would otherwise
    overwrite the first run's samples), naming the file; once closed, the checkpoint resumes. Seeded bug: no lock,
    and the second run's other key starts the file over under the first."""
    path = tmp_path / "run.partial.jsonl"
    first = Checkpoint(path, {"k": 1})
    first.add(0, ONE)
    busy = "run.partial.jsonl is being written by another run"
    with pytest.raises(WriterBusyError, match=busy):
        Checkpoint(path, {"k": 2})
    assert path.read_text().count("\n") == 2  # untouched: the key and one sample
    first.close()
    assert Checkpoint(path, {"k": 1}).done == {0: ONE}
    assert (tmp_path / ".run.partial.jsonl.lock").exists()
