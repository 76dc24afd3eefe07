"""The statistics part of ``ripplekv report``: which metrics a run has, their analysis, and how it is printed.

:func:`analyse_run` runs :mod:`ripplekv.evaluation.reporting.stats` over every metric of the results contract that the
rows hold (``score``, ``fidelity_kl``, ``top1_agreement``, ``gold_nll_delta``); :func:`markdown_sections`,
:func:`significance_lines` and :func:`stats_json` print it. :func:`legend` says what each method computes
(``ripplekv.presses.registry.METHOD_DESCRIPTIONS``; unknown names print as they are).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ripplekv.evaluation.reporting.stats import (
    ALPHA,
    BASELINE,
    CONFIDENCE,
    DEFAULT_DRAWS,
    DEFAULT_FAMILY,
    DEFAULT_RESAMPLES,
    EXACT_MAX,
    FAMILIES,
    METRICS,
    REFERENCE,
    TEST_NAME,
    Bootstrap,
    Comparison,
    Estimate,
    MetricStats,
    SignFlip,
    analyse_metric,
    collect,
)
from ripplekv.evaluation.reporting.summary import AVERAGE
from ripplekv.evaluation.running.results import complete_samples
from ripplekv.evaluation.sample import FULL_BUDGET
from ripplekv.presses.registry import METHOD_DESCRIPTIONS
from ripplekv.presses.scorers import SCORER_DESCRIPTIONS

if TYPE_CHECKING:
    from ripplekv.evaluation.reporting.summary import RunSummary

__all__ = [
    "AVERAGE",
    "FEW_SAMPLES",
    "RunStats",
    "analyse_run",
    "budget_label",
    "format_json",
    "legend",
    "markdown_sections",
    "scorer_legend",
    "significance_lines",
    "significance_method",
    "significance_record",
    "stats_json",
]

FEW_SAMPLES = 5  # tasks with fewer samples get the small-sample caveat


@dataclass(frozen=True)
class RunStats:
    """The statistics of one run.

    ``metrics``: metric name -> its analysis, in :data:`~ripplekv.evaluation.reporting.stats.METRICS` order;
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
    family: str = DEFAULT_FAMILY  # Holm's family (stats.FAMILIES)
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
        family: Holm's family, one of :data:`~ripplekv.evaluation.reporting.stats.FAMILIES`.
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


def legend(methods: Sequence[str]) -> list[str]:
    """A markdown table: each method and what it computes.

    Args:
        methods: method names; names without a description print as they are.
    """
    lines = ["| method | what it computes |", "|---|---|"]
    for method in methods:
        lines.append(f"| {method} | {METHOD_DESCRIPTIONS.get(method, method)} |")
    return lines


def scorer_legend(scorers: Sequence[str]) -> list[str]:
    """A markdown table: each token scorer and what it ranks tokens by.

    Args:
        scorers: scorer names; names without a description print as they are.
    """
    lines = ["| scorer | what it ranks tokens by |", "|---|---|"]
    for scorer in scorers:
        lines.append(f"| {scorer} | {SCORER_DESCRIPTIONS.get(scorer, scorer)} |")
    return lines


def budget_label(budget: float) -> str:
    """``10%`` for a kept fraction, ``512 tokens per layer`` for a token budget.

    Args:
        budget: a kept fraction in (0, 1] or, above 1, tokens per layer.
    """
    return f"{100 * budget:g}%" if budget <= 1 else f"{budget:g} tokens per layer"


def _p(p: float) -> str:
    if not math.isfinite(p):
        return "nan"
    if p >= 1e-3:
        return f"{p:.2g}"
    return re.sub(r"e([+-])0*(\d)", lambda m: "e" + ("-" if m.group(1) == "-" else "") + m.group(2), f"{p:.1g}")


def _interval(stats: MetricStats, estimate: Estimate, sign: bool = False) -> str:
    fmt = stats.metric.fmt
    return f"{fmt(estimate.mean, sign)} [{fmt(estimate.low, sign)}, {fmt(estimate.high, sign)}]"


