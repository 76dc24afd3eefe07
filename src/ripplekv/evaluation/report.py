"""``ripplekv report``: tables, statistics and plots of an evaluation folder (:mod:`~ripplekv.evaluation.runner`).

A task's score for one (method, budget) is ``100 * mean`` of its sample scores (LongBench's ``task_score``; RULER's
string match and needle retrieval alike); the average is the mean over the tasks. Every cell also gives the
score as a percentage of the full cache on the same task (the ``full`` row, run once at budget 1.0, is shown
under every budget). For the needle suite each (context length, depth) cell is a task. For LongBench-E (``_e``)
tasks the report adds the official per-length view: each ``_e`` task's score within each length bucket (record
``length`` in words: 0-4k, 4-8k, 8k+), averaged over the ``_e`` tasks with samples in that bucket. Rows whose
``score`` is null (compressed configurations of a ``--score fidelity`` run) do not enter the score tables.

Statistics (:mod:`~ripplekv.evaluation.stats`, printed by :mod:`~ripplekv.evaluation.tables`): for ``score`` and
each fidelity metric the rows hold, every (method, budget)'s macro mean with a stratified BCa bootstrap interval,
each method's paired difference to SnapKV and to the best other method with the stratified sign-flip permutation
test of its macro mean and the interval inverting it, Holm-adjusted significance over a stated family, and one
significance line per budget and metric. Strata are the rows' ``task`` (the needle suite's rows form one
task: its length x depth cells hold too few samples to resample within). A legend says what each method computes.

Formats: ``md`` (tables, statistics), ``csv`` (the score tables), ``json`` (everything, for generated READMEs).
Plots: :mod:`~ripplekv.evaluation.plots`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ripplekv.evaluation.longbench import LONGBENCH_E_BUCKETS, length_bucket
from ripplekv.evaluation.runner import CONFIG_FILE, FULL_BUDGET, RESULTS_FILE, ResultsLog
from ripplekv.evaluation.stats import DEFAULT_DRAWS, DEFAULT_FAMILY, DEFAULT_RESAMPLES
from ripplekv.evaluation.tables import (
    AVERAGE,
    RunStats,
    analyse_run,
    format_json,
    legend,
    markdown_sections,
    markdown_significance,
)

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


@dataclass(frozen=True)
class Timing:
    """Compute logged by a run, in seconds (rows without timing fields are skipped).

    ``shared_prefill``: one recorded prefill per sample (the first logged value of each sample's derived rows);
    ``derived``: compression + decoding of the configurations derived from it; ``own_prefill``: configurations
    that ran their own prefill (prefill + decoding); ``separate_estimate``: what the derived configurations would
    have cost with one prefill each (their logged prefill time added to each of them).
    """

    samples: int
    shared_prefill: float
    derived: float
    own_prefill: float
    separate_estimate: float

    @property
    def total(self) -> float:
        return self.shared_prefill + self.derived + self.own_prefill

    @property
    def speedup_estimate(self) -> float:
        shared = self.shared_prefill + self.derived
        return self.separate_estimate / shared if shared > 0 else math.nan


@dataclass(frozen=True)
class RunSummary:
    """Scores of one run, aggregated per task."""

    suite: str
    model: str
    protocol: str
    tasks: tuple[str, ...]  # in run order ("L=<length> depth=<depth>" for needles)
    methods: tuple[str, ...]  # in configuration order, full first
    budgets: tuple[float, ...]  # the compression budgets (not full's 1.0)
    scores: dict[tuple[str, str, float], float]  # (task, method, budget) -> 100 * mean sample score
    counts: dict[tuple[str, str, float], int]  # samples behind each score
    average: dict[tuple[str, float], float]  # (method, budget) -> mean over the tasks that have a score
    needle_cells: dict[str, tuple[int, float]]  # task -> (length, depth), needle suite only
    rows: int
    expected_rows: int | None
    # LongBench-E: (group, method, budget) -> mean over the ``_e`` tasks of their score within one length bucket;
    # group names are ``"LongBench-E <bucket>"``; ``group_sizes`` gives (tasks, samples) behind each group
    groups: dict[tuple[str, str, float], float] = field(default_factory=dict)
    group_sizes: dict[str, tuple[int, int]] = field(default_factory=dict)
    timing: Timing | None = None

    @property
    def has_full(self) -> bool:
        return "full" in self.methods

    def value(self, task: str, method: str, budget: float) -> float | None:
        """A task's score (``task == "average"`` for the average); full's is the same under every budget."""
        b = FULL_BUDGET if method == "full" else budget
        if task == AVERAGE:
            return self.average.get((method, b))
        if task in self.group_sizes:
            return self.groups.get((task, method, b))
        return self.scores.get((task, method, b))

    def percent_of_full(self, task: str, method: str, budget: float) -> float | None:
        score, full = self.value(task, method, budget), self.value(task, "full", FULL_BUDGET)
        if score is None or full is None or full == 0:
            return None
        return 100.0 * score / full


def load_run(run_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The saved ``config.json`` and the complete rows of ``results.jsonl`` of an evaluation folder."""
    run = Path(run_dir)
    config_path = run / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"{run} is not an evaluation folder: {CONFIG_FILE} not found")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_path} is not valid JSON: {err}") from None
    rows = ResultsLog(run / RESULTS_FILE).read()
    if not rows:
        raise ValueError(f"{run / RESULTS_FILE} holds no results yet")
    return config, rows


