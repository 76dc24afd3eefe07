"""Statistics of ``ripplekv report``: stratified bootstrap intervals, paired differences, Wilcoxon tests, Holm.

A metric's value for one (method, budget) is the macro average used throughout the report: the mean of each
task's (stratum's) per-sample mean, averaged over the tasks. Uncertainty comes from the samples:

- **Interval**: a percentile bootstrap (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13)
  stratified by task: every resample draws each task's samples with replacement *within that task*, so a task
  with few samples keeps its weight of ``1 / tasks`` in every resample. The draws depend only on the seed, the
  task and the sample ids, so configurations holding the same samples are resampled identically.
- **Paired difference** of method A and method B: per sample ``A - B`` over the samples both have, then the
  same stratified bootstrap of its macro mean (both methods see the same resampled samples, so whatever a
  sample does to both -- a hard sample, a long prompt -- cancels). Wins / ties / losses count the samples where
  A is better / equal / worse by the metric's direction.
- **Test**: the two-sided Wilcoxon signed-rank test of the paired differences (Wilcoxon 1945; scipy's
  ``wilcoxon``, ``zero_method="wilcox"``: zero differences are dropped; ``method="auto"``: the exact null
  distribution up to 50 samples without ties or zeros; with ties or zeros exact permutations up to 13 samples;
  otherwise the tie-corrected normal approximation). All differences zero gives ``p = 1``.
- **Multiplicity**: Holm's step-down adjustment (Holm 1979) over the distinct comparisons (unordered pairs) of
  one budget and metric. A difference is *significant* when its interval excludes 0 AND its Holm-adjusted
  p-value is below ``ALPHA``.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "ALPHA",
    "CONFIDENCE",
    "DEFAULT_RESAMPLES",
    "METRICS",
    "MIN_RESAMPLES",
    "ZERO_METHOD",
    "Bootstrap",
    "Comparison",
    "Estimate",
    "Metric",
    "MetricStats",
    "Samples",
    "analyse_metric",
    "collect",
    "holm",
    "paired_differences",
    "wilcoxon_p",
]

Samples = dict[str, dict[str, float]]
"""Stratum (task) -> sample id -> value."""

CONFIDENCE = 0.95
ALPHA = 0.05
DEFAULT_RESAMPLES = 4000
MIN_RESAMPLES = 2000
ZERO_METHOD = "wilcox"
BASELINE = "snapkv"
REFERENCE = "full"
TIE_TOLERANCE = 1e-12  # relative: differences this small are ties (exact zeros for the Wilcoxon test)


@dataclass(frozen=True)
class Metric:
    """A per-sample quantity of the result rows that the report aggregates.

    Args:
        name: the row field.
        higher_is_better: the direction used for "best", wins and losses.
        scale: factor applied to every value (100 for task scores, shown as 100 x mean).
        decimals: decimals printed.
        description: one line saying what the number is.
    """

    name: str
    higher_is_better: bool
    scale: float
    decimals: int
    description: str

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a metric needs a name")
        if not math.isfinite(self.scale) or self.scale <= 0:
            raise ValueError(f"metric {self.name}: scale must be a positive number, got {self.scale}")
        if self.decimals < 0:
            raise ValueError(f"metric {self.name}: decimals must be >= 0, got {self.decimals}")

    @property
    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"

    def fmt(self, value: float | None, sign: bool = False) -> str:
        """``value`` with the metric's decimals (``nan`` for a missing value; never ``-0.00``).

        Args:
            value: the number.
            sign: print ``+`` before positive numbers.
        """
        if value is None or not math.isfinite(value):
            return "nan"
        text = f"{value:+.{self.decimals}f}" if sign else f"{value:.{self.decimals}f}"
        return f"{0.0:.{self.decimals}f}" if float(text) == 0.0 else text  # no "-0.00"


_DESCRIPTIONS = {
    "score": "task score: 100 x the mean sample score of each task, averaged over tasks",
    "fidelity_kl": "KL(full || method) in nats per token of the full cache's greedy answer, teacher-forced over "
    "the method's cache",
    "top1_agreement": "fraction of the full cache's answer tokens that are the method's argmax (teacher-forced)",
    "gold_nll_delta": "mean NLL (nats) of the gold answer over the method's cache minus the full cache's",
}
METRICS: dict[str, Metric] = {
    "score": Metric("score", True, 100.0, 2, _DESCRIPTIONS["score"]),
    "fidelity_kl": Metric("fidelity_kl", False, 1.0, 4, _DESCRIPTIONS["fidelity_kl"]),
    "top1_agreement": Metric("top1_agreement", True, 1.0, 3, _DESCRIPTIONS["top1_agreement"]),
    "gold_nll_delta": Metric("gold_nll_delta", False, 1.0, 4, _DESCRIPTIONS["gold_nll_delta"]),
}
"""The metrics of the results contract, in report order."""


@dataclass(frozen=True)
class Estimate:
    """A macro mean with its stratified percentile bootstrap interval."""

    mean: float
    low: float
    high: float
    samples: int
    tasks: int

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


class Bootstrap:
    """Stratified percentile bootstrap of macro means.

    Args:
        resamples: number of resamples (at least ``MIN_RESAMPLES``).
        seed: non-negative seed; the draws of a task depend only on it, the task and its sample ids.
        confidence: two-sided interval level in (0, 1).
    """

    def __init__(self, resamples: int = DEFAULT_RESAMPLES, seed: int = 0, confidence: float = CONFIDENCE) -> None:
        if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < MIN_RESAMPLES:
            raise ValueError(f"resamples must be an integer >= {MIN_RESAMPLES}, got {resamples!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if not 0.0 < confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {confidence}")
        self.resamples = resamples
        self.seed = seed
        self.confidence = confidence
        self._weights: dict[tuple[str, tuple[str, ...]], np.ndarray] = {}

    def weights(self, task: str, ids: Sequence[str]) -> np.ndarray:
        """``(resamples, len(ids))``: how often each sample is drawn in each resample, divided by ``len(ids)``.

        ``weights @ values`` is the mean of every resample of the task at once.

        Args:
            task: the stratum's name (part of the seed).
            ids: the stratum's sample ids, in the order of the values they will weight (part of the seed).
        """
        key = (task, tuple(ids))
        cached = self._weights.get(key)
        if cached is not None:
            return cached
        n = len(key[1])
        if n == 0:
            raise ValueError(f"task {task!r} has no samples to resample")
        digest = zlib.crc32("\x1f".join(key[1]).encode(), zlib.crc32(task.encode()))
        rng = np.random.default_rng([self.seed, digest, n])
        draws = rng.integers(0, n, size=(self.resamples, n))
        offsets = (np.arange(self.resamples) * n)[:, None]
        counts = np.bincount((draws + offsets).ravel(), minlength=self.resamples * n).reshape(self.resamples, n)
        weights = counts / float(n)
        self._weights[key] = weights
        return weights

    def distribution(self, samples: Samples) -> tuple[float, np.ndarray, int, int]:
        """The macro mean of ``samples``, its ``(resamples,)`` bootstrap replicates, samples and tasks used.

        Args:
            samples: task -> sample id -> value; tasks without samples are left out.
        """
        tasks = sorted(task for task, values in samples.items() if values)
        if not tasks:
            raise ValueError("no samples to estimate from")
        replicates = np.zeros(self.resamples)
        point = 0.0
        count = 0
        for task in tasks:
            ids = sorted(samples[task])
            values = np.array([samples[task][i] for i in ids], dtype=np.float64)
            replicates += self.weights(task, ids) @ values
            point += float(values.mean())
            count += len(ids)
        return point / len(tasks), replicates / len(tasks), count, len(tasks)

    def estimate(self, samples: Samples) -> Estimate:
        """The macro mean of ``samples`` with its percentile interval.

        Args:
            samples: task -> sample id -> value; tasks without samples are left out.
        """
        point, replicates, count, tasks = self.distribution(samples)
        tail = 50.0 * (1.0 - self.confidence)
        low, high = np.percentile(replicates, [tail, 100.0 - tail])
        return Estimate(point, float(low), float(high), count, tasks)


def collect(
    rows: Iterable[Mapping[str, Any]], metric: Metric, task_of: Callable[[Mapping[str, Any]], str]
) -> dict[tuple[str, float], Samples]:
    """(method, budget) -> task -> sample id -> ``scale x value`` for the rows where ``metric`` is a number.

    Rows where the field is absent or null are skipped (a ``--score fidelity`` run's compressed scores, runs
    written before the fidelity fields existed).

    Args:
        rows: result rows (``results.jsonl``).
        metric: the metric (its ``name`` is the row field, its ``scale`` multiplies every value).
        task_of: a row's stratum (its task).
    """
    values: dict[tuple[str, float], Samples] = {}
    for row in rows:
        value = row.get(metric.name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"row {row.get('sample_id')!r}: {metric.name} must be a finite number, got {value!r}")
        key = (str(row["method"]), float(row["budget"]))
        task = values.setdefault(key, {}).setdefault(task_of(row), {})
        task[str(row["sample_id"])] = metric.scale * float(value)
    return values


def paired_differences(a: Samples, b: Samples) -> Samples:
    """Per task, ``a - b`` over the samples present in both (differences within rounding noise are exact 0).

    Args:
        a: task -> sample id -> value of the first method.
        b: the same for the method it is compared with.
    """
    out: Samples = {}
    for task in sorted(a.keys() & b.keys()):
        common = a[task].keys() & b[task].keys()
        diffs = {}
        for sample in common:
            x, y = a[task][sample], b[task][sample]
            d = x - y
            diffs[sample] = 0.0 if abs(d) <= TIE_TOLERANCE * max(1.0, abs(x), abs(y)) else d
        if diffs:
            out[task] = diffs
    return out


def wilcoxon_p(differences: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired differences (``zero_method="wilcox"``); all zero -> 1.

    Args:
        differences: the per-sample differences (at least one, finite).
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.size == 0:
        raise ValueError("the Wilcoxon test needs at least one paired difference")
    if not np.all(np.isfinite(d)):
        raise ValueError("paired differences must be finite")
    if not np.any(d != 0.0):
        return 1.0
    from scipy.stats import wilcoxon

    p = float(wilcoxon(d, zero_method=ZERO_METHOD, alternative="two-sided", method="auto").pvalue)
    return min(1.0, p) if math.isfinite(p) else 1.0


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order.

    Args:
        pvalues: the raw p-values of the family of comparisons, each in [0, 1].
    """
    p = [float(v) for v in pvalues]
    for v in p:
        if not 0.0 <= v <= 1.0:  # also rejects NaN
            raise ValueError(f"p-values must lie in [0, 1], got {v}")
    m = len(p)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: p[j])):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Comparison:
    """``method`` against ``other`` at one budget: the paired difference ``method - other`` and its test."""

    method: str
    other: str
    difference: Estimate
    wins: int
    ties: int
    losses: int
    p: float
    p_holm: float = math.nan
    significant: bool = False

    @property
    def pair(self) -> frozenset[str]:
        return frozenset((self.method, self.other))


