"""The statistics of one run of ``ripplekv report``: which metrics the rows hold, and their analysis.

:func:`analyse_run` runs :mod:`~ripplekv_eval.reporting.comparisons` over every metric of the results contract
that the rows hold (``score``, ``fidelity_kl``, ``top1_agreement``, ``gold_nll_delta``), on the samples that hold
every configuration; :mod:`~ripplekv_eval.reporting.tables` (markdown) and
:mod:`~ripplekv_eval.reporting.json_format` print it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ripplekv_eval.reporting.comparisons import REFERENCE, MetricStats, analyse_metric
from ripplekv_eval.reporting.significance import DEFAULT_DRAWS, DEFAULT_FAMILY, EXACT_MAX, FAMILIES, SignFlip
from ripplekv_eval.reporting.stats import CONFIDENCE, DEFAULT_RESAMPLES, METRICS, Bootstrap, collect
from ripplekv_eval.running.results import complete_samples
from ripplekv_eval.sample import FULL_BUDGET

__all__ = ["RunStats", "analyse_run"]


@dataclass(frozen=True)
class RunStats:
    """The statistics of one run.

    ``metrics``: metric name -> its analysis, in :data:`~ripplekv_eval.reporting.stats.METRICS` order;
    ``skipped``: metric name -> why it is not reported; ``strata``: task -> samples (the most any configuration has).
    """

    resamples: int
    seed: int
    confidence: float
    metrics: dict[str, MetricStats]
    skipped: dict[str, str]
    strata: dict[str, int]
    incomplete: int = 0  # samples left out because they lack some configuration (a running or interrupted run)
    draws: int = DEFAULT_DRAWS  # random sign vectors of the sign-flip test (beyond EXACT_MAX samples)
    family: str = DEFAULT_FAMILY  # Holm's family (significance.FAMILIES)
    exact_max: int = EXACT_MAX


def _task_of(row: Mapping[str, Any]) -> str:
    return str(row.get("task", ""))


def analyse_run(
    rows: Sequence[Mapping[str, Any]],
    methods: Sequence[str],
    budgets: Sequence[float],
    metrics: Sequence[str] | None = None,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
    draws: int = DEFAULT_DRAWS,
    family: str = DEFAULT_FAMILY,
) -> RunStats:
    """Intervals and paired comparisons of every requested metric (default: every metric the rows hold).

    Args:
        rows: the result rows (``results.jsonl``).
        methods: method names in report order (``full`` first).
        budgets: the compression budgets.
        metrics: metric names to report; ``None`` for all that have values. A named metric without values is
            listed as skipped.
        seed: the seed of the bootstrap and of the sign-flip test.
        resamples: bootstrap resamples per interval of a mean.
        draws: random sign vectors per comparison (used beyond ``EXACT_MAX`` samples).
        family: Holm's family, one of :data:`~ripplekv_eval.reporting.significance.FAMILIES`.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    if metrics is not None:
        unknown = [m for m in metrics if m not in METRICS]
        if unknown:
            raise ValueError(f"unknown metric(s) {', '.join(unknown)}: choose from {', '.join(METRICS)}")
    bootstrap = Bootstrap(resamples=resamples, seed=seed, confidence=CONFIDENCE)
    flip = SignFlip(draws=draws, seed=seed, confidence=CONFIDENCE)
    configurations = [(m, FULL_BUDGET) if m == REFERENCE else (m, float(b)) for m in methods for b in budgets]
    rows, incomplete = complete_samples(rows, configurations)
    analysed: dict[str, MetricStats] = {}
    skipped: dict[str, str] = {}
    strata: dict[str, int] = {}
    for name, metric in METRICS.items():
        if metrics is not None and name not in metrics:
            continue
        values = collect(rows, metric, _task_of)
        compressed = {key: v for key, v in values.items() if key[0] != REFERENCE}
        if not compressed:
            skipped[name] = (
                "only the full cache has values (compressed configurations were not scored)"
                if values
                else "no row has a value (not recorded by this run)"
            )
            continue
        analysed[name] = analyse_metric(metric, values, methods, budgets, bootstrap, flip=flip, family=family)
        for samples in values.values():
            for task, per_sample in samples.items():
                strata[task] = max(strata.get(task, 0), len(per_sample))
    return RunStats(resamples, seed, CONFIDENCE, analysed, skipped, strata, incomplete, draws, family, flip.exact_max)
