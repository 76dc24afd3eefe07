"""Statistics of ``ripplekv report``: macro means, their BCa intervals, paired comparisons, one test each, Holm.

A metric's value for one (method, budget) is the macro average used throughout the report: the mean of each
task's (stratum's) per-sample mean, averaged over the tasks. Uncertainty comes from the samples:

- **Interval of a mean**: the BCa bootstrap (Efron 1987; Efron & Tibshirani, *An Introduction to the Bootstrap*,
  1993, ch. 14) stratified by task: every resample draws each task's samples with replacement *within that task*,
  so a task with few samples keeps its weight of ``1 / tasks`` in every resample; the acceleration is the
  jackknife over the samples (leave one sample out of its task). The draws depend only on the seed, the task and
  the sample ids, so configurations holding the same samples are resampled identically. Resampling a task of n
  samples understates its variance by ``(n - 1) / n`` (a one-sample task gets none): the report warns below
  ``FEW_SAMPLES`` (:mod:`~ripplekv.evaluation.reporting.tables`).
- **Paired difference** of method A and method B: per sample ``A - B`` over the samples both have; its estimate is
  the macro mean of the differences. Wins / ties / losses count the samples where A is better / equal / worse by
  the metric's direction.
- **Test and interval of a difference** (:mod:`~ripplekv.evaluation.reporting.significance`): the stratified sign-flip
  permutation test of that macro mean (each sample's difference flipped independently, the macro mean recomputed
  with the same task weights; exact up to ``EXACT_MAX`` samples, else Monte Carlo with the +1 correction), and the
  interval that inverts it, so the raw p is below ``ALPHA`` exactly when the interval excludes 0. The BCa interval
  of the same difference is kept as ``Comparison.bootstrap`` for reference.
- **Multiplicity**: Holm's step-down adjustment over a family (``FAMILIES``; default ``budget``: the distinct
  comparisons, unordered pairs, of one budget and metric; ``metric``: those of one metric over all its budgets).
  A difference is *significant* when its Holm-adjusted p is below ``ALPHA`` -- and then its interval excludes 0.
  An interval that excludes 0 with a Holm p >= ``ALPHA`` is a raw result that does not survive the family.

:func:`wilcoxon_p` (the pooled Wilcoxon signed-rank test of earlier reports) is kept for comparison only; it tests
the pooled samples, not the macro mean, and no verdict uses it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ripplekv.evaluation.reporting.significance import (
    DEFAULT_DRAWS,
    DEFAULT_FAMILY,
    EXACT_MAX,
    FAMILIES,
    TEST_NAME,
    SignFlip,
    bca_interval,
    holm,
)
from ripplekv.evaluation.sample import row_configuration

__all__ = [
    "ALPHA",
    "CONFIDENCE",
    "DEFAULT_DRAWS",
    "DEFAULT_FAMILY",
    "DEFAULT_RESAMPLES",
    "EXACT_MAX",
    "FAMILIES",
    "METRICS",
    "MIN_RESAMPLES",
    "TEST_NAME",
    "ZERO_METHOD",
    "Bootstrap",
    "Comparison",
    "Estimate",
    "Metric",
    "MetricStats",
    "Samples",
    "SignFlip",
    "analyse_metric",
    "collect",
    "compare",
    "holm",
    "paired_differences",
    "settle",
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
        if value is None or math.isnan(value):
            return "nan"
        if math.isinf(value):
            return ("+inf" if sign else "inf") if value > 0 else "-inf"
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
    """A macro mean with its interval: ``method`` says which (``bca``, ``percentile``, ``sign-flip inversion``)."""

    mean: float
    low: float
    high: float
    samples: int
    tasks: int
    method: str = "bca"

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


class Bootstrap:
    """Stratified bootstrap of macro means: BCa intervals (percentile on request).

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

    @staticmethod
    def jackknife(samples: Samples) -> np.ndarray:
        """The leave-one-out macro means: each sample left out of its own task (tasks of one sample are skipped).

        Args:
            samples: task -> sample id -> value; tasks without samples are left out.
        """
        tasks = [task for task in sorted(samples) if samples[task]]
        means = {task: float(np.mean(list(samples[task].values()))) for task in tasks}
        point = sum(means.values()) / len(tasks)
        out = []
        for task in tasks:
            n = len(samples[task])
            if n < 2:
                continue
            values = np.array([samples[task][i] for i in sorted(samples[task])], dtype=np.float64)
            out.append(point + ((means[task] * n - values) / (n - 1) - means[task]) / len(tasks))
        return np.concatenate(out) if out else np.zeros(0)

    def estimate(self, samples: Samples, method: str = "bca") -> Estimate:
        """The macro mean of ``samples`` with its BCa (default) or percentile interval.

        BCa (:func:`~ripplekv.evaluation.reporting.significance.bca_interval`): the percentile interval corrected for
        the median bias of the replicates and for skewness (the jackknife acceleration over samples); with a symmetric,
        unbiased bootstrap distribution both agree.

        Args:
            samples: task -> sample id -> value; tasks without samples are left out.
            method: ``bca`` or ``percentile``.
        """
        point, replicates, count, tasks = self.distribution(samples)
        if method == "percentile":
            tail = 50.0 * (1.0 - self.confidence)
            low, high = np.percentile(replicates, [tail, 100.0 - tail])
        elif method == "bca":
            low, high = bca_interval(point, replicates, self.jackknife(samples), self.confidence)
        else:
            raise ValueError(f"method must be 'bca' or 'percentile', got {method!r}")
        return Estimate(point, float(low), float(high), count, tasks, method)


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
        key = (row_configuration(row), float(row["budget"]))
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
        for sample in sorted(common):  # sorted: sums in a fixed order, the same digits on every run
            x, y = a[task][sample], b[task][sample]
            d = x - y
            diffs[sample] = 0.0 if abs(d) <= TIE_TOLERANCE * max(1.0, abs(x), abs(y)) else d
        if diffs:
            out[task] = diffs
    return out


