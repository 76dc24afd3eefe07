"""Relations that kill mutants of issue 26's report and run-folder modules left alive by its third mutation round.

Each test names the seeded bug it was watched failing under.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tqdm

from ripplekv_eval.reporting.report import FEW_SAMPLES, analyse_by_scorer, small_sample_caveat, verdict_lines
from ripplekv_eval.running.results import ResultsLog, open_results, run_pending
from ripplekv_eval.sample import FULL_BUDGET
from tests.test_mutation_reports import _Bar

RESAMPLES, DRAWS = 2000, 999
BUDGETS = [0.1, 0.3]
METHODS = ["full", "snapkv", "ripplekv"]


def _row(sample: str, method: str, budget: float, kl: float) -> dict[str, Any]:
    return {"sample_id": sample, "task": sample[:2], "method": method, "budget": budget, "fidelity_kl": kl}


@pytest.mark.parametrize("metric", ["fidelity_kl", "top1_agreement"])
def test_a_verdict_with_no_difference_is_tied_whichever_way_the_metric_points(metric: str) -> None:
    """RippleKV equal to its rival on every prompt is neither better nor worse, for a metric where lower is better
    (KL) and for one where higher is (top-1 agreement). Seeded bug caught: ``d.mean > 0`` as ``>=`` (a tie called
    better or worse by the metric's direction)."""
    rng = np.random.default_rng(1)
    rows = []
    for i in range(8):
        sample = f"t{i % 2}/{i}"
        rows.append({**_row(sample, "full", FULL_BUDGET, 0.0), metric: 0.0 if metric == "fidelity_kl" else 1.0})
        for budget in BUDGETS:
            value = float(rng.uniform(0.05, 0.5))
            for method in METHODS[1:]:
                rows.append({**_row(sample, method, budget, value), metric: value})
    by_scorer = analyse_by_scorer(rows, METHODS, BUDGETS, [metric], 0, RESAMPLES, DRAWS)
    lines = verdict_lines(by_scorer, metric)
    assert len(lines) == len(BUDGETS)
    assert all("0/8/0" in line and ", tied, " in line for line in lines), lines


def test_the_small_sample_caveat_names_the_tasks_under_five_samples_only() -> None:
    """A task of exactly 5 samples has no caveat; one of 4 has. Seeded bugs caught: ``n < FEW_SAMPLES`` as ``<=``;
    FEW_SAMPLES 6."""

    @dataclasses.dataclass
    class _Strata:
        strata: dict[str, int]

    assert FEW_SAMPLES == 5
    assert small_sample_caveat(_Strata({"a": 5, "b": 12})) is None  # type: ignore[arg-type]
    caveat = small_sample_caveat(_Strata({"a": 5, "b": 4, "c": 1}))  # type: ignore[arg-type]
    assert caveat is not None and caveat.startswith("Caveat: 2 of 3 tasks have fewer than 5 samples (the smallest 1)")


@dataclasses.dataclass(frozen=True)
class _Sample:
    id: str


def _rows_of(sample: Any, pending: list[tuple[str, float]], answer: Any) -> Any:
    return ({"sample_id": sample.id, "method": m, "budget": b} for m, b in pending)


def test_a_run_shows_its_progress_unless_told_not_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded bug caught: the default ``progress=False`` (a long run silent)."""
    monkeypatch.setattr(tqdm, "tqdm", _Bar)
    monkeypatch.setattr(_Bar, "made", [])
    with open_results(tmp_path, {"x": 1}, {}) as folder:
        assert run_pending([_Sample("a")], [("full", 1.0)], folder, _rows_of, "t") == 1
    assert [bar.disable for bar in _Bar.made] == [False]


def test_a_run_resumed_after_an_interrupted_write_appends_whole_rows(tmp_path: Path) -> None:
    """Opening a folder whose last row was cut mid-write removes that fragment, so the rows written next are whole
    lines and the cut configuration is redone. Seeded bug caught: the folder opened with ``read(repair=False)``
    (the next row glued to the fragment: a corrupt file)."""
    path = tmp_path / "results.jsonl"
    with open_results(tmp_path, {"x": 1}, {}) as folder:
        folder.log.append({"sample_id": "a", "method": "full", "budget": 1.0})
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"sample_id": "a", "method": "snap')
    configurations = [("full", 1.0), ("snapkv", 0.1)]
    with open_results(tmp_path, {"x": 1}, {}) as folder:
        assert run_pending([_Sample("a")], configurations, folder, _rows_of, "t", progress=False) == 1
    rows = ResultsLog(path).read()
    assert [(r["method"], r["budget"]) for r in rows] == configurations
    assert path.read_text(encoding="utf-8").count("\n") == 2
