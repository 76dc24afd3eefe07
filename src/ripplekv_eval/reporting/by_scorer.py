"""The report of a run over several token scorers: one analysis per scorer and the allocation x scorer matrix.

A run with ``--scorers a,b,...`` holds every method built on a scorer once per scorer (rows record ``method`` and
``scorer``; reports name the configuration ``method@scorer``, :mod:`ripplekv_eval.sample`). Comparing a
schedule under one scorer with another schedule under another mixes the two axes, so the statistics are computed
**per scorer**: the rows of one scorer (and those of the methods without a scorer, the full cache's among them)
are analysed as a run of their own, the methods under their plain names, each method against ``snapkv`` (the
uniform schedule over the same scorer) and against the best other schedule over the same scorer, with Holm's
family taken within that scorer. The matrix then shows every schedule's mean under every scorer, and one line per
scorer and budget gives RippleKV's paired difference to the best other schedule over that scorer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ripplekv_eval.reporting.comparisons import REFERENCE
from ripplekv_eval.reporting.json_format import stats_json
from ripplekv_eval.reporting.run_stats import RunStats, analyse_run
from ripplekv_eval.reporting.significance import DEFAULT_DRAWS, DEFAULT_FAMILY
from ripplekv_eval.reporting.stats import DEFAULT_RESAMPLES
from ripplekv_eval.reporting.tables import budget_label
from ripplekv_eval.sample import DEFAULT_SCORER, row_scorer, scored_methods, split_configuration

__all__ = [
    "PRIMARY",
    "analyse_by_scorer",
    "primary_method",
    "markdown_by_scorer",
    "row_scorers",
    "rows_of_scorer",
    "scorers_json",
]

PRIMARY = "ripplekv"
"""The method whose paired difference to the best other schedule each verdict line gives (under its parameters,
``ripplekv:r=16,gamma=12``, when the run holds it so: :func:`primary_method`)."""


def primary_method(methods: Sequence[str] | Mapping[str, Any]) -> str | None:
    """The configuration standing for :data:`PRIMARY` among ``methods``: the plain name if present, else the first
    spec of the method (``ripplekv:r=16,gamma=12``), else None.

    Args:
        methods: method names or specs (a mapping's keys).
    """
    names = list(methods)
    if PRIMARY in names:
        return PRIMARY
    return next((m for m in names if m.partition(":")[0] == PRIMARY), None)


def row_scorers(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The scorers of a run's rows, in the order they first appear (a run whose rows name none ran SnapKV's).

    Args:
        rows: result rows.
    """
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
    """The rows of one scorer as a run of their own, and its method names in report order.

    The rows are those whose scorer is ``scorer`` or none (methods without a scorer; a row without the field is read
    as :func:`row_scorers` reads it); each is returned under its plain method name (its ``scorer`` field set to
    null), so the analysis compares schedules over one scorer.

    Args:
        rows: the run's result rows.
        methods: the run's configuration names in report order (``full``, ``snapkv``, ``snapkv@tova``, ...).
        scorer: the scorer.
    """
    scored = scored_methods(rows)
    kept = [{**row, "scorer": None} for row in rows if row_scorer(row, scored) in (None, scorer)]
    present = {str(row["method"]) for row in kept}
    order = dict.fromkeys(split_configuration(name)[0] for name in methods)
    return kept, [m for m in order if m in present] + sorted(present - set(order))


def analyse_by_scorer(
    rows: Sequence[Mapping[str, Any]],
    methods: Sequence[str],
    budgets: Sequence[float],
    metrics: Sequence[str] | None = None,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
    draws: int = DEFAULT_DRAWS,
    family: str = DEFAULT_FAMILY,
) -> dict[str, tuple[RunStats, list[str]]]:
    """Per scorer of the rows: its statistics (:func:`~ripplekv_eval.reporting.run_stats.analyse_run` over
    :func:`rows_of_scorer`) and its method names.

    Args:
        rows: the run's result rows.
        methods: the run's configuration names in report order.
        budgets: the compression budgets.
        metrics: metric names to report (None: all the rows hold).
        seed: the seed of the bootstrap and of the sign-flip test.
        resamples: bootstrap resamples per interval of a mean.
        draws: random sign vectors per comparison.
        family: Holm's family, within each scorer.
    """
    analysed: dict[str, tuple[RunStats, list[str]]] = {}
    for scorer in row_scorers(rows):
        kept, names = rows_of_scorer(rows, methods, scorer)
        stats = analyse_run(kept, names, budgets, metrics, seed=seed, resamples=resamples, draws=draws, family=family)
        analysed[scorer] = (stats, names)
    return analysed


def _cell(run: RunStats, metric: str, method: str, budget: float) -> str:
    stats = run.metrics[metric]
    estimate = stats.estimates.get((method, budget))
    if estimate is None:
        return "–"
    fmt = stats.metric.fmt
    return f"{fmt(estimate.mean)} [{fmt(estimate.low)}, {fmt(estimate.high)}]"


def verdict_lines(by_scorer: Mapping[str, tuple[RunStats, list[str]]], metric: str) -> list[str]:
    """One line per budget and scorer: RippleKV's paired difference to the best other schedule over that scorer.

    Each part says whether RippleKV is better, worse or tied (a zero mean difference) for the metric's direction.

    Args:
        by_scorer: :func:`analyse_by_scorer`'s result.
        metric: the metric.
    """
    lines: list[str] = []
    budgets = sorted({b for run, _ in by_scorer.values() if metric in run.metrics for b in run.metrics[metric].versus})
    for budget in budgets:
        parts = []
        for scorer, (run, _) in by_scorer.items():
            stats = run.metrics.get(metric)
            versus = {} if stats is None else stats.versus.get(budget, {})
            best = versus.get(primary_method(versus) or PRIMARY, {}).get("best_other")
            if best is None:
                continue
            fmt = stats.metric.fmt  # type: ignore[union-attr]
            d = best.difference
            verdict = "significant" if best.significant else "not significant"
            higher_is_better = stats.metric.higher_is_better  # type: ignore[union-attr]
            # no difference is neither better nor worse, whichever way the metric points
            side = "tied" if d.mean == 0 else "better" if (d.mean > 0) == higher_is_better else "worse"
            parts.append(
                f"{scorer}: vs {best.other} {fmt(d.mean, True)} [{fmt(d.low, True)}, {fmt(d.high, True)}], "
                f"{best.wins}/{best.ties}/{best.losses}, Holm p={best.p_holm:.2g}, {side}, {verdict}"
            )
        if parts:
            lines.append(f"- budget {budget_label(budget)} ({metric}): " + "; ".join(parts))
    return lines


def markdown_by_scorer(by_scorer: Mapping[str, tuple[RunStats, list[str]]], budgets: Sequence[float]) -> list[str]:
    """The allocation x scorer matrices (one per metric and budget) and the per-scorer verdict lines.

    Args:
        by_scorer: :func:`analyse_by_scorer`'s result.
        budgets: the compression budgets.
    """
    scorers = list(by_scorer)
    methods: dict[str, None] = {}
    for _, names in by_scorer.values():
        methods.update(dict.fromkeys(n for n in names if n != REFERENCE))
    metrics: dict[str, None] = {}
    for run, _ in by_scorer.values():
        metrics.update(dict.fromkeys(run.metrics))
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
                cells = [
                    _cell(run, metric, method, budget) if metric in run.metrics else "–"
                    for run, _ in by_scorer.values()
                ]
                lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def scorers_json(by_scorer: Mapping[str, tuple[RunStats, list[str]]]) -> dict[str, Any]:
    """Per scorer: its methods and its statistics as :func:`~ripplekv_eval.reporting.json_format.stats_json` gives
    them.

    Args:
        by_scorer: :func:`analyse_by_scorer`'s result.
    """
    return {scorer: {"methods": names, "statistics": stats_json(run)} for scorer, (run, names) in by_scorer.items()}
