"""A run's rows summarised for the report and its plots: mean score per task, method and budget, logged timing."""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ripplekv_eval.running.results import CONFIG_FILE, RESULTS_FILE, ResultsLog
from ripplekv_eval.sample import (
    DEFAULT_SCORER,
    FULL_BUDGET,
    configuration_name,
    row_configuration,
    row_scorer,
    scored_methods,
)
from ripplekv_eval.tasks.longbench import LONGBENCH_E_BUCKETS, length_bucket

AVERAGE = "average"  # the task name of the macro average in score tables


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
    # configuration -> (r, gamma, source) of the RippleKV methods whose rows record where their setting came from
    # (``setting_source``: profile, explicit or default; rows written before it existed record none)
    settings: dict[str, tuple[float, float, str]] = field(default_factory=dict)

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
        return None if score is None or full is None or full == 0 else 100.0 * score / full


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
            samples[task, row_configuration(row), float(row["budget"])].append(float(row["score"]))
    if suite == "needle":
        tasks.sort(key=lambda t: needle_cells[t])
    configured = [str(m) for m in settings.get("methods", [])]
    scorers = [str(s) for s in settings.get("scorers", [DEFAULT_SCORER])]
    scored = scored_methods(rows)
    unscored = {str(r["method"]) for r in rows if row_scorer(r, scored) is None}
    unscored.add("full")
    names = [m if m in unscored else configuration_name(m, s) for s in scorers for m in configured]  # as the run
    seen = [m for m in dict.fromkeys(row_configuration(row) for row in rows)]
    methods = [m for m in dict.fromkeys(names) if m in seen] + [m for m in seen if m not in names]
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
        per_budget = sum(1 if m in unscored else len(scorers) for m in configured if m != "full")
        n_configs = ("full" in configured) + per_budget * len(settings.get("budgets", []))
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
        settings=ripple_settings(rows),
    )


def ripple_settings(rows: Sequence[dict[str, Any]]) -> dict[str, tuple[float, float, str]]:
    """Configuration -> ``(r, gamma, source)`` of every row that records its RippleKV setting's source (ValueError
    when two rows of one configuration ran different settings)."""
    out: dict[str, tuple[float, float, str]] = {}
    for row in rows:
        source = row.get("setting_source")
        if source is None:
            continue
        params = row.get("params") or {}
        setting = (float(params["r"]), float(params["gamma"]), str(source))
        name = row_configuration(row)
        if out.setdefault(name, setting) != setting:
            raise ValueError(f"the rows of {name} ran two RippleKV settings: {out[name]} and {setting}")
    return out


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
    return Timing(len(samples), sum(prefills.values()), derived, own, separate) if samples else None


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
        per_task[bucket, task, row_configuration(row), float(row["budget"])].append(float(row["score"]))
        samples[bucket].add(str(row["sample_id"]))
    by_group: dict[tuple[str, str, float], list[float]] = defaultdict(list)
    tasks: dict[str, set[str]] = defaultdict(set)
    for (bucket, task, method, budget), values in per_task.items():
        by_group[f"LongBench-E {bucket}", method, budget].append(100.0 * sum(values) / len(values))
        tasks[bucket].add(task)
    groups = {key: round(sum(v) / len(v), 2) for key, v in by_group.items()}
    sizes = {f"LongBench-E {b}": (len(tasks[b]), len(samples[b])) for b in LONGBENCH_E_BUCKETS if b in tasks}
    return groups, sizes
