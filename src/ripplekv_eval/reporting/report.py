"""``ripplekv report``: tables, statistics (:mod:`~ripplekv_eval.reporting.stats`: the score and every fidelity metric)
and plots of an evaluation folder; a run over several token scorers is analysed per scorer (schedules compared over
one scorer, Holm within it)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from ripplekv.presses.descriptions import SCORER_DESCRIPTIONS, describe_method
from ripplekv_eval.reporting.stats import (
    ALPHA,
    BASELINE,
    DEFAULT_DRAWS,
    DEFAULT_FAMILY,
    DEFAULT_RESAMPLES,
    FAMILIES,
    REFERENCE,
    TEST_NAME,
    Comparison,
    Estimate,
    MetricStats,
    RunStats,
    analyse_run,
)
from ripplekv_eval.reporting.summary import AVERAGE, RunSummary, load_run, summarize
from ripplekv_eval.sample import DEFAULT_SCORER, FULL_BUDGET, row_scorer, scored_methods, split_configuration

FORMATS = ("md", "csv", "json")
FEW_SAMPLES = 5  # tasks with fewer samples get the small-sample caveat
PRIMARY = "ripplekv"  # the method whose difference to the best other schedule each per-scorer verdict line gives

ByScorer = Mapping[str, tuple[RunStats, list[str]]]


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a markdown table."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def legend(methods: Sequence[str]) -> list[str]:
    """A markdown table: each method and what it computes (a spec names its parameters)."""
    return md_table(["method", "what it computes"], [[m, describe_method(m)] for m in methods])


def scorer_legend(scorers: Sequence[str]) -> list[str]:
    """A markdown table: each token scorer and what it ranks tokens by."""
    return md_table(["scorer", "what it ranks tokens by"], [[s, SCORER_DESCRIPTIONS.get(s, s)] for s in scorers])


SETTING_SOURCES_TEXT = {
    "profile": "the profile's chosen setting",
    "explicit": "given in the method's name",
    "default": "the defaults (the profile records no setting)",
}


def settings_lines(summary: RunSummary) -> list[str]:
    """The RippleKV settings that ran and where they came from (none for rows written before sources were
    recorded)."""
    if not summary.settings:
        return []
    rows = [
        [name, f"{r:g}", f"{gamma:g}", SETTING_SOURCES_TEXT.get(source, source)]
        for name, (r, gamma, source) in summary.settings.items()
    ]
    return ["", "RippleKV settings that ran:", "", *md_table(["method", "r", "gamma", "from"], rows)]


def budget_label(budget: float) -> str:
    """``10%`` for a kept fraction, ``512 tokens per layer`` for a token budget."""
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
    """One line: the test, its sign vectors and seed, and Holm's family (printed by ``ripplekv report``)."""
    return (
        f"Test: {TEST_NAME}; exact up to {run.exact_max} samples, otherwise {run.draws} random sign vectors + the "
        f"identity (seed {run.seed}); Holm family: {FAMILIES[run.family]} (`--family {run.family}`)."
    )


def significance_lines(stats: MetricStats) -> dict[float, str]:
    """Budget -> one line naming each distinct comparison of that budget, its numbers and whether it is significant."""
    lines: dict[float, str] = {}
    for budget, tests in stats.tests.items():
        head = f"budget {budget_label(budget)} ({stats.metric.name}, {stats.metric.direction})"
        body = "; ".join(_describe(stats, c) for c in tests) if tests else "fewer than two compressed methods"
        lines[budget] = f"{head}: {body}"
    return lines


def rule_text(run: RunStats) -> str:
    """How the intervals, tests and the significance rule are computed (printed above the significance lines)."""
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
    """The caveat printed when some task has fewer than :data:`FEW_SAMPLES` samples (None when none has)."""
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
    """The significance section: the rule, a small-sample caveat if needed, one bullet per metric and budget."""
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
    rows = []
    for method in methods:
        cells = []
        for budget in budgets:
            estimate = stats.estimates.get((method, budget))
            if method == REFERENCE and estimate is None:
                estimate = next((e for (m, _), e in stats.estimates.items() if m == REFERENCE), None)
            cells.append("–" if estimate is None else _interval(stats, estimate))
        if any(cell != "–" for cell in cells):
            rows.append([method, *cells])
    return md_table(["method", *(f"budget {b:g}" for b in budgets)], rows)


