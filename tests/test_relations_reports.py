"""Relations of the reports over per-prompt statistics (issue 26): a verdict's direction where lower is better, a
matrix's header against its cells, and the seed reaching every statistic (``ripplekv report``'s per-scorer analysis,
``benchmarks/allocators_verdict.py`` and ``benchmarks/allocators_section.py``). Each test names the seeded bug it was
checked to catch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import allocators_section, allocators_verdict
from ripplekv_eval.reporting import report as report_module
from ripplekv_eval.reporting.report import (
    analyse_by_scorer,
    budget_label,
    markdown_by_scorer,
    rows_of_scorer,
    scorers_json,
    verdict_lines,
)
from ripplekv_eval.reporting.stats import METRICS, Bootstrap, SignFlip, analyse_metric, analyse_run, collect, compare
from ripplekv_eval.sample import FULL_BUDGET

RESAMPLES, DRAWS = 2000, 999  # the smallest the statistics accept: fast, and Monte Carlo beyond 16 samples
BUDGETS = [0.1, 0.3]
SCHEDULES = ["snapkv", "pyramidkv", "cake", "dynamickv", "lava", "squeezeattention", "ripplekv", "ripplekv-local"]
SCORERS = ["snapkv", "tova"]
# KL of each schedule relative to SnapKV's, per (scorer, budget): under SnapKV RippleKV is the closest everywhere;
# under TOVA it is the furthest at 10% and about CAKE's at 30%. CAKE is the best of the attention-statistics
# family and LAVa its worst, so picking the family's representative by the wrong direction shows.
FACTORS = {"snapkv": 1.0, "pyramidkv": 1.05, "cake": 0.8, "dynamickv": 0.9, "lava": 1.3, "squeezeattention": 0.95}
FACTORS["ripplekv-local"] = 0.92
RIPPLEKV = {("snapkv", 0.1): 0.55, ("snapkv", 0.3): 0.6, ("tova", 0.1): 1.8, ("tova", 0.3): None}


def _row(sample: str, task: str, method: str, scorer: str | None, budget: float, kl: float) -> dict[str, Any]:
    return {
        "sample_id": sample,
        "task": task,
        "method": method,
        "scorer": scorer,
        "budget": budget,
        "prediction": None,
        "score": None,
        "prompt_tokens": 1000,
        "compressed_tokens": 1000,
        "kept_tokens": [1000] * 4,
        "kv_fraction": budget,
        "generated_tokens": 8,
        "seconds": 0.1,
        "prefill_seconds": 0.1,
        "shared_prefill": True,
        "meta": {},
        "fidelity_kl": kl,
        "top1_agreement": float(np.clip(1.0 - kl / 4.0, 0.0, 1.0)),
        "gold_nll": 1.0,
        "gold_nll_delta": kl / 2,
        "answer_tokens": 8,
    }


def _rows(seed: int = 0) -> list[dict[str, Any]]:
    """2 tasks x 10 prompts (20 > EXACT_MAX: the sign-flip test draws its vectors), 2 scorers, 2 budgets."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(2):
        for i in range(10):
            sample, task = f"t{t}/{i}", f"t{t}"
            rows.append(_row(sample, task, "full", None, FULL_BUDGET, 0.0))
            for scorer in SCORERS:
                for budget in BUDGETS:
                    base = float(rng.lognormal(-1.0, 0.4)) * (2.0 if scorer == "tova" else 1.0) * (0.1 / budget)
                    for method in SCHEDULES:
                        factor = FACTORS.get(method) or RIPPLEKV[scorer, budget] or float(rng.uniform(0.65, 0.95))
                        noise = float(np.exp(rng.normal(0.0, 0.05)))
                        rows.append(_row(sample, task, method, scorer, budget, base * factor * noise))
    return rows


