"""The statistics of ``ripplekv report`` in markdown: legends, significance lines, tables of means and differences.

:func:`markdown_significance`, :func:`markdown_sections` and :func:`significance_lines` print a run's statistics
(:func:`~ripplekv_eval.reporting.run_stats.analyse_run`). :func:`legend` says what each method computes
(``ripplekv.presses.descriptions.describe_method``: a method spec names its parameters; unknown names print as
they are).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from ripplekv.presses.descriptions import SCORER_DESCRIPTIONS, describe_method
from ripplekv_eval.reporting.comparisons import BASELINE, REFERENCE, Comparison, MetricStats
from ripplekv_eval.reporting.run_stats import RunStats
from ripplekv_eval.reporting.significance import FAMILIES, TEST_NAME
from ripplekv_eval.reporting.stats import ALPHA, Estimate

__all__ = [
    "FEW_SAMPLES",
    "budget_label",
    "legend",
    "markdown_sections",
    "markdown_significance",
    "rule_text",
    "scorer_legend",
    "significance_lines",
    "significance_method",
    "small_sample_caveat",
]

FEW_SAMPLES = 5  # tasks with fewer samples get the small-sample caveat


def legend(methods: Sequence[str]) -> list[str]:
    """A markdown table: each method and what it computes.

    Args:
        methods: method names; names without a description print as they are.
    """
    lines = ["| method | what it computes |", "|---|---|"]
    for method in methods:
        lines.append(f"| {method} | {describe_method(method)} |")
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
        f"Means: {level} BCa bootstrap intervals (scipy.stats.bootstrap, {run.resamples} resamples, seed {run.seed}) "
        "of the macro mean (the mean over tasks of each task's mean), stratified by task: each resample draws every "
        "task's samples with replacement within that task; the acceleration is the jackknife over samples within "
        "each task. Differences are "
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


def small_sample_caveat(run: RunStats) -> str | None:
    """The caveat printed when some task has fewer than :data:`FEW_SAMPLES` samples (None when none has).

    Args:
        run: the run's statistics (its strata).
    """
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
    caveat = small_sample_caveat(run)
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
