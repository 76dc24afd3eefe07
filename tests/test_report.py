"""``ripplekv report`` statistics: bootstrap intervals, paired differences, sign-flip tests, Holm (no model needed).

Runs are synthetic ``config.json`` + ``results.jsonl`` folders in the format the eval runner writes.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ripplekv.cli.main import main
from ripplekv.presses.method_spec import METHOD_TABLE
from ripplekv_eval.reporting import report as report_module
from ripplekv_eval.reporting.report import budget_label, legend, significance_lines
from ripplekv_eval.reporting.stats import (
    METRICS,
    Bootstrap,
    Metric,
    analyse_metric,
    analyse_run,
    holm,
    paired_differences,
)
from ripplekv_eval.running.results import CONFIG_FILE, RESULTS_FILE
from ripplekv_eval.sample import FULL_BUDGET

ROOT = Path(__file__).resolve().parents[1]
KL = METRICS["fidelity_kl"]
SCORE = METRICS["score"]


def _row(sample: str, task: str, method: str, budget: float, **values: Any) -> dict[str, Any]:
    """A result row as the runner writes it (fields of the results contract)."""
    full = method == "full"
    row: dict[str, Any] = {
        "sample_id": sample,
        "task": task,
        "method": method,
        "budget": budget,
        "prediction": "answer",
        "score": 0.0,
        "prompt_tokens": 1000,
        "compressed_tokens": 1000,
        "kept_tokens": [1000 if full else int(1000 * budget)] * 4,
        "kv_fraction": 1.0 if full else budget,
        "generated_tokens": 8,
        "seconds": 0.5,
        "prefill_seconds": 2.0,
        "shared_prefill": True,
        "meta": {},
        "fidelity_kl": 0.0,
        "top1_agreement": 1.0,
        "gold_nll": 1.5,
        "gold_nll_delta": 0.0,
        "answer_tokens": 8,
    }
    if full:
        row["answer_ids"] = list(range(8))
    row.update(values)
    return row


def _write_run(
    folder: Path, rows: list[dict[str, Any]], methods: list[str], budgets: list[float], score: str = "both"
) -> Path:
    samples = len({r["sample_id"] for r in rows})
    config = {
        "format": "ripplekv-eval/1",
        "config": {
            "suite": "longbench",
            "model": {"name_or_path": "synthetic"},
            "methods": methods,
            "budgets": budgets,
            "protocol": "question-aware",
            "score": score,
            "samples": {"count": samples},
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(config))
    (folder / RESULTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _planted_run(folder: Path, score: str = "both") -> Path:
    """4 tasks x 30 samples. KL: ripplekv = 0.8 x snapkv (planted), pyramidkv = snapkv x noise (null)."""
    rng = np.random.default_rng(7)
    methods, budgets = ["full", "snapkv", "pyramidkv", "ripplekv"], [0.1, 0.2]
    rows = []
    for t in range(4):
        for i in range(30):
            sample, task = f"task{t}/{i}", f"task{t}"
            rows.append(_row(sample, task, "full", FULL_BUDGET, score=float(rng.random() < 0.6)))
            for budget in budgets:
                base = float(rng.lognormal(-1.0, 0.6)) * (0.1 / budget)
                kl = {"snapkv": base, "pyramidkv": base * float(np.exp(rng.normal(0, 0.3))), "ripplekv": 0.8 * base}
                for method in methods[1:]:
                    value = None if score == "fidelity" else float(rng.random() < 0.5)
                    rows.append(
                        _row(
                            sample,
                            task,
                            method,
                            budget,
                            score=value,
                            prediction=None if value is None else "x",
                            fidelity_kl=kl[method],
                            top1_agreement=float(np.clip(1 - kl[method], 0, 1)),
                            gold_nll_delta=kl[method] / 2,
                        )
                    )
    return _write_run(folder, rows, methods, budgets, score)


def _samples(values: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {task: {f"{task}/{i}": v for i, v in enumerate(vs)} for task, vs in values.items()}


# ------------------------------------------------------------------------------------------------ intervals


def test_interval_covers_the_true_mean_in_most_seeds() -> None:
    mus, sigmas, n = (0.3, 1.0), (0.5, 2.0), 40
    truth = sum(mus) / 2
    theory = 2 * 1.96 * math.sqrt(sum(s**2 / n for s in sigmas)) / 2
    covered, widths = 0, []
    for seed in range(200):
        rng = np.random.default_rng(seed)
        data = {f"t{k}": list(rng.normal(mus[k], sigmas[k], n)) for k in range(2)}
        estimate = Bootstrap(2000, seed=seed).estimate(_samples(data))
        covered += estimate.low <= truth <= estimate.high
        widths.append(estimate.high - estimate.low)
    assert 0.88 <= covered / 200 <= 0.99, covered
    assert float(np.mean(widths)) == pytest.approx(theory, rel=0.1)


def test_stratification_keeps_a_small_task_at_its_weight() -> None:
    # task "small" (2 samples, 0 and 1) counts as much as task "big" (100 samples, all 0): macro mean 0.25.
    # Resampled within "small", its mean is 0, 0.5 or 1 (1/4, 1/2, 1/4), so the macro mean is 0, 0.25 or 0.5.
    estimate = Bootstrap(4000, seed=0).estimate(_samples({"small": [0.0, 1.0], "big": [0.0] * 100}))
    assert estimate.mean == 0.25 and (estimate.low, estimate.high) == (0.0, 0.5)
    assert (estimate.samples, estimate.tasks) == (102, 2)


def test_paired_difference_cancels_a_shared_offset() -> None:
    rng = np.random.default_rng(1)
    base = rng.normal(0.0, 10.0, 60)  # a per-sample difficulty both methods share
    a = _samples({"t": list(base + 1.0 + rng.normal(0, 0.05, 60))})
    b = _samples({"t": list(base)})
    bootstrap = Bootstrap(2000, seed=0)
    ea, eb = bootstrap.estimate(a), bootstrap.estimate(b)
    assert ea.low < eb.high  # unpaired, the two intervals overlap: no difference visible
    stats = analyse_metric(SCORE, {("x", 0.1): a, ("snapkv", 0.1): b}, ["x", "snapkv"], [0.1], bootstrap)
    diff = stats.versus[0.1]["x"]["baseline"]
    assert 0.95 < diff.difference.low < diff.difference.mean < diff.difference.high < 1.05
    assert (diff.wins, diff.ties, diff.losses) == (60, 0, 0) and diff.significant


def test_configurations_bootstrapped_together_get_their_own_intervals() -> None:
    """One scipy call for the configurations holding the same samples: each gets the interval it gets alone (to
    rounding), constant ones their point, whatever is batched beside it.

    Fails when a configuration's interval is taken from another row, or the resamples depend on the batch.
    """
    rng = np.random.default_rng(2)
    ids = {"t": 12, "u": 5, "one": 1}
    many = [_samples({t: list(rng.normal(mu, 1.0, n)) for t, n in ids.items()}) for mu in (0.0, 1.0, 5.0)]
    many.insert(1, _samples({t: [2.0] * n for t, n in ids.items()}))  # nothing varies: the point
    many.append(_samples({"t": list(rng.normal(0, 1, 9))}))  # other samples: a call of its own
    bootstrap = Bootstrap(2000, seed=0)
    together = bootstrap.estimates(many)
    for joint, data in zip(together, many):
        alone = bootstrap.estimate(data)
        assert (joint.mean, joint.samples, joint.tasks) == (alone.mean, alone.samples, alone.tasks)
        assert (joint.low, joint.high) == pytest.approx((alone.low, alone.high), rel=1e-12, abs=1e-15)
    assert (together[1].low, together[1].high) == (2.0, 2.0)
    assert len({(e.low, e.high) for e in together}) == 5


def test_pairs_only_samples_both_methods_have() -> None:
    a = {"t": {"s0": 1.0, "s1": 2.0, "s2": 3.0}, "u": {"s3": 1.0}}
    b = {"t": {"s1": 1.0, "s2": 3.0 + 1e-15, "s9": 5.0}, "v": {"s4": 0.0}}
    assert paired_differences(a, b) == {"t": {"s1": 1.0, "s2": 0.0}}  # rounding noise is a tie


def test_bootstrap_is_seeded_and_validated() -> None:
    rng = np.random.default_rng(0)
    data = _samples({"t": list(rng.normal(0, 1, 20)), "u": list(rng.normal(1, 1, 7))})
    first, again, other = (Bootstrap(2000, seed=s).estimate(data) for s in (3, 3, 4))
    assert first == again and first != other
    for bad in ({"resamples": 100}, {"seed": -1}, {"confidence": 1.0}, {"resamples": 2000.0}):
        with pytest.raises(ValueError, match="resamples|seed|confidence"):
            Bootstrap(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no samples"):
        Bootstrap().estimate({"t": {}})


def test_thousand_samples_by_twenty_configs_take_seconds(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    methods = ["full", "streamingllm", "snapkv", "pyramidkv", "adakv", "ripplekv", "ripplekv-local"]
    rows = []
    for i in range(1000):
        sample, task = f"t{i % 20}/{i}", f"t{i % 20}"
        rows.append(_row(sample, task, "full", FULL_BUDGET, score=float(rng.random())))
        for method in methods[1:]:
            for budget in (0.1, 0.2, 0.3):
                kl = float(rng.random())
                values = {"score": float(rng.random()), "fidelity_kl": kl, "gold_nll_delta": kl / 2}
                rows.append(_row(sample, task, method, budget, top1_agreement=1 - kl, **values))
    start = time.perf_counter()
    run = analyse_run(rows, methods, [0.1, 0.2, 0.3], resamples=4000)
    assert time.perf_counter() - start < 30.0
    assert list(run.metrics) == list(METRICS) and len(run.metrics["score"].estimates) == 19


# ------------------------------------------------------------------------------------------ tests, Holm, W/T/L


def test_holm_adjustment() -> None:
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == [1.0, 1.0] and holm([]) == []
    for bad in ([1.5], [math.nan], [-0.1]):
        with pytest.raises(ValueError, match="p-values"):
            holm(bad)


@pytest.mark.parametrize("metric", [KL, SCORE])
def test_wins_ties_losses_follow_the_metric_direction(metric: Metric) -> None:
    a = _samples({"t": [0.1, 0.2, 0.3, 0.4, 0.6]})
    b = _samples({"t": [0.2, 0.2, 0.1, 0.5, 0.9]})  # a lower on 3 samples, equal on 1, higher on 1
    values = {("a", 0.1): a, ("snapkv", 0.1): b}
    stats = analyse_metric(metric, values, ["a", "snapkv"], [0.1], Bootstrap(2000))
    forward, backward = stats.versus[0.1]["a"]["baseline"], stats.versus[0.1]["snapkv"]["best_other"]
    lower_wins = (3, 1, 1) if not metric.higher_is_better else (1, 1, 3)
    assert (forward.wins, forward.ties, forward.losses) == lower_wins
    assert (backward.wins, backward.ties, backward.losses) == lower_wins[::-1]
    assert forward.difference.mean == pytest.approx(-backward.difference.mean)
    assert forward.p == backward.p and len(stats.tests[0.1]) == 1  # one distinct comparison for Holm


@pytest.mark.parametrize(
    ("differences", "significant"),
    [([1.0, 1.0, 1.0], False), ([1.0] * 30 + [-1000.0], False), ([1.0] * 6, True), ([0.5, 1.0, 1.5, 2.0] * 5, True)],
)
def test_the_verdict_follows_the_interval_of_the_same_mean(differences: list[float], significant: bool) -> None:
    # Before, "significant" needed a percentile interval AND a pooled Wilcoxon p: [1, 1, 1] had an interval
    # [1, 1] and p = 0.25, 30 x 1 and one -1000 an interval with 0 and p < 0.05. Now one test decides and the
    # interval inverts it: 3 identical signs cannot reach p < 0.05 (2 of 8 sign vectors are as extreme), so no
    # shift is rejected and the interval is the whole line.
    a = _samples({"t": differences})
    zero = _samples({"t": [0.0] * len(differences)})
    stats = analyse_metric(SCORE, {("x", 0.1): a, ("snapkv", 0.1): zero}, ["x", "snapkv"], [0.1], Bootstrap())
    c = stats.versus[0.1]["x"]["baseline"]
    assert c.significant == significant == c.difference.excludes_zero() == (c.p < 0.05)
    assert c.p_holm == c.p  # a family of one
    if differences == [1.0, 1.0, 1.0]:
        assert (c.difference.low, c.difference.high, c.p, c.test) == (-math.inf, math.inf, 0.25, "exact")


def test_planted_difference_is_significant_and_null_is_not(tmp_path: Path) -> None:
    out = _planted_run(tmp_path / "run")
    document = json.loads(report_module.report(out, "json"))
    kl = document["statistics"]["metrics"]["fidelity_kl"]
    by = {(c["budget"], c["method"], c["against"]): c for c in kl["comparisons"]}
    for budget in (0.1, 0.2):
        planted, null = by[budget, "ripplekv", "baseline"], by[budget, "pyramidkv", "baseline"]
        assert planted["other"] == "snapkv" and planted["significant"] and planted["difference"]["high"] < 0
        assert (planted["wins"], planted["ties"], planted["losses"]) == (120, 0, 0)
        assert not null["significant"]
        best = by[budget, "snapkv", "best_other"]
        assert best["other"] == "ripplekv" and best["difference"]["mean"] > 0  # lowest KL is best
        tests = next(t for t in kl["tests"] if t["budget"] == budget)
        assert [c["p_holm"] for c in tests["comparisons"]] == holm([c["p"] for c in tests["comparisons"]])
        assert len(tests["comparisons"]) == 3  # {r, s}, {p, s}, {p, r}: each pair once
    text = report_module.report(out)
    line = next(x for x in text.splitlines() if x.startswith("- budget 10% (fidelity_kl, lower is better)"))
    assert "ripplekv vs snapkv -0.0" in line and ", 120/0/0, p=" in line
    verdicts = {part.split(" vs ")[0] + " vs " + part.split(" vs ")[1].split()[0]: part for part in line.split("; ")}
    assert verdicts["- budget 10% (fidelity_kl, lower is better): pyramidkv vs snapkv"].endswith("not significant")
    assert verdicts["ripplekv vs snapkv"].endswith(": significant")
    assert "## fidelity_kl (lower is better): mean and 95% interval" in text
    assert "Holm over the distinct comparisons of one metric at one budget" in text
    assert "Test: stratified sign-flip permutation test of the macro-mean difference" in text
    assert "(seed 0); Holm family: the distinct comparisons of one metric at one budget (`--family budget`)" in text


# ---------------------------------------------------------------------------------- skipped metrics, old runs


def test_null_and_absent_metrics_are_skipped(tmp_path: Path) -> None:
    out = _planted_run(tmp_path / "fidelity", score="fidelity")
    text = report_module.report(out)
    assert "- score: skipped, only the full cache has values" in text
    assert "## score (" not in text and "## fidelity_kl (lower is better)" in text
    assert "| full | " in text and "| snapkv | – | – |" in text  # score tables: the full cache only
    old = [
        {k: v for k, v in r.items() if k not in ("fidelity_kl", "top1_agreement", "gold_nll", "gold_nll_delta")}
        for r in map(json.loads, (out / RESULTS_FILE).read_text().splitlines())
    ]
    for r in old:
        r["score"] = 1.0 if r["score"] is None else r["score"]
    old_run = _write_run(tmp_path / "old", old, ["full", "snapkv", "pyramidkv", "ripplekv"], [0.1, 0.2])
    text = report_module.report(old_run)
    for name in ("fidelity_kl", "top1_agreement", "gold_nll_delta"):
        assert f"- {name}: skipped, no row has a value" in text
    assert "- budget 10% (score, higher is better): " in text


@pytest.mark.parametrize("run", ["longbench-mini", "ruler-4k", "needle"])
def test_committed_runs_still_report(run: str) -> None:
    folder = ROOT / "benchmarks" / "results" / run
    text = report_module.report(folder)
    for budget in ("10%", "20%", "30%"):
        assert f"- budget {budget} (score, higher is better): " in text
    document = json.loads(report_module.report(folder, "json"))
    summary = report_module.summarize(*report_module.load_run(folder))
    for estimate in document["statistics"]["metrics"]["score"]["estimates"]:
        key = (estimate["method"], estimate["budget"])
        assert round(estimate["mean"], 2) == summary.average[key]  # the macro mean of the average table
        assert estimate["low"] <= estimate["mean"] + 1e-9 and estimate["mean"] - 1e-9 <= estimate["high"]
    assert set(document["methods"]) == set(summary.methods)


# ---------------------------------------------------------------------------------------- legend, CLI, format


def test_legend_names_every_method() -> None:
    lines = legend(["full", "ripplekv", "mystery"])
    assert f"| ripplekv | {METHOD_TABLE['ripplekv'].description} |" in lines and "| mystery | mystery |" in lines
    assert budget_label(0.3) == "30%" and budget_label(512) == "512 tokens per layer"
    assert KL.fmt(-0.00001) == "0.0000" and SCORE.fmt(-1.234, sign=True) == "-1.23"


def test_significance_line_without_comparisons() -> None:
    stats = analyse_metric(SCORE, {("snapkv", 0.1): _samples({"t": [1.0, 0.0]})}, ["snapkv"], [0.1], Bootstrap())
    assert significance_lines(stats) == {0.1: "budget 10% (score, higher is better): fewer than two compressed methods"}


def test_cli_json_metrics_seed_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _planted_run(tmp_path / "run")
    assert main(["report", str(out), "--format", "json", "--metrics", "fidelity_kl", "--seed", "5"]) == 0
    document = json.loads(capsys.readouterr().out)
    statistics = document["statistics"]
    assert list(statistics["metrics"]) == ["fidelity_kl"] and statistics["seed"] == 5
    assert statistics["resamples"] >= 2000 and statistics["interval_of_means"] == "stratified bca bootstrap"
    test = statistics["test"]
    assert test["name"].startswith("stratified sign-flip permutation test") and test["family"] == "budget"
    assert (test["draws"], test["seed"], test["exact_max_samples"], test["adjustment"]) == (19999, 5, 16, "holm")
    comparison = statistics["metrics"]["fidelity_kl"]["comparisons"][0]
    assert comparison["test"] == "monte-carlo" and comparison["sign_vectors"] == 20000
    assert comparison["difference"]["interval"] == "sign-flip inversion"
    assert main(["report", str(out), "--format", "json", "--family", "metric", "--permutations", "999"]) == 0
    captured = capsys.readouterr()
    test = json.loads(captured.out)["statistics"]["test"]
    assert (test["family"], test["draws"]) == ("metric", 999)
    assert "Holm over the distinct comparisons of one metric over all budgets" in captured.err
    assert main(["report", str(out), "--permutations", "10"]) == 2
    assert "draws must be an integer >= 999" in capsys.readouterr().err
    assert document["methods"]["snapkv"] == METHOD_TABLE["snapkv"].description
    assert main(["report", str(out), "--metrics", "nope"]) == 2
    assert "unknown metric(s) nope" in capsys.readouterr().err
    assert main(["report", str(out), "--resamples", "10"]) == 2
    assert "resamples must be an integer >= 2000" in capsys.readouterr().err
    assert main(["report", str(out), "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("task,method,budget,score,percent_of_full,samples\n")
    with pytest.raises(ValueError, match="format must be one of"):
        report_module.report(out, "html")


def test_statistics_use_only_samples_with_every_configuration(tmp_path: Path) -> None:
    """A running or interrupted run: a sample without some configuration stays out of every mean and test."""
    out = _planted_run(tmp_path / "run")
    rows = [json.loads(line) for line in (out / RESULTS_FILE).read_text().splitlines()]
    # the last sample of task0 was interrupted after its snapkv row at 10%, with an extreme value
    last = "task0/29"
    kept = [r for r in rows if r["sample_id"] != last or (r["method"], r["budget"]) in {("full", 1.0), ("snapkv", 0.1)}]
    next(r for r in kept if r["sample_id"] == last and r["method"] == "snapkv")["fidelity_kl"] = 1e6
    partial = _write_run(tmp_path / "partial", kept, ["full", "snapkv", "pyramidkv", "ripplekv"], [0.1, 0.2])
    complete = _write_run(
        tmp_path / "complete",
        [r for r in rows if r["sample_id"] != last],
        ["full", "snapkv", "pyramidkv", "ripplekv"],
        [0.1, 0.2],
    )
    got = json.loads(report_module.report(partial, "json"))["statistics"]
    want = json.loads(report_module.report(complete, "json"))["statistics"]
    assert got["incomplete_samples"] == 1 and want["incomplete_samples"] == 0
    assert got["metrics"] == want["metrics"]
    assert "1 sample(s) without a row for every configuration are left out" in report_module.report(partial)


def test_a_report_without_the_full_cache_says_so_and_leaves_percentages_empty(tmp_path: Path) -> None:
    """Seeded: ``"full" not in summary.methods`` -> ``in`` (report.py:466): the note went missing; and
    ``percent_of_full is None`` -> ``is not None`` (report.py:510): the CSV failed on the missing percentage."""
    from ripplekv_eval.reporting.report import format_csv
    from ripplekv_eval.reporting.summary import load_run, summarize

    rows = [_row(f"t/{i}", "t", m, 0.2, score=float(i % 2), fidelity_kl=0.1 * (i + 1)) for i in range(3) for m in
            ("snapkv", "ripplekv")]  # fmt: skip
    run = _write_run(tmp_path / "run", rows, ["snapkv", "ripplekv"], [0.2])
    assert "No full-cache results: percentages of full are not available." in report_module.report(run)
    csv_lines = format_csv(summarize(*load_run(run))).splitlines()
    assert csv_lines[0].split(",")[4] == "percent_of_full"
    assert len(csv_lines) > 1 and all(line.split(",")[4] == "" for line in csv_lines[1:])