def _verdict(c: Comparison) -> str:
    return "significant" if c.significant else "not significant"


def _describe(stats: MetricStats, c: Comparison) -> str:
    return (
        f"{c.method} vs {c.other} {_interval(stats, c.difference, sign=True)}, {c.wins}/{c.ties}/{c.losses}, "
        f"p={_p(c.p)}, Holm p={_p(c.p_holm)}: {_verdict(c)}"
    )


def significance_method(run: RunStats) -> str:
    """One line: the test, its sign vectors and seed, and Holm's family (printed by ``ripplekv report``).

    Args:
        run: the run's statistics.
    """
    return (
        f"Test: {TEST_NAME}; exact up to {run.exact_max} samples, otherwise {run.draws} random sign vectors + the "
        f"identity (seed {run.seed}); Holm family: {FAMILIES[run.family]} (`--family {run.family}`)."
    )


def significance_lines(stats: MetricStats) -> dict[float, str]:
    """Budget -> one line naming each distinct comparison of that budget, its numbers and whether it is significant.

    Args:
        stats: one metric's analysis.
    """
    lines: dict[float, str] = {}
    for budget, tests in stats.tests.items():
        head = f"budget {budget_label(budget)} ({stats.metric.name}, {stats.metric.direction})"
        body = "; ".join(_describe(stats, c) for c in tests) if tests else "fewer than two compressed methods"
        lines[budget] = f"{head}: {body}"
    return lines


def rule_text(run: RunStats) -> str:
    """How the intervals, tests and the significance rule are computed (printed above the significance lines).

    Args:
        run: the run's statistics (their resamples, draws, seed, level and family).
    """
    level = f"{100 * run.confidence:g}%"
    return (
        f"Means: {level} BCa bootstrap intervals ({run.resamples} resamples, seed {run.seed}) of the macro mean "
        "(the mean over tasks of each task's mean), stratified by task: each resample draws every task's samples "
        "with replacement within that task; the acceleration is the jackknife over samples. Differences are "
        "`method - other` over the samples both have, paired; their estimate is the macro mean of the per-sample "
        "differences. W/T/L: samples where the method is better / equal / worse. p: the two-sided stratified "
        "sign-flip permutation test of that macro mean (each sample's difference flipped independently, the macro "
        f"mean recomputed with the same task weights; all 2^n sign vectors up to {run.exact_max} samples, otherwise "
        f"{run.draws} random ones plus the observed, p = (1 + #as extreme) / ({run.draws} + 1), seed {run.seed}). "
        f"The {level} interval of a difference inverts that test (the shifts delta it does not reject at "
        f"{1 - run.confidence:g}, same sign vectors), so the raw p < {ALPHA:g} exactly when it excludes 0. "
        f"Each method is compared with {BASELINE} and with the best other method at that budget (by the metric's "
        f"mean, {REFERENCE} excluded). **Significant** means: the Holm-adjusted p < {ALPHA:g}, Holm over "
        f"{FAMILIES[run.family]} (unordered pairs). A significant difference's interval always excludes 0; an "
        "interval that excludes 0 without significance is a raw p that does not survive Holm."
    )


def _caveat(run: RunStats) -> str | None:
    few = sorted(task for task, n in run.strata.items() if n < FEW_SAMPLES)
    if not few:
        return None
    smallest = min(run.strata[task] for task in few)
    return (
        f"Caveat: {len(few)} of {len(run.strata)} tasks have fewer than {FEW_SAMPLES} samples (the smallest "
        f"{smallest}). Resampling within a task of n samples understates its variance by the factor (n - 1) / n "
        "and gives a one-sample task none, so the means' bootstrap intervals are optimistic there (BCa does not "
        "fix that). The sign-flip tests and their intervals do not resample and hold at any task size."
    )