def _comparison_cells(stats: MetricStats, c: Comparison | None) -> list[str]:
    if c is None:
        return ["–"] * 4
    mark = " *" if c.significant else ""
    return [_interval(stats, c.difference, sign=True) + mark, f"{c.wins}/{c.ties}/{c.losses}", _p(c.p), _p(c.p_holm)]


def markdown_sections(run: RunStats, methods: Sequence[str], budgets: Sequence[float], suffix: str = "") -> list[str]:
    """Per metric: the table of means and intervals, then one table of paired differences per budget."""
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
            header = ["method", f"vs {BASELINE}", "W/T/L", "p", "Holm p", "best other", "vs best other", "W/T/L"]
            rows = []
            for method in [m for m in methods if m in versus]:
                snap, best = versus[method].get("baseline"), versus[method].get("best_other")
                other = "–" if best is None else best.other
                rows.append([method, *_comparison_cells(stats, snap), other, *_comparison_cells(stats, best)])
            lines += ["", title, "", *md_table([*header, "p", "Holm p"], rows)]
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
    }


def significance_record(run: RunStats) -> dict[str, Any]:
    """The test of every comparison: its name, sign vectors, seed, level, Holm's family."""
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
    """Every number of the statistics as plain JSON types (budgets as numbers inside the records)."""
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
    """JSON: the run, the methods and what they compute, every score-table cell, the timing and the statistics."""
    timing = summary.timing
    document = {
        "format": "ripplekv-report/1",
        "suite": summary.suite,
        "model": summary.model,
        "protocol": summary.protocol,
        "tasks": list(summary.tasks),
        "methods": {m: describe_method(m) for m in summary.methods},
        **(
            {"settings": {m: {"r": r, "gamma": g, "source": src} for m, (r, g, src) in summary.settings.items()}}
            if summary.settings
            else {}
        ),
        "budgets": list(summary.budgets),
        "rows": summary.rows,
        "expected_rows": summary.expected_rows,
        "scores": _score_records(summary),
        "longbench_e_groups": {g: {"tasks": t, "samples": n} for g, (t, n) in summary.group_sizes.items()},
        "timing": None
        if timing is None
        else {**asdict(timing), "total": timing.total, "speedup_estimate": _number(timing.speedup_estimate)},
        "statistics": None if stats is None else stats_json(stats),
        **({} if by_scorer is None else {"statistics_by_scorer": dict(by_scorer)}),
    }
    return json.dumps(document, indent=1, allow_nan=False) + "\n"


def primary_method(methods: Sequence[str] | Mapping[str, Any]) -> str | None:
    """The configuration standing for :data:`PRIMARY` among ``methods``: the plain name if present, else the first
    spec of the method (``ripplekv:r=16,gamma=12``), else None.
    """
    names = list(methods)
    if PRIMARY in names:
        return PRIMARY
    return next((m for m in names if m.partition(":")[0] == PRIMARY), None)


def row_scorers(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The scorers of a run's rows, in the order they first appear (a run whose rows name none ran SnapKV's)."""
    scored = scored_methods(rows)
    found: dict[str, None] = {}
    for row in rows:
        scorer = row_scorer(row, scored)
        if scorer is not None:
            found.setdefault(scorer, None)
    return list(found) if found or not rows else [DEFAULT_SCORER]


def rows_of_scorer(
    rows: Sequence[Mapping[str, Any]], methods: Sequence[str], scorer: str
) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows whose scorer is ``scorer`` or none, under their plain method names (``scorer`` set to null) so the
    analysis compares schedules over one scorer, and the method names in report order."""
    scored = scored_methods(rows)
    kept = [{**row, "scorer": None} for row in rows if row_scorer(row, scored) in (None, scorer)]
    present = {str(row["method"]) for row in kept}
    order = dict.fromkeys(split_configuration(name)[0] for name in methods)
    return kept, [m for m in order if m in present] + sorted(present - set(order))


def analyse_by_scorer(
    rows: Sequence[Mapping[str, Any]], methods: Sequence[str], budgets: Sequence[float], *args: Any, **options: Any
) -> dict[str, tuple[RunStats, list[str]]]:
    """Per scorer of the rows: its statistics (:func:`~ripplekv_eval.reporting.stats.analyse_run` over
    :func:`rows_of_scorer`, with its further arguments ``args`` and ``options``) and its method names."""
    analysed: dict[str, tuple[RunStats, list[str]]] = {}
    for scorer in row_scorers(rows):
        kept, names = rows_of_scorer(rows, methods, scorer)
        analysed[scorer] = (analyse_run(kept, names, budgets, *args, **options), names)
    return analysed