def needle_task(length: int, depth: float) -> str:
    """The report's task name of a needle cell."""
    return f"L={length} depth={depth:g}"


def summarize(config: dict[str, Any], rows: Sequence[dict[str, Any]]) -> RunSummary:
    """Aggregate rows per (task, method, budget)."""
    settings = config.get("config", {})
    suite = str(settings.get("suite", ""))
    samples: dict[tuple[str, str, float], list[float]] = defaultdict(list)
    tasks: list[str] = []
    needle_cells: dict[str, tuple[int, float]] = {}
    for row in rows:
        if suite == "needle":
            meta = row.get("meta", {})
            length, depth = int(meta["length"]), float(meta["depth"])
            task = needle_task(length, depth)
            needle_cells[task] = (length, depth)
        else:
            task = str(row["task"])
        if task not in tasks:
            tasks.append(task)
        if row.get("score") is not None:  # null: not decoded (``--score fidelity``)
            samples[task, str(row["method"]), float(row["budget"])].append(float(row["score"]))
    if suite == "needle":
        tasks.sort(key=lambda t: needle_cells[t])
    configured = [str(m) for m in settings.get("methods", [])]
    seen = [m for m in dict.fromkeys(str(row["method"]) for row in rows)]
    methods = [m for m in configured if m in seen] + [m for m in seen if m not in configured]
    if "full" in methods:
        methods.remove("full")
        methods.insert(0, "full")
    budgets = [float(b) for b in settings.get("budgets", [])]
    budgets += sorted({float(r["budget"]) for r in rows if r["method"] != "full"} - set(budgets))
    exact = {key: 100.0 * sum(v) / len(v) for key, v in samples.items()}
    scores = {key: round(value, 2) for key, value in exact.items()}
    counts = {key: len(v) for key, v in samples.items()}
    average: dict[tuple[str, float], float] = {}  # from unrounded task scores: the statistics' macro mean
    for method in methods:
        for budget in [FULL_BUDGET] if method == "full" else budgets:
            values = [exact[t, method, budget] for t in tasks if (t, method, budget) in exact]
            if values:
                average[method, budget] = round(sum(values) / len(values), 2)
    expected = None
    sample_count = settings.get("samples", {}).get("count")
    if isinstance(sample_count, int):
        n_configs = ("full" in configured) + len([m for m in configured if m != "full"]) * len(
            settings.get("budgets", [])
        )
        expected = sample_count * n_configs
    groups, group_sizes = _longbench_e_groups(rows) if suite == "longbench" else ({}, {})
    timing = _timing(rows)
    model = settings.get("model", {})
    return RunSummary(
        suite=suite,
        model=str(model.get("name_or_path", "")) if isinstance(model, dict) else str(model),
        protocol=str(settings.get("protocol", "")),
        tasks=tuple(tasks),
        methods=tuple(methods),
        budgets=tuple(budgets),
        scores=scores,
        counts=counts,
        average=average,
        needle_cells=needle_cells,
        rows=len(rows),
        expected_rows=expected,
        groups=groups,
        group_sizes=group_sizes,
        timing=timing,
    )