def markdown_significance(run: RunStats, suffix: str = "") -> list[str]:
    """The significance section: the rule, a small-sample caveat if needed, one bullet per metric and budget.

    Args:
        run: the run's statistics.
        suffix: appended to the section's title (a run over several scorers: which one).
    """
    lines = [f"## Significance{suffix}", "", significance_method(run), "", rule_text(run)]
    if run.incomplete:
        lines += [
            "",
            f"{run.incomplete} sample(s) without a row for every configuration are left out of the statistics.",
        ]
    caveat = _caveat(run)
    if caveat:
        lines += ["", caveat]
    lines.append("")
    for stats in run.metrics.values():
        lines += [f"- {line}" for line in significance_lines(stats).values()]
    for name, reason in run.skipped.items():
        lines.append(f"- {name}: skipped, {reason}")
    return lines


def _estimate_table(stats: MetricStats, methods: Sequence[str], budgets: Sequence[float]) -> list[str]:
    lines = ["| method | " + " | ".join(f"budget {b:g}" for b in budgets) + " |", "|---|" + "---|" * len(budgets)]
    for method in methods:
        cells = []
        for budget in budgets:
            estimate = stats.estimates.get((method, budget))
            if method == REFERENCE and estimate is None:
                estimate = next((e for (m, _), e in stats.estimates.items() if m == REFERENCE), None)
            cells.append("–" if estimate is None else _interval(stats, estimate))
        if any(cell != "–" for cell in cells):
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def _comparison_cells(stats: MetricStats, c: Comparison | None) -> list[str]:
    if c is None:
        return ["–"] * 4
    mark = " *" if c.significant else ""
    return [_interval(stats, c.difference, sign=True) + mark, f"{c.wins}/{c.ties}/{c.losses}", _p(c.p), _p(c.p_holm)]


def markdown_sections(run: RunStats, methods: Sequence[str], budgets: Sequence[float], suffix: str = "") -> list[str]:
    """Per metric: the table of means and intervals, then one table of paired differences per budget.

    Args:
        run: the run's statistics.
        methods: method names in report order.
        budgets: the compression budgets (table columns).
        suffix: appended to every title (a run over several scorers: which one).
    """
    lines: list[str] = []
    for name, stats in run.metrics.items():
        metric = stats.metric
        lines += ["", f"## {name} ({metric.direction}): mean and {100 * run.confidence:g}% interval{suffix}", ""]
        lines += [f"{metric.description[0].upper()}{metric.description[1:]}. The full cache is its own budget.", ""]
        lines += _estimate_table(stats, methods, budgets)
        for budget in budgets:
            versus = stats.versus.get(budget, {})
            if not versus:
                continue
            title = f"### {name} at budget {budget:g}{suffix}: paired differences (`method - other`; * significant)"
            lines += ["", title, ""]
            lines.append(
                f"| method | vs {BASELINE} | W/T/L | p | Holm p | best other | vs best other | W/T/L | p | Holm p |"
            )
            lines.append("|---|" + "---|" * 9)
            for method in methods:
                if method not in versus:
                    continue
                snap, best = versus[method].get("baseline"), versus[method].get("best_other")
                cells = [*_comparison_cells(stats, snap), "–" if best is None else best.other]
                cells += _comparison_cells(stats, best)
                lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


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
        "bootstrap_bca": None if c.bootstrap is None else _estimate_json(c.bootstrap),
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
        "caveat": _caveat(run),
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
        summary: the run's score tables (:func:`ripplekv.evaluation.reporting.report.summarize`).
        stats: the run's statistics, or ``None`` to leave them out.
        by_scorer: a run over several scorers: each scorer's methods and statistics
            (:func:`ripplekv.evaluation.reporting.by_scorer.scorers_json`), stored under ``statistics_by_scorer``.
    """
    timing = summary.timing
    document = {
        "format": "ripplekv-report/1",
        "suite": summary.suite,
        "model": summary.model,
        "protocol": summary.protocol,
        "tasks": list(summary.tasks),
        "methods": {m: METHOD_DESCRIPTIONS.get(m, m) for m in summary.methods},
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
