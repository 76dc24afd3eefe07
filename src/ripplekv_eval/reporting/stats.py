"""Statistics of ``ripplekv report`` per configuration: the metrics, macro means and their BCa intervals.

A metric's value for one (method, budget) is the macro average used throughout the report: the mean of each
task's (stratum's) per-sample mean, averaged over the tasks. Uncertainty comes from the samples:

- **Interval of a mean**: the BCa bootstrap (Efron 1987; Efron & Tibshirani, *An Introduction to the Bootstrap*,
  1993, ch. 14) of ``scipy.stats.bootstrap`` with each task as one sample: every resample draws each task's
  samples with replacement *within that task*, so a task with few samples keeps its weight of ``1 / tasks`` in
  every resample; the acceleration is scipy's multi-sample jackknife (leave one sample out of its task). The
  generator is seeded by the seed and the sample ids, so configurations holding the same samples are resampled
  identically. Resampling a task of n samples understates its variance by ``(n - 1) / n`` (a one-sample task gets
  none): the report warns below ``FEW_SAMPLES`` (:mod:`~ripplekv_eval.reporting.tables`).

Paired comparisons of two configurations, their test and Holm's adjustment are in
:mod:`~ripplekv_eval.reporting.comparisons`.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ripplekv_eval.sample import row_configuration

__all__ = [
    "ALPHA",
    "CONFIDENCE",
    "DEFAULT_RESAMPLES",
    "METRICS",
    "MIN_RESAMPLES",
    "Bootstrap",
    "Estimate",
    "Metric",
    "Samples",
    "collect",
]

Samples = dict[str, dict[str, float]]
"""Stratum (task) -> sample id -> value."""

CONFIDENCE = 0.95
ALPHA = 0.05
DEFAULT_RESAMPLES = 4000
MIN_RESAMPLES = 2000


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
    """A macro mean with its interval: ``method`` says which (``bca`` or ``sign-flip inversion``)."""

    mean: float
    low: float
    high: float
    samples: int
    tasks: int
    method: str = "bca"

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


@dataclass(frozen=True)
class Bootstrap:
    """BCa intervals of macro means: ``scipy.stats.bootstrap`` with one sample per task (see the module docstring).

    Args:
        resamples: number of resamples (at least ``MIN_RESAMPLES``).
        seed: non-negative seed; the draws depend only on it and the tasks' sample ids.
        confidence: two-sided interval level in (0, 1).
    """

    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0
    confidence: float = CONFIDENCE

    def __post_init__(self) -> None:
        resamples, seed = self.resamples, self.seed
        if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < MIN_RESAMPLES:
            raise ValueError(f"resamples must be an integer >= {MIN_RESAMPLES}, got {resamples!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")

    def estimate(self, samples: Samples) -> Estimate:
        """The macro mean of ``samples`` with its BCa interval (see :meth:`estimates`).

        Args:
            samples: task -> sample id -> value; tasks without samples are left out.
        """
        return self.estimates([samples])[0]

    def estimates(self, many: Sequence[Samples]) -> list[Estimate]:
        """The macro mean of each of ``many`` with its BCa interval.

        Those holding the same samples share one ``scipy.stats.bootstrap`` call, vectorized over them: they are
        resampled identically, as they would be one by one. A task of one sample adds a constant (nothing to
        resample); with nothing that varies the interval is the point.

        Args:
            many: each: task -> sample id -> value; tasks without samples are left out.
        """
        groups: dict[tuple[tuple[str, tuple[str, ...]], ...], list[int]] = {}
        for i, samples in enumerate(many):
            tasks = sorted(task for task, values in samples.items() if values)
            if not tasks:
                raise ValueError("no samples to estimate from")
            groups.setdefault(tuple((t, tuple(sorted(samples[t]))) for t in tasks), []).append(i)
        out: dict[int, Estimate] = {}
        for ids, members in groups.items():
            values = [np.array([[many[i][t][s] for s in names] for i in members], dtype=np.float64) for t, names in ids]
            out.update(zip(members, self._intervals(ids, values)))
        return [out[i] for i in range(len(many))]

    def _intervals(self, ids: tuple[tuple[str, tuple[str, ...]], ...], values: list[np.ndarray]) -> list[Estimate]:
        """The estimates of configurations holding the same samples: ``values[k]`` is ``(configurations, n_k)``, the
        values of task ``ids[k]`` (its name and sample ids)."""
        rows = values[0].shape[0]
        count = sum(len(names) for _, names in ids)
        points = [sum(float(v[row].mean()) for v in values) / len(ids) for row in range(rows)]
        resampled = [v for v in values if v.shape[1] > 1]
        fixed = sum((v[:, 0] for v in values if v.shape[1] == 1), np.zeros(rows))
        varying = np.flatnonzero(np.any([np.ptp(v, axis=1) > 0 for v in resampled], axis=0)) if resampled else []
        lows, highs = list(points), list(points)
        if len(varying):
            from scipy.stats import bootstrap  # imported here: scipy.stats takes seconds to import

            key = "\x1f".join(f"{t}\x1e{s}" for t, names in ids for s in names)
            interval = bootstrap(
                [v[varying] for v in resampled],
                partial(_macro, constant=fixed[varying], tasks=len(ids)),
                n_resamples=self.resamples,
                vectorized=True,
                axis=-1,
                confidence_level=self.confidence,
                method="BCa",
                rng=np.random.default_rng([self.seed, zlib.crc32(key.encode())]),
            ).confidence_interval
            for j, row in enumerate(varying):
                lows[row], highs[row] = float(interval.low[j]), float(interval.high[j])
        return [Estimate(points[row], lows[row], highs[row], count, len(ids)) for row in range(rows)]


def _macro(*data: np.ndarray, axis: int, constant: np.ndarray, tasks: int) -> np.ndarray:
    """The macro mean of each configuration (the leading axis) from its resampled tasks ``data`` and the sum
    ``constant`` of its one-sample tasks' values."""
    total = sum(np.mean(r, axis=axis) for r in data)
    return (total + constant.reshape(constant.shape + (1,) * (total.ndim - 1))) / tasks


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