@dataclass(frozen=True)
class MetricStats:
    """Everything the report prints for one metric.

    ``estimates``: (method, budget) -> macro mean and interval (``full`` at its own budget). ``versus``: budget ->
    method -> ``{"baseline": Comparison, "best_other": Comparison}`` (either absent when there is nothing to compare
    with). ``tests``: budget -> the distinct comparisons (unordered pairs) Holm adjusts over: every method
    against the baseline, then the best-other comparisons not already among them.
    """

    metric: Metric
    estimates: dict[tuple[str, float], Estimate]
    versus: dict[float, dict[str, dict[str, Comparison]]] = field(default_factory=dict)
    tests: dict[float, list[Comparison]] = field(default_factory=dict)


def _compare(
    metric: Metric, method: str, other: str, a: Samples, b: Samples, bootstrap: Bootstrap
) -> Comparison | None:
    diffs = paired_differences(a, b)
    if not diffs:
        return None
    flat = np.array([d for task in diffs.values() for d in task.values()])
    better = flat > 0 if metric.higher_is_better else flat < 0
    worse = flat < 0 if metric.higher_is_better else flat > 0
    return Comparison(
        method=method,
        other=other,
        difference=bootstrap.estimate(diffs),
        wins=int(better.sum()),
        ties=int((flat == 0).sum()),
        losses=int(worse.sum()),
        p=wilcoxon_p(flat),
    )