def wilcoxon_p(differences: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value of pooled paired differences (``zero_method="wilcox"``); all zero -> 1.

    Not used for any verdict (it tests the pooled samples, not the macro mean); kept to compare with earlier reports.

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


@dataclass(frozen=True)
class Comparison:
    """``method`` against ``other`` at one budget: the paired difference ``method - other`` and its test.

    ``difference``: the macro mean of the differences with the interval inverting the sign-flip test (``method``
    ``sign-flip inversion``); ``bootstrap``: the BCa interval of the same mean (reference only). ``p``: the raw
    sign-flip p; ``test``: ``exact`` or ``monte-carlo``; ``vectors``: sign vectors used. ``p_holm`` and
    ``significant`` (``p_holm < ALPHA``) are set by :func:`settle` over the comparison's family.
    """

    method: str
    other: str
    difference: Estimate
    wins: int
    ties: int
    losses: int
    p: float
    p_holm: float = math.nan
    significant: bool = False
    test: str = ""
    vectors: int = 0
    bootstrap: Estimate | None = None

    @property
    def pair(self) -> frozenset[str]:
        return frozenset((self.method, self.other))


@dataclass(frozen=True)
class MetricStats:
    """Everything the report prints for one metric.

    ``estimates``: (method, budget) -> macro mean and interval (``full`` at its own budget). ``versus``: budget ->
    method -> ``{"baseline": Comparison, "best_other": Comparison}`` (either absent when there is nothing to compare
    with). ``tests``: budget -> the distinct comparisons (unordered pairs) of that budget: every method against the
    baseline, then the best-other comparisons not already among them. ``family``: what Holm adjusts over
    (:data:`FAMILIES`).
    """

    metric: Metric
    estimates: dict[tuple[str, float], Estimate]
    versus: dict[float, dict[str, dict[str, Comparison]]] = field(default_factory=dict)
    tests: dict[float, list[Comparison]] = field(default_factory=dict)
    family: str = DEFAULT_FAMILY


def compare(
    metric: Metric, method: str, other: str, a: Samples, b: Samples, flip: SignFlip, bootstrap: Bootstrap | None = None
) -> Comparison | None:
    """``method - other`` over the samples both have: estimate, inverted interval, raw p, W/T/L (None: no pairs).

    Args:
        metric: orients wins and losses.
        method: the first method's name.
        other: the name of the method it is compared with.
        a: the first method's samples.
        b: the other's.
        flip: the sign-flip test (draws, seed, level).
        bootstrap: also the BCa interval of the difference (``Comparison.bootstrap``), or None.
    """
    diffs = paired_differences(a, b)
    if not diffs:
        return None
    flat = np.array([d for task in diffs.values() for d in task.values()])
    better = flat > 0 if metric.higher_is_better else flat < 0
    worse = flat < 0 if metric.higher_is_better else flat > 0
    result = flip.test(diffs)
    interval = Estimate(result.mean, result.low, result.high, result.samples, result.tasks, "sign-flip inversion")
    return Comparison(
        method=method,
        other=other,
        difference=interval,
        wins=int(better.sum()),
        ties=int((flat == 0).sum()),
        losses=int(worse.sum()),
        p=result.p,
        test=result.method,
        vectors=result.vectors,
        bootstrap=None if bootstrap is None else bootstrap.estimate(diffs),
    )


def settle(comparisons: Sequence[Comparison], alpha: float = ALPHA) -> list[Comparison]:
    """The family ``comparisons`` with their Holm-adjusted p and verdicts (``significant``: ``p_holm < alpha``).

    Args:
        comparisons: one family of distinct comparisons.
        alpha: the family's level.
    """
    adjusted = holm([c.p for c in comparisons])
    return [replace(c, p_holm=p, significant=p < alpha) for c, p in zip(comparisons, adjusted)]


def analyse_metric(
    metric: Metric,
    values: Mapping[tuple[str, float], Samples],
    methods: Sequence[str],
    budgets: Sequence[float],
    bootstrap: Bootstrap,
    baseline: str = BASELINE,
    reference: str = REFERENCE,
    flip: SignFlip | None = None,
    family: str = DEFAULT_FAMILY,
) -> MetricStats:
    """Intervals, paired comparisons and Holm-adjusted significance of one metric.

    Args:
        metric: the metric (its direction picks the best other method and orients wins and losses).
        values: (method, budget) -> samples, as :func:`collect` returns them.
        methods: method names in report order; ``reference`` (the full cache) gets an interval but is never
            compared.
        budgets: the compression budgets compared.
        bootstrap: the resampler of the means' intervals (its seed and resample count).
        baseline: the method every other method is compared with (SnapKV).
        reference: the uncompressed method, excluded from comparisons.
        flip: the sign-flip test of the differences (default: ``SignFlip(seed=bootstrap.seed)`` at the bootstrap's
            level).
        family: Holm's family, one of :data:`FAMILIES` (default ``budget``).
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    if flip is None:
        flip = SignFlip(seed=bootstrap.seed, confidence=bootstrap.confidence)
    estimates = {key: bootstrap.estimate(samples) for key, samples in values.items() if samples}
    done: dict[tuple[float, str, str], Comparison | None] = {}

    def pair(budget: float, method: str, other: str) -> Comparison | None:
        """``method - other``; the reverse of a pair already computed is that one negated (same test, same p)."""
        back = done.get((budget, other, method))
        if back is None:
            c = compare(metric, method, other, values[method, budget], values[other, budget], flip, bootstrap)
            done[budget, method, other] = c
            return c
        return replace(
            back,
            method=method,
            other=other,
            difference=_negated(back.difference),
            bootstrap=None if back.bootstrap is None else _negated(back.bootstrap),
            wins=back.losses,
            losses=back.wins,
        )

    result = MetricStats(metric, estimates, family=family)
    raw: dict[float, tuple[dict[str, dict[str, Comparison]], list[Comparison]]] = {}
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
                comparison = pair(budget, method, other)
                if comparison is not None:
                    per_method.setdefault(method, {})[kind] = comparison
        for kind in ("baseline", "best_other"):  # pairs with the baseline read "method vs snapkv"
            for kinds in per_method.values():
                if kind in kinds:
                    unique.setdefault(kinds[kind].pair, kinds[kind])
        raw[budget] = (per_method, list(unique.values()))
    families = [[b] for b in raw] if family == "budget" else [list(raw)]
    for members in families:
        keys = [(b, c.pair) for b in members for c in raw[b][1]]
        settled = dict(zip(keys, settle([c for b in members for c in raw[b][1]], 1.0 - flip.confidence)))
        for b in members:
            per_method, tests = raw[b]
            result.tests[b] = [settled[b, c.pair] for c in tests]
            result.versus[b] = {
                m: {k: _settled(c, settled[b, c.pair]) for k, c in kinds.items()} for m, kinds in per_method.items()
            }
    return result


def _negated(e: Estimate) -> Estimate:
    return replace(e, mean=-e.mean, low=-e.high, high=-e.low)


def _settled(c: Comparison, family_member: Comparison) -> Comparison:
    """``c`` (either direction of a pair) with the Holm p and verdict of its pair's family member."""
    return replace(c, p_holm=family_member.p_holm, significant=family_member.significant)
