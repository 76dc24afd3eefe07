"""``ripplekv report --format json``: the run, its score tables, timing and statistics as one JSON document."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ripplekv.presses.descriptions import describe_method
from ripplekv_eval.reporting.comparisons import BASELINE, REFERENCE, Comparison
from ripplekv_eval.reporting.run_stats import RunStats
from ripplekv_eval.reporting.significance import FAMILIES, TEST_NAME
from ripplekv_eval.reporting.stats import ALPHA, Estimate
from ripplekv_eval.reporting.summary import AVERAGE
from ripplekv_eval.reporting.tables import rule_text, significance_lines, small_sample_caveat
from ripplekv_eval.sample import FULL_BUDGET

if TYPE_CHECKING:
    from ripplekv_eval.reporting.summary import RunSummary

__all__ = ["format_json", "significance_record", "stats_json"]


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no infinity: an unbounded end is null


def _estimate_json(e: Estimate) -> dict[str, Any]:
    return {
        "mean": e.mean,
        "low": _number(e.low),
        "high": _number(e.high),
        "samples": e.samples,
        "tasks": e.tasks,
        "interval": e.method,
    }


def _comparison_json(c: Comparison, against: str | None = None) -> dict[str, Any]:
    return {
        **({} if against is None else {"against": against}),
        "method": c.method,
        "other": c.other,
        "difference": _estimate_json(c.difference),
        "wins": c.wins,
        "ties": c.ties,
        "losses": c.losses,
        "p": c.p,
        "p_holm": c.p_holm,
        "significant": c.significant,
        "test": c.test,
        "sign_vectors": c.vectors,
    }


def significance_record(run: RunStats) -> dict[str, Any]:
    """The test of every comparison: its name, sign vectors, seed, level, Holm's family.

    Args:
        run: the run's statistics.
    """
    return {
        "name": TEST_NAME,
        "statistic": "macro mean of the paired differences (mean over tasks of each task's mean)",
        "exact_max_samples": run.exact_max,
        "draws": run.draws,
        "seed": run.seed,
        "p": "two-sided; exact: share of all 2^n sign vectors; monte-carlo: (1 + #as extreme) / (draws + 1)",
        "interval": "inversion of the test at the report's confidence",
        "family": run.family,
        "family_description": FAMILIES[run.family],
        "adjustment": "holm",
        "alpha": ALPHA,
        "significant": "holm-adjusted p < alpha",
    }


def stats_json(run: RunStats) -> dict[str, Any]:
    """Every number of the statistics as plain JSON types (budgets as numbers inside the records).

    Args:
        run: the run's statistics.
    """
    metrics: dict[str, Any] = {}
    for name, stats in run.metrics.items():
        lines = significance_lines(stats)
        metrics[name] = {
            "higher_is_better": stats.metric.higher_is_better,
            "scale": stats.metric.scale,
            "description": stats.metric.description,
            "estimates": [{"method": m, "budget": b, **_estimate_json(e)} for (m, b), e in stats.estimates.items()],
            "comparisons": [
                {"budget": budget, **_comparison_json(c, kind)}
                for budget, versus in stats.versus.items()
                for kinds in versus.values()
                for kind, c in kinds.items()
            ],
            "tests": [
                {"budget": budget, "line": lines[budget], "comparisons": [_comparison_json(c) for c in tests]}
                for budget, tests in stats.tests.items()
            ],
        }
    return {
        "resamples": run.resamples,
        "seed": run.seed,
        "confidence": run.confidence,
        "alpha": ALPHA,
        "interval_of_means": "stratified bca bootstrap",
        "test": significance_record(run),
        "baseline": BASELINE,
        "rule": rule_text(run),
        "caveat": small_sample_caveat(run),
        "strata": run.strata,
        "incomplete_samples": run.incomplete,
        "metrics": metrics,
        "skipped": run.skipped,
    }


def _score_records(summary: RunSummary) -> list[dict[str, Any]]:
    records = []
    for task in (AVERAGE, *summary.group_sizes, *summary.tasks):
        for method in summary.methods:
            for budget in [FULL_BUDGET] if method == REFERENCE else summary.budgets:
                score = summary.value(task, method, budget)
                if score is not None:
                    percent = summary.percent_of_full(task, method, budget)
                    samples = summary.counts.get((task, method, budget))
                    records.append(
                        {"task": task, "method": method, "budget": budget, "score": score}
                        | {"percent_of_full": percent, "samples": samples}
                    )
    return records


def format_json(summary: RunSummary, stats: RunStats | None = None, by_scorer: Mapping[str, Any] | None = None) -> str:
    """JSON: the run, the methods and what they compute, every score-table cell, the timing and the statistics.

    Args:
        summary: the run's score tables (:func:`ripplekv_eval.reporting.report.summarize`).
        stats: the run's statistics, or ``None`` to leave them out.
        by_scorer: a run over several scorers: each scorer's methods and statistics
            (:func:`ripplekv_eval.reporting.by_scorer.scorers_json`), stored under ``statistics_by_scorer``.
    """
    timing = summary.timing
    document = {
        "format": "ripplekv-report/1",
        "suite": summary.suite,
        "model": summary.model,
        "protocol": summary.protocol,
        "tasks": list(summary.tasks),
        "methods": {m: describe_method(m) for m in summary.methods},
        "budgets": list(summary.budgets),
        "rows": summary.rows,
        "expected_rows": summary.expected_rows,
        "scores": _score_records(summary),
        "longbench_e_groups": {g: {"tasks": t, "samples": n} for g, (t, n) in summary.group_sizes.items()},
        "timing": None
        if timing is None
        else {
            "samples": timing.samples,
            "shared_prefill": timing.shared_prefill,
            "derived": timing.derived,
            "own_prefill": timing.own_prefill,
            "separate_estimate": timing.separate_estimate,
            "total": timing.total,
            "speedup_estimate": None if math.isnan(timing.speedup_estimate) else timing.speedup_estimate,
        },
        "statistics": None if stats is None else stats_json(stats),
        **({} if by_scorer is None else {"statistics_by_scorer": dict(by_scorer)}),
    }
    return json.dumps(document, indent=1, allow_nan=False) + "\n"