def verdict_lines(by_scorer: ByScorer, metric: str) -> list[str]:
    """One line per budget and scorer: RippleKV's paired difference to the best other schedule over that scorer.

    Each part says whether RippleKV is better, worse or tied (a zero mean difference) for the metric's direction.
    """
    lines: list[str] = []
    budgets = sorted({b for run, _ in by_scorer.values() if metric in run.metrics for b in run.metrics[metric].versus})
    for budget in budgets:
        parts = []
        for scorer, (run, _) in by_scorer.items():
            stats = run.metrics.get(metric)
            versus = {} if stats is None else stats.versus.get(budget, {})
            best = versus.get(primary_method(versus) or PRIMARY, {}).get("best_other")
            if stats is None or best is None:
                continue
            d = best.difference
            # no difference is neither better nor worse, whichever way the metric points
            side = "tied" if d.mean == 0 else "better" if (d.mean > 0) == stats.metric.higher_is_better else "worse"
            parts.append(
                f"{scorer}: vs {best.other} {_interval(stats, d, sign=True)}, {best.wins}/{best.ties}/{best.losses}, "
                f"Holm p={best.p_holm:.2g}, {side}, {_verdict(best)}"
            )
        if parts:
            lines.append(f"- budget {budget_label(budget)} ({metric}): " + "; ".join(parts))
    return lines


def markdown_by_scorer(by_scorer: ByScorer, budgets: Sequence[float]) -> list[str]:
    """The allocation x scorer matrices (one per metric and budget) and the per-scorer verdict lines."""
    scorers = list(by_scorer)
    methods = dict.fromkeys(n for _, names in by_scorer.values() for n in names if n != REFERENCE)
    metrics = dict.fromkeys(m for run, _ in by_scorer.values() for m in run.metrics)
    lines = [
        "## Allocation x scorer",
        "",
        "Each scorer's rows are analysed as a run of their own: every schedule is compared with the others over "
        f"the same token scorer (Holm within the scorer). Per budget and scorer, {PRIMARY}'s paired difference to "
        "the best other schedule over that scorer:",
        "",
    ]
    for metric in metrics:
        lines += verdict_lines(by_scorer, metric)
    for metric in metrics:
        for budget in budgets:
            some = next(run.metrics[metric] for run, _ in by_scorer.values() if metric in run.metrics)
            lines += ["", f"### {metric} at budget {budget_label(budget)} ({some.metric.direction})", ""]
            lines += ["| schedule | " + " | ".join(scorers) + " |", "|---|" + "---|" * len(scorers)]
            for method in methods:
                cells = []
                for run, _ in by_scorer.values():
                    stats = run.metrics.get(metric)
                    estimate = None if stats is None else stats.estimates.get((method, budget))
                    cells.append("–" if stats is None or estimate is None else _interval(stats, estimate))
                lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def scorers_json(by_scorer: ByScorer) -> dict[str, Any]:
    """Per scorer: its methods and :func:`stats_json` of its statistics."""
    return {scorer: {"methods": names, "statistics": stats_json(run)} for scorer, (run, names) in by_scorer.items()}


def _cell(summary: RunSummary, task: str, method: str, budget: float) -> str:
    score = summary.value(task, method, budget)
    if score is None:
        return "–"
    percent = summary.percent_of_full(task, method, budget)
    return f"{score:.2f}" + (f" ({percent:.1f}%)" if percent is not None else "")


def _md_table(summary: RunSummary, task: str) -> list[str]:
    header = ["method", *(f"budget {b:g}" for b in summary.budgets)]
    return md_table(header, [[m, *(_cell(summary, task, m, b) for b in summary.budgets)] for m in summary.methods])