def analyse_metric(
    metric: Metric,
    values: Mapping[tuple[str, float], Samples],
    methods: Sequence[str],
    budgets: Sequence[float],
    bootstrap: Bootstrap,
    baseline: str = BASELINE,
    reference: str = REFERENCE,
) -> MetricStats:
    """Intervals, paired comparisons and Holm-adjusted significance of one metric.

    Args:
        metric: the metric (its direction picks the best other method and orients wins and losses).
        values: (method, budget) -> samples, as :func:`collect` returns them.
        methods: method names in report order; ``reference`` (the full cache) gets an interval but is never
            compared.
        budgets: the compression budgets compared.
        bootstrap: the resampler (its seed and resample count).
        baseline: the method every other method is compared with (SnapKV).
        reference: the uncompressed method, excluded from comparisons.
    """
    estimates = {key: bootstrap.estimate(samples) for key, samples in values.items() if samples}
    result = MetricStats(metric, estimates)
    for budget in budgets:
        present = [m for m in methods if m != reference and (m, budget) in estimates]
        per_method: dict[str, dict[str, Comparison]] = {}
        unique: dict[frozenset[str], Comparison] = {}
        for method in present:
            others = [m for m in present if m != method]
            targets: dict[str, str] = {}
            if baseline in others:
                targets["baseline"] = baseline
            if others:
                sign = 1.0 if metric.higher_is_better else -1.0
                targets["best_other"] = max(others, key=lambda m: sign * estimates[m, budget].mean)
            for kind, other in targets.items():
                comparison = _compare(metric, method, other, values[method, budget], values[other, budget], bootstrap)
                if comparison is not None:
                    per_method.setdefault(method, {})[kind] = comparison
        for kind in ("baseline", "best_other"):  # pairs with the baseline read "method vs snapkv"
            for kinds in per_method.values():
                if kind in kinds:
                    unique.setdefault(kinds[kind].pair, kinds[kind])
        tests = list(unique.values())
        adjusted = dict(zip([c.pair for c in tests], holm([c.p for c in tests])))
        result.versus[budget] = {
            m: {k: _settle(c, adjusted[c.pair]) for k, c in kinds.items()} for m, kinds in per_method.items()
        }
        result.tests[budget] = [_settle(c, adjusted[c.pair]) for c in tests]
    return result


def _settle(c: Comparison, p_holm: float) -> Comparison:
    """``c`` with its Holm-adjusted p-value and the significance rule applied."""
    significant = c.difference.excludes_zero() and p_holm < ALPHA
    return Comparison(c.method, c.other, c.difference, c.wins, c.ties, c.losses, c.p, p_holm, significant)
