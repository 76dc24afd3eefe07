"""``ripplekv report``: tables, statistics and plots of an evaluation folder (``ripplekv eval``'s output).

A task's score for one (method, budget) is ``100 * mean`` of its sample scores (LongBench's ``task_score``; RULER's
string match and needle retrieval alike); the average is the mean over the tasks. Every cell also gives the
score as a percentage of the full cache on the same task (the ``full`` row, run once at budget 1.0, is shown
under every budget). For the needle suite each (context length, depth) cell is a task. For LongBench-E (``_e``)
tasks the report adds the official per-length view: each ``_e`` task's score within each length bucket (record
``length`` in words: 0-4k, 4-8k, 8k+), averaged over the ``_e`` tasks with samples in that bucket. Rows whose
``score`` is null (compressed configurations of a ``--score fidelity`` run) do not enter the score tables.

Statistics (:mod:`~ripplekv_eval.reporting.run_stats` over :mod:`~ripplekv_eval.reporting.stats` and
:mod:`~ripplekv_eval.reporting.comparisons`, printed by :mod:`~ripplekv_eval.reporting.tables` and
:mod:`~ripplekv_eval.reporting.json_format`): for ``score`` and each fidelity metric the rows hold, every (method,
budget)'s macro mean with a stratified BCa bootstrap interval, each method's paired difference to SnapKV and to the best
other method with the stratified sign-flip permutation test of its macro mean and the interval inverting it,
Holm-adjusted significance over a stated family, and one significance line per budget and metric. Strata are the rows'
``task`` (the needle suite's rows form one task: its length x depth cells hold too few samples to resample within). A
legend says what each method computes.

A run over several token scorers (``eval --scorers``) is analysed per scorer
(:mod:`~ripplekv_eval.reporting.by_scorer`): the allocation x scorer matrices, one verdict line per scorer and
budget, and the statistics of each scorer.

Formats: ``md`` (tables, statistics), ``csv`` (the score tables), ``json`` (everything, for generated READMEs).
Plots: :mod:`~ripplekv_eval.reporting.plots`.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ripplekv_eval.reporting.by_scorer import analyse_by_scorer, markdown_by_scorer, row_scorers, scorers_json
from ripplekv_eval.reporting.json_format import format_json
from ripplekv_eval.reporting.run_stats import RunStats, analyse_run
from ripplekv_eval.reporting.significance import DEFAULT_DRAWS, DEFAULT_FAMILY
from ripplekv_eval.reporting.stats import DEFAULT_RESAMPLES
from ripplekv_eval.reporting.summary import AVERAGE, RunSummary, Timing, load_run, needle_task, summarize
from ripplekv_eval.reporting.tables import legend, markdown_sections, markdown_significance, scorer_legend
from ripplekv_eval.sample import FULL_BUDGET

__all__ = [
    "FORMATS",
    "RunSummary",
    "Timing",
    "format_csv",
    "format_json",
    "format_markdown",
    "load_run",
    "needle_task",
    "report",
    "summarize",
    "write_plots",
]

FORMATS = ("md", "csv", "json")


def _cell(summary: RunSummary, task: str, method: str, budget: float) -> str:
    score = summary.value(task, method, budget)
    if score is None:
        return "–"
    percent = summary.percent_of_full(task, method, budget)
    return f"{score:.2f}" + (f" ({percent:.1f}%)" if percent is not None else "")


def _md_table(summary: RunSummary, task: str) -> list[str]:
    header = "| method | " + " | ".join(f"budget {b:g}" for b in summary.budgets) + " |"
    lines = [header, "|---|" + "---|" * len(summary.budgets)]
    for method in summary.methods:
        cells = [_cell(summary, task, method, b) for b in summary.budgets]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def format_markdown(
    summary: RunSummary,
    stats: RunStats | None = None,
    by_scorer: Mapping[str, tuple[RunStats, list[str]]] | None = None,
) -> str:
    """Markdown: the methods, the significance lines and statistics (with ``stats``), then the score tables.

    Args:
        summary: the run's score tables.
        stats: the run's statistics (:func:`ripplekv_eval.reporting.run_stats.analyse_run`), or ``None`` to leave
            them out.
        by_scorer: a run over several token scorers: each scorer's statistics and methods
            (:func:`ripplekv_eval.reporting.by_scorer.analyse_by_scorer`), printed as the allocation x scorer
            matrices and one statistics part per scorer (instead of ``stats``).
    """
    lines = [f"# {summary.suite} evaluation: {summary.model} ({summary.protocol})", ""]
    lines.append(
        "Scores are 100 x the mean sample score; in brackets, the percentage of the full cache's score on the "
        "same task. The full cache runs once per sample and is shown under every budget. Every table's methods are "
        "those of the Methods table."
    )
    if summary.expected_rows is not None and summary.rows < summary.expected_rows:
        lines += ["", f"**Incomplete run**: {summary.rows} of {summary.expected_rows} results."]
    if not summary.has_full:
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
        lines += ["", "## Token scorers", "", *scorer_legend(list(by_scorer))]
        lines += ["", *markdown_by_scorer(by_scorer, summary.budgets)]
    else:
        lines += ["", "## Methods", "", *legend(summary.methods)]
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
    for task in (AVERAGE, *summary.group_sizes, *summary.tasks):
        for method in summary.methods:
            for budget in [FULL_BUDGET] if method == "full" else summary.budgets:
                score = summary.value(task, method, budget)
                if score is None:
                    continue
                percent = summary.percent_of_full(task, method, budget)
                samples = summary.counts.get((task, method, budget), "")
                writer.writerow(
                    [task, method, f"{budget:g}", f"{score:.2f}", "" if percent is None else f"{percent:.2f}", samples]
                )
    return buffer.getvalue()


def write_plots(summary: RunSummary, directory: str | os.PathLike[str]) -> list[Path]:
    """Write the report's PNG plots into ``directory`` (see :mod:`~ripplekv_eval.reporting.plots`); their paths.

    Args:
        summary: the run's score tables.
        directory: the output folder (created if needed).
    """
    from ripplekv_eval.reporting.plots import write_plots as _write_plots

    return _write_plots(summary, directory)


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
    """The report of an evaluation folder as text; plots go to ``plots`` when given.

    Args:
        run_dir: the evaluation folder (``config.json`` and ``results.jsonl``).
        fmt: ``md`` (tables and statistics), ``csv`` (score tables) or ``json`` (everything).
        plots: a folder for the PNG plots, or ``None``.
        metrics: the metrics of the statistics (default: every metric the rows hold).
        seed: the seed of the bootstrap and of the sign-flip test.
        resamples: bootstrap resamples per interval of a mean.
        draws: random sign vectors per comparison (beyond ``EXACT_MAX`` samples).
        family: Holm's family (``budget``: one metric at one budget; ``metric``: one metric over all budgets).
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    config, rows = load_run(run_dir)
    summary = summarize(config, rows)
    if plots is not None:
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