def format_markdown(
    summary: RunSummary,
    stats: RunStats | None = None,
    by_scorer: ByScorer | None = None,
) -> str:
    """Markdown: the methods, the significance lines and statistics (with ``stats``), then the score tables."""
    lines = [f"# {summary.suite} evaluation: {summary.model} ({summary.protocol})", ""]
    lines.append(
        "Scores are 100 x the mean sample score; in brackets, the percentage of the full cache's score on the "
        "same task. The full cache runs once per sample and is shown under every budget. Every table's methods are "
        "those of the Methods table."
    )
    if summary.expected_rows is not None and summary.rows < summary.expected_rows:
        lines += ["", f"**Incomplete run**: {summary.rows} of {summary.expected_rows} results."]
    if "full" not in summary.methods:
        lines += ["", "No full-cache results: percentages of full are not available."]
    if summary.timing is not None:
        t = summary.timing
        lines += [
            "",
            f"Compute logged: {t.total:.1f} s over {t.samples} samples: {t.shared_prefill:.1f} s of shared prefills "
            f"(one per sample), {t.derived:.1f} s compressing and decoding the configurations derived from them, "
            f"{t.own_prefill:.1f} s for configurations that need their own prefill. With one prefill per derived "
            f"configuration those would have taken about {t.separate_estimate:.1f} s instead of "
            f"{t.shared_prefill + t.derived:.1f} s ({t.speedup_estimate:.2f}x, estimated from the logged prefill "
            "times).",
        ]
    if by_scorer:
        plain = dict.fromkeys(m for _, names in by_scorer.values() for m in names)
        lines += ["", "## Methods (schedules)", "", *legend(list(plain))]
        lines += settings_lines(summary)
        lines += ["", "## Token scorers", "", *scorer_legend(list(by_scorer))]
        lines += ["", *markdown_by_scorer(by_scorer, summary.budgets)]
    else:
        lines += ["", "## Methods", "", *legend(summary.methods), *settings_lines(summary)]
    if stats is not None and not by_scorer:
        lines += ["", *markdown_significance(stats)]
    lines += ["", f"## Average over {len(summary.tasks)} tasks", "", *_md_table(summary, AVERAGE)]
    if stats is not None and not by_scorer:
        lines += markdown_sections(stats, summary.methods, summary.budgets)
    for scorer, (run, names) in (by_scorer or {}).items():
        suffix = f" (scorer {scorer})"
        lines += ["", *markdown_significance(run, suffix), *markdown_sections(run, names, summary.budgets, suffix)]
    for group, (n_tasks, n_samples) in summary.group_sizes.items():
        title = f"## {group} words: average over {n_tasks} `_e` tasks ({n_samples} samples)"
        lines += ["", title, "", *_md_table(summary, group)]
    for task in summary.tasks:
        counts = {summary.counts.get((task, m, b)) for m in summary.methods for b in (*summary.budgets, FULL_BUDGET)}
        n = max((c for c in counts if c is not None), default=0)
        lines += ["", f"## {task} ({n} samples)", "", *_md_table(summary, task)]
    return "\n".join(lines) + "\n"


def format_csv(summary: RunSummary) -> str:
    """CSV, one line per (task or ``average``, method, budget): score, percent of full, samples."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["task", "method", "budget", "score", "percent_of_full", "samples"])
    for r in _score_records(summary):
        percent = "" if r["percent_of_full"] is None else f"{r['percent_of_full']:.2f}"
        samples = "" if r["samples"] is None else r["samples"]
        writer.writerow([r["task"], r["method"], f"{r['budget']:g}", f"{r['score']:.2f}", percent, samples])
    return buffer.getvalue()


def report(
    run_dir: str | os.PathLike[str],
    fmt: str = "md",
    plots: str | os.PathLike[str] | None = None,
    metrics: Sequence[str] | None = None,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
    draws: int = DEFAULT_DRAWS,
    family: str = DEFAULT_FAMILY,
) -> str:
    """The report of an evaluation folder as text; plots go to ``plots`` when given."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    config, rows = load_run(run_dir)
    summary = summarize(config, rows)
    if plots is not None:
        from ripplekv_eval.reporting.plots import write_plots

        write_plots(summary, plots)
    if fmt == "csv":
        return format_csv(summary)
    options = {"seed": seed, "resamples": resamples, "draws": draws, "family": family}
    if len(row_scorers(rows)) > 1:  # statistics per scorer: schedules compared over one scorer at a time
        by_scorer = analyse_by_scorer(rows, summary.methods, summary.budgets, metrics, **options)
        if fmt == "md":
            return format_markdown(summary, None, by_scorer)
        return format_json(summary, None, scorers_json(by_scorer))
    stats = analyse_run(rows, summary.methods, summary.budgets, metrics, **options)
    return format_markdown(summary, stats) if fmt == "md" else format_json(summary, stats)