def _write_run(folder: Path, rows: list[dict[str, Any]]) -> Path:
    config = {
        "format": "ripplekv-eval/1",
        "config": {
            "suite": "longbench",
            "model": {"name_or_path": "synthetic"},
            "methods": ["full", *SCHEDULES],
            "scorers": SCORERS,
            "budgets": BUDGETS,
            "protocol": "question-aware",
            "score": "fidelity",
            "samples": {"count": 20},
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_run(tmp_path_factory.mktemp("allocators") / "run", _rows())


@pytest.fixture(scope="module")
def verdict(run: Path) -> dict[str, Any]:
    return allocators_verdict.analyse(run, ["fidelity_kl", "top1_agreement"], RESAMPLES, 0, DRAWS)


METHODS = ["full", *SCHEDULES, *(f"{m}@tova" for m in SCHEDULES)]


@pytest.fixture(scope="module")
def by_scorer() -> dict[str, Any]:
    return analyse_by_scorer(_rows(), METHODS, BUDGETS, ["fidelity_kl", "top1_agreement"], 3, RESAMPLES, DRAWS)


# ------------------------------------------------------------------- a verdict's direction where lower is better


def test_the_verdict_picks_the_best_representative_and_calls_lower_kl_better(verdict: dict[str, Any]) -> None:
    """``fidelity_kl`` (lower is better): the attention-statistics representative is the family member of lowest
    mean KL (CAKE), RippleKV's negative difference is *better*, and a significant one on both thesis families
    *holds*; under TOVA at 10%, where RippleKV's KL is the highest, the thesis *fails*. ``top1_agreement``
    (higher is better) gives the same representative and verdicts from the opposite sign.
    Seeded bugs caught: the representative chosen by the highest mean whatever the direction (``sign = 1.0``);
    ``ripplekv_better`` as ``difference > 0`` whatever the direction."""
    expected_thesis = {
        ("snapkv", 0.1): "holds",
        ("snapkv", 0.3): "holds",
        ("tova", 0.1): "fails",
        ("tova", 0.3): "not shown",
    }
    for scorer in SCORERS:
        for name in ("fidelity_kl", "top1_agreement"):
            for entry in verdict["scorers"][scorer]["metrics"][name]["budgets"]:
                chosen = entry["comparisons"]["attention statistics"]
                assert chosen["other"] == "cake", (scorer, name, entry["budget"])
                for family, c in entry["comparisons"].items():
                    closer = c["difference"] < 0 if name == "fidelity_kl" else c["difference"] > 0
                    assert c["ripplekv_better"] == closer, (scorer, name, entry["budget"], family)
                want = expected_thesis.get((scorer, entry["budget"]))
                if want is not None:
                    assert entry["thesis"] == want, (scorer, name, entry["budget"])


def test_the_reports_best_other_and_verdict_line_follow_the_metrics_direction(by_scorer: dict[str, Any]) -> None:
    """Per scorer: a method's ``best_other`` is the other schedule of best mean in the metric's direction (lowest
    KL, highest top-1), and the verdict line calls RippleKV's lower KL (higher top-1) *better*.
    Seeded bugs caught: ``best_other`` by the highest mean whatever the direction (``comparisons.py``); the verdict
    line's ``better`` as ``difference > 0`` whatever the direction (``by_scorer.py``)."""
    for scorer, (run_stats, _) in by_scorer.items():
        for name, stats in run_stats.metrics.items():
            sign = 1.0 if stats.metric.higher_is_better else -1.0
            for budget in BUDGETS:
                for method, kinds in stats.versus[budget].items():
                    others = [m for m in SCHEDULES if m != method]
                    best = max(others, key=lambda m: sign * stats.estimates[m, budget].mean)
                    assert kinds["best_other"].other == best, (scorer, name, budget, method)
    lines = {name: verdict_lines(by_scorer, name) for name in ("fidelity_kl", "top1_agreement")}
    for name, found in lines.items():
        ten = next(line for line in found if line.startswith("- budget 10%"))
        snapkv_part, tova_part = ten.split("; tova: ")
        assert ", better, significant" in snapkv_part, (name, ten)
        assert ", worse, significant" in tova_part, (name, ten)


# ---------------------------------------------------------------------------- a matrix's header against its cells


def _tables(lines: list[str]) -> dict[str, list[list[str]]]:
    """Heading -> rows of cells (header row first) of each markdown table under a ``###`` heading."""
    tables: dict[str, list[list[str]]] = {}
    heading = None
    for line in lines:
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.startswith("|") and heading is not None and not line.startswith("|---"):
            tables.setdefault(heading, []).append([cell.strip() for cell in line.strip("|").split("|")])
    return tables


def test_each_matrix_cell_is_its_columns_scorer_at_its_tables_budget(by_scorer: dict[str, Any]) -> None:
    """The allocation x scorer matrix: under column ``s`` of the table of metric ``m`` at budget ``b``, row ``r``
    shows scorer ``s``'s mean and interval of ``r`` at ``b`` (TOVA's KL is twice SnapKV's, 30%'s a third of 10%'s,
    so a swapped column or budget shows). Seeded bugs caught: the header's scorers in another order than the
    cells'; every table's cells at the first budget; a table headed with the first budget."""
    tables = _tables(markdown_by_scorer(by_scorer, BUDGETS))
    checked = 0
    for name in ("fidelity_kl", "top1_agreement"):
        for budget in BUDGETS:
            direction = METRICS[name].direction
            table = tables[f"{name} at budget {budget_label(budget)} ({direction})"]
            header, body = table[0], table[1:]
            assert header == ["schedule", *SCORERS]
            assert [row[0] for row in body] == SCHEDULES
            for row in body:
                for scorer, cell in zip(header[1:], row[1:]):
                    stats = by_scorer[scorer][0].metrics[name]
                    e = stats.estimates[row[0], budget]
                    fmt = stats.metric.fmt
                    assert cell == f"{fmt(e.mean)} [{fmt(e.low)}, {fmt(e.high)}]", (name, budget, row[0], scorer)
                    checked += 1
    assert checked == 2 * 2 * len(SCHEDULES) * 2


def test_the_verdicts_family_columns_hold_their_own_familys_comparison(verdict: dict[str, Any]) -> None:
    """``allocators_verdict.markdown``: under each family's column, the cell names a member of that family and the
    difference to it; the budget column is the row's budget. Seeded bug caught: the header's families in another
    order than the cells'."""
    tables = _tables(allocators_verdict.markdown(verdict).splitlines())
    for scorer in SCORERS:
        heading = next(h for h in tables if h.startswith(f"fidelity_kl, scorer {scorer} "))
        header, body = tables[heading][0], tables[heading][1:]
        assert header[:2] == ["budget", "ripplekv"]
        entries = verdict["scorers"][scorer]["metrics"]["fidelity_kl"]["budgets"]
        for row, entry in zip(body, entries, strict=True):
            assert row[0] == f"{100 * entry['budget']:g}%"
            for family, cell in zip(header[2:], row[2:], strict=True):
                other = cell.split(" ")[0]
                assert other in allocators_verdict.FAMILIES[family], (scorer, family, cell)
                assert other == entry["comparisons"][family]["other"]
                difference = float(re.search(r": ([+-][0-9.]+) \[", cell).group(1))
                assert difference == pytest.approx(entry["comparisons"][family]["difference"], abs=1e-3)


def test_the_results_section_copies_the_kl_matrices_and_each_scorers_own_thesis(run: Path, verdict: Any) -> None:
    """``allocators_section.section``: its tables are the report's ``fidelity_kl`` matrices, each under its own
    heading (no other metric's), and each README line gives, per scorer, that scorer's thesis at that line's
    budget (the theses differ across scorers and budgets). Seeded bugs caught: every scorer given the first
    scorer's thesis; every line given the first budget's; another metric's tables kept."""
    report = report_module.report(run, fmt="md", resamples=RESAMPLES, draws=DRAWS)
    (run / "report.md").write_text(report)
    (run / "verdict.json").write_text(json.dumps(verdict))
    (run / "verdict.md").write_text(allocators_verdict.markdown(verdict))
    text, readme = allocators_section.section(run, "Title", "{rows} rows")
    ours, theirs = _tables(text.splitlines()), _tables(report.splitlines())
    kl_tables = {h: theirs[h] for h in (f"fidelity_kl at budget {budget_label(b)} (lower is better)" for b in BUDGETS)}
    for heading, table in kl_tables.items():
        assert ours[heading] == table
    assert not any(h.startswith("top1_agreement at budget") for h in ours)
    expected = []
    for budget in BUDGETS:
        parts = []
        for scorer in SCORERS:
            entries = verdict["scorers"][scorer]["metrics"]["fidelity_kl"]["budgets"]
            parts.append(f"{scorer} {next(e['thesis'] for e in entries if e['budget'] == budget)}")
        expected.append(f"{100 * budget:g}%: " + "; ".join(parts))
    assert readme == expected
    assert len({line.split(": ", 1)[1] for line in readme}) == len(BUDGETS)  # the lines differ
    assert "holds" in readme[0] and "fails" in readme[0]


# ---------------------------------------------------------------------------------- a seed reaches every statistic


def _comparisons(stats: Any) -> list[tuple]:
    return [
        (b, c.method, c.other, c.p, c.difference.low, c.difference.high)
        for b, tests in stats.tests.items()
        for c in tests
    ]


def test_a_runs_seed_reaches_the_bootstrap_and_the_sign_flip_test() -> None:
    """``analyse_run(seed=s)`` is ``analyse_metric`` with ``Bootstrap(seed=s)`` and ``SignFlip(seed=s)``, and
    another seed changes the p-values and intervals (20 prompts: random sign vectors). Seeded bugs caught: the
    seed not passed to the sign-flip test; not to the bootstrap; ``analyse_metric``'s default test not seeded
    from the bootstrap."""
    kept, names = rows_of_scorer(_rows(), METHODS, "snapkv")
    metric = METRICS["fidelity_kl"]
    values = collect(kept, metric, lambda row: str(row.get("task", "")))
    got = analyse_run(kept, names, BUDGETS, ["fidelity_kl"], seed=5, resamples=RESAMPLES, draws=DRAWS)
    flip = SignFlip(draws=DRAWS, seed=5)
    want = analyse_metric(metric, values, names, BUDGETS, Bootstrap(RESAMPLES, seed=5), flip=flip)
    assert _comparisons(got.metrics["fidelity_kl"]) == _comparisons(want)
    assert got.metrics["fidelity_kl"].estimates == want.estimates
    # without a test given, the default one (its default draws) is seeded from the bootstrap
    default = analyse_metric(metric, values, names, BUDGETS, Bootstrap(RESAMPLES, seed=5))
    seeded = analyse_metric(metric, values, names, BUDGETS, Bootstrap(RESAMPLES, seed=5), flip=SignFlip(seed=5))
    assert _comparisons(default) == _comparisons(seeded)
    other = analyse_run(kept, names, BUDGETS, ["fidelity_kl"], seed=6, resamples=RESAMPLES, draws=DRAWS)
    assert _comparisons(other.metrics["fidelity_kl"]) != _comparisons(want)
    assert other.metrics["fidelity_kl"].estimates != want.estimates  # the intervals of the means too


def test_the_seed_reaches_each_scorers_analysis_and_the_json_report(run: Path, by_scorer: dict[str, Any]) -> None:
    """``analyse_by_scorer(seed=s)`` analyses each scorer's rows with seed ``s``, and ``ripplekv report``'s JSON at
    seed ``s`` holds exactly those statistics. Seeded bugs caught: the seed not passed from ``analyse_by_scorer`` to
    each scorer's analysis; ``report`` not passing it on."""
    rows = _rows()
    for scorer, (stats, names) in by_scorer.items():  # computed at seed 3
        kept, _ = rows_of_scorer(rows, METHODS, scorer)
        alone = analyse_run(kept, names, BUDGETS, ["fidelity_kl", "top1_agreement"], 3, RESAMPLES, DRAWS)
        assert stats == alone, scorer
    got = json.loads(report_module.report(run, fmt="json", seed=3, resamples=RESAMPLES, draws=DRAWS))
    methods = ["full", *SCHEDULES, *(f"{m}@tova" for m in SCHEDULES)]
    want = scorers_json(analyse_by_scorer(rows, methods, BUDGETS, None, 3, RESAMPLES, DRAWS))
    assert got["statistics_by_scorer"] == json.loads(json.dumps(want))


def test_the_verdicts_seed_reaches_its_sign_flip_tests(run: Path, verdict: dict[str, Any]) -> None:
    """Each p-value and interval of ``allocators_verdict.analyse`` at seed ``s`` is ``compare``'s with
    ``SignFlip(seed=s)``; at another seed the intervals change. Seeded bug caught: the verdict's sign-flip test built
    without the seed."""
    rows = _rows()
    kept, _ = rows_of_scorer(rows, METHODS, "snapkv")
    metric = METRICS["fidelity_kl"]
    values = collect(kept, metric, lambda row: str(row.get("task", "")))
    flip = SignFlip(draws=DRAWS, seed=0)
    entry = verdict["scorers"]["snapkv"]["metrics"]["fidelity_kl"]["budgets"][0]
    for family, c in entry["comparisons"].items():
        budget = entry["budget"]
        (raw,) = compare(
            metric, [("ripplekv", c["other"], values["ripplekv", budget], values[c["other"], budget])], flip
        )
        assert raw is not None and c["p"] == raw.p, family
        assert (c["low"], c["high"]) == pytest.approx((raw.difference.low, raw.difference.high), rel=1e-12), family
    reseeded = allocators_verdict.analyse(run, ["fidelity_kl"], RESAMPLES, 9, DRAWS)
    moved = reseeded["scorers"]["snapkv"]["metrics"]["fidelity_kl"]["budgets"][0]["comparisons"]
    intervals = [(c["low"], c["high"]) for c in entry["comparisons"].values()]
    assert [(c["low"], c["high"]) for c in moved.values()] != intervals


# ------------------------------------------------------------------------------ a pair read in either direction


def test_each_comparison_in_either_direction_is_the_direct_comparison_of_that_direction(
    by_scorer: dict[str, Any],
) -> None:
    """The report computes a pair once and reads its reverse from it: every ``method vs other`` it holds (both
    directions occur: RippleKV's best other is CAKE and CAKE's is RippleKV) has the wins, ties, losses, mean and
    interval that comparing ``method - other`` directly gives. Seeded bugs caught: the reverse keeping the pair's
    wins and losses unswapped; its interval not mirrored (``low = -low``)."""
    metric = METRICS["fidelity_kl"]
    reversed_pairs = 0
    for scorer, (run_stats, _) in by_scorer.items():
        kept, _ = rows_of_scorer(_rows(), METHODS, scorer)
        values = collect(kept, metric, lambda row: str(row.get("task", "")))
        flip = SignFlip(draws=DRAWS, seed=3)
        stats = run_stats.metrics["fidelity_kl"]
        for budget in BUDGETS:
            pairs = {(m, c.other) for m, kinds in stats.versus[budget].items() for c in kinds.values()}
            for method, kinds in stats.versus[budget].items():
                for c in kinds.values():
                    reversed_pairs += (c.other, method) in pairs
                    pair = (method, c.other, values[method, budget], values[c.other, budget])
                    (direct,) = compare(metric, [pair], flip)
                    assert direct is not None
                    assert (c.wins, c.ties, c.losses) == (direct.wins, direct.ties, direct.losses)
                    for ours, theirs in zip(
                        (c.difference.mean, c.difference.low, c.difference.high, c.p),
                        (direct.difference.mean, direct.difference.low, direct.difference.high, direct.p),
                    ):
                        assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-12), (scorer, budget, method, c.other)
    assert reversed_pairs > 0


# ------------------------------------------------------------------- the README's headline table, either direction


@pytest.mark.parametrize("metric", ["fidelity_kl", "top1_agreement"])
def test_the_headline_table_picks_the_best_rival_and_counts_wins_by_the_metrics_direction(
    run: Path, verdict: dict[str, Any], metric: str
) -> None:
    """``benchmarks/headline_table.py``: the best rival is the family representative with the best mean (lowest KL,
    highest top-1 agreement), and a win is a prompt where RippleKV's value is better; the lines' counts must agree
    with the verdict's. Seeded: the rival chosen by the lowest mean and wins counted as ``d < 0`` for every metric
    (the table before ``--metric``): top-1 agreement picked the worst rival and the counts disagreed (SystemExit)."""
    from benchmarks import headline_table

    (run / "verdict.json").write_text(json.dumps(verdict, allow_nan=False))
    lines = headline_table.lines_of(headline_table.Run("m", "s", "default", str(run)), metric)
    higher = METRICS[metric].higher_is_better
    for line in lines:
        entry = next(
            b for b in verdict["scorers"]["snapkv"]["metrics"][metric]["budgets"] if b["budget"] == line["budget"]
        )
        means = [
            entry["comparisons"][f]["other_mean"] for f in headline_table.RIVAL_FAMILIES if f in entry["comparisons"]
        ]
        assert line["rival_mean"] == (max(means) if higher else min(means))
        diffs = headline_table.per_prompt(run, "ripplekv", line["rival"], line["budget"], metric)
        assert line["wins"] == sum((d > 0) if higher else (d < 0) for d in diffs)
    assert len(lines) == len(BUDGETS)
    assert f"median / {'p10' if higher else 'p90'}" in headline_table.markdown(lines, metric)


@pytest.mark.parametrize("metric", ["fidelity_kl", "score"])
def test_the_headline_tables_per_prompt_differences_are_in_the_verdicts_units(tmp_path: Path, metric: str) -> None:
    """Task scores are 0-1 per row and x 100 in a verdict; the per-prompt median and tail printed beside the verdict's
    mean must be in its units. With as many prompts per task, the mean of the per-prompt differences is the verdict's
    macro-mean difference. Seeded: the differences read unscaled (task-score medians 100x too small)."""
    from benchmarks import headline_table

    rows = _rows()
    for row in rows:
        row["score"] = float(np.exp(-row["fidelity_kl"]))
    run_dir = _write_run(tmp_path / "run", rows)
    (run_dir / "verdict.json").write_text(
        json.dumps(allocators_verdict.analyse(run_dir, [metric], RESAMPLES, 0, DRAWS), allow_nan=False)
    )
    lines = headline_table.lines_of(headline_table.Run("m", "s", "default", str(run_dir)), metric)
    assert len(lines) == len(BUDGETS)
    for line in lines:
        diffs = headline_table.per_prompt(run_dir, "ripplekv", line["rival"], line["budget"], metric)
        assert float(np.mean(diffs)) == pytest.approx(line["difference"], rel=1e-9, abs=1e-12)
        assert line["median"] == pytest.approx(float(np.median(diffs)), rel=1e-9, abs=1e-12)


def test_the_side_by_side_table_is_relative_to_each_rivals_mean(verdict: dict[str, Any]) -> None:
    """``benchmarks/side_by_side.py``: each cell is RippleKV's mean over the family representative's, minus one (every
    prompt holds every method, so the paired difference is the difference of the means), and bold exactly where the
    verdict's Holm p is below 0.05. Seeded: dividing by RippleKV's own mean."""
    from benchmarks import side_by_side

    for budget, cells in side_by_side.relative_cells(verdict, "fidelity_kl"):
        entry = next(
            b for b in verdict["scorers"]["snapkv"]["metrics"]["fidelity_kl"]["budgets"] if b["budget"] == budget
        )
        assert set(cells) == set(entry["comparisons"]) & set(side_by_side.FAMILIES)
        for family, cell in cells.items():
            c = entry["comparisons"][family]
            assert cell["relative"] == pytest.approx(entry["ripplekv_mean"] / c["other_mean"] - 1, rel=1e-9)
            assert cell["low"] <= cell["relative"] <= cell["high"]
            assert cell["significant"] == (c["p_holm"] < 0.05)
    table = side_by_side.markdown([("m", verdict)], "fidelity_kl")
    assert table.count("\n") == 2 + len(BUDGETS)


def test_the_headline_scripts_method_lists_keep_a_parameterised_methods_commas() -> None:
    """``benchmarks/headline.py --baselines snapkv,ripplekv:r=16,gamma=30`` names two baselines, not three (seeded bug:
    a plain ``split(",")`` gave ``ripplekv:r=16`` and ``gamma=30``)."""
    from benchmarks import headline

    args = headline.build_parser().parse_args(
        ["run", "--candidate", "ripplekv-oracle:r=16,gamma=30", "--baselines", "snapkv,ripplekv:r=16,gamma=30"]
    )
    assert list(args.baselines) == ["snapkv", "ripplekv:r=16,gamma=30"]
    assert args.candidate == "ripplekv-oracle:r=16,gamma=30"