def _timing(rows: Sequence[dict[str, Any]]) -> Timing | None:
    prefills: dict[str, float] = {}
    derived = own = separate = 0.0
    samples: set[str] = set()
    for row in rows:
        seconds, prefill = row.get("seconds"), row.get("prefill_seconds")
        if not isinstance(seconds, (int, float)) or not isinstance(prefill, (int, float)):
            continue
        samples.add(str(row["sample_id"]))
        if row.get("shared_prefill"):
            prefills.setdefault(str(row["sample_id"]), float(prefill))
            derived += float(seconds)
            separate += float(seconds) + float(prefill)
        else:
            own += float(seconds)
    if not samples:
        return None
    return Timing(len(samples), sum(prefills.values()), derived, own, separate)


def _longbench_e_groups(
    rows: Sequence[dict[str, Any]],
) -> tuple[dict[tuple[str, str, float], float], dict[str, tuple[int, int]]]:
    """LongBench-E length buckets: per ``_e`` task and bucket ``100 * mean``, then the mean over the tasks."""
    per_task: dict[tuple[str, str, str, float], list[float]] = defaultdict(list)
    samples: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        task, length = str(row["task"]), row.get("meta", {}).get("length")
        if not task.endswith("_e") or not isinstance(length, int) or row.get("score") is None:
            continue
        bucket = length_bucket(length)
        per_task[bucket, task, str(row["method"]), float(row["budget"])].append(float(row["score"]))
        samples[bucket].add(str(row["sample_id"]))
    by_group: dict[tuple[str, str, float], list[float]] = defaultdict(list)
    tasks: dict[str, set[str]] = defaultdict(set)
    for (bucket, task, method, budget), values in per_task.items():
        by_group[f"LongBench-E {bucket}", method, budget].append(100.0 * sum(values) / len(values))
        tasks[bucket].add(task)
    groups = {key: round(sum(v) / len(v), 2) for key, v in by_group.items()}
    sizes = {f"LongBench-E {b}": (len(tasks[b]), len(samples[b])) for b in LONGBENCH_E_BUCKETS if b in tasks}
    return groups, sizes


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


def format_markdown(summary: RunSummary, stats: RunStats | None = None) -> str:
    """Markdown: the methods, the significance lines and statistics (with ``stats``), then the score tables.

    Args:
        summary: the run's score tables.
        stats: the run's statistics (:func:`ripplekv.evaluation.tables.analyse_run`), or ``None`` to leave them out.
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
    lines += ["", "## Methods", "", *legend(summary.methods)]
    if stats is not None:
        lines += ["", *markdown_significance(stats)]
    lines += ["", f"## Average over {len(summary.tasks)} tasks", "", *_md_table(summary, AVERAGE)]
    if stats is not None:
        lines += markdown_sections(stats, summary.methods, summary.budgets)
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
    """Write the report's PNG plots into ``directory`` (see :mod:`~ripplekv.evaluation.plots`); their paths.

    Args:
        summary: the run's score tables.
        directory: the output folder (created if needed).
    """
    from ripplekv.evaluation.plots import write_plots as _write_plots

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
    stats = analyse_run(
        rows, summary.methods, summary.budgets, metrics, seed=seed, resamples=resamples, draws=draws, family=family
    )
    return format_markdown(summary, stats) if fmt == "md" else format_json(summary, stats)
