"""``ripplekv eval`` / ``ripplekv report`` end to end on a tiny local model (offline, CPU, seconds)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from ripplekv.cli.main import main
from ripplekv.inference.generate import eos_ids, extend, greedy_decode, prefill
from ripplekv.models.loading import load_model
from ripplekv.presses.registry import make_press
from ripplekv.profiling.calibration import CalibrationSample, CalibrationSet
from ripplekv.profiling.haystack import ESSAY_PACKAGE, INSTALL_COMMAND, essays
from ripplekv.profiling.sensitivity import ProfilingConfig, profile_model
from ripplekv_eval.reporting import report as report_module
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.results import CONFIG_FILE, RESULTS_FILE, ConfigMismatchError, ResultsLog
from ripplekv_eval.running.runner import build_samples, load_run_profiles, needs_sensitivity_profile, run_eval
from tests.conftest import save_tiny_model_dir

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec(ESSAY_PACKAGE) is None, reason=f"essay package missing: {INSTALL_COMMAND}"
    ),
    pytest.mark.usefixtures("one_thread"),
]

WINDOW = 8
TIMING = ("seconds", "prefill_seconds", "decode_rows")  # how a row was run, not what it holds


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model_dir(
        tmp_path_factory.mktemp("tiny-eval-model"), [text for _, text in essays()[:12]], vocab_size=1000
    )


@pytest.fixture(scope="module")
def loaded(model_dir: Path) -> tuple[Any, Any]:
    return load_model(str(model_dir), device="cpu")


@pytest.fixture(scope="module")
def profile_path(loaded: tuple[Any, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, tokenizer = loaded
    text = essays()[0][1]
    calibration = CalibrationSet(
        samples=tuple(
            CalibrationSample(context=text[i * 700 : i * 700 + 600], continuation=" and so on") for i in (0, 1)
        ),
        description="tiny",
    )
    profile = profile_model(model, tokenizer, calibration, ProfilingConfig(alpha=0.5, repeats=1))
    return profile.save(tmp_path_factory.mktemp("profile") / "tiny.profile.json")


def _needle_config(profile: Path, **changes: Any) -> EvalConfig:
    config = EvalConfig(
        suite="needle",
        methods=("full", "snapkv", "adakv", "ripplekv"),
        budgets=(0.3, 0.5),
        profile=str(profile),
        options={"needle_lengths": (160,), "needle_depths": (0.2, 0.8), "needle_digits": 4},
        window_size=WINDOW,
        max_new_tokens=4,
    )
    return replace(config, **changes)


def _rows(out: Path) -> list[dict[str, Any]]:
    return ResultsLog(out / RESULTS_FILE).read()


def _comparable(rows: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    keyed = {(r["sample_id"], r["method"], r["budget"]): {k: v for k, v in r.items() if k not in TIMING} for r in rows}
    assert len(keyed) == len(rows), "duplicated rows"
    return keyed


def _direct_prediction(model: Any, tokenizer: Any, sample: Any, press: Any, protocol: str) -> str:
    """What generate_answer's path gives for one sample: a prefill with the press itself, no shared record."""
    ids = torch.tensor([list(sample.input_ids)])
    if protocol == "question-aware":
        state = prefill(model, ids, press)
    else:
        state = extend(model, prefill(model, ids[:, : sample.question_start], press), ids[:, sample.question_start :])
    stops = eos_ids(model, tokenizer) | sample.extra_stop_ids
    tokens = greedy_decode(model, state, sample.max_new_tokens, stops, min_new_tokens=1)
    return tokenizer.decode(tokens, skip_special_tokens=True)


@pytest.fixture(scope="module")
def needle_run(
    loaded: tuple[Any, Any], profile_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, EvalConfig]:
    model, tokenizer = loaded
    out = tmp_path_factory.mktemp("runs") / "needle"
    config = _needle_config(profile_path)
    summary = run_eval(config, out, model, tokenizer, progress=False)
    assert summary.rows == summary.new_rows == 2 * (1 + 3 * 2)
    return out, config


def test_needle_rows_match_direct_prefills(needle_run: tuple[Path, EvalConfig], loaded: tuple[Any, Any]) -> None:
    model, tokenizer = loaded
    out, config = needle_run
    rows = _rows(out)
    assert len(_comparable(rows)) == 14
    samples = {s.id: s for s in build_samples(config, tokenizer, model)}
    assert len(samples) == 2
    for row in rows:
        sample = samples[row["sample_id"]]
        assert row["shared_prefill"] is True  # AdaKV too: its masks are derived with its cache
        assert row["budget"] == (1.0 if row["method"] == "full" else row["budget"])
        assert row["prompt_tokens"] == len(sample.input_ids) == row["compressed_tokens"]
        assert len(row["kept_tokens"]) == 3 and row["score"] in (0.0, 1.0)
        assert row["meta"]["length"] == 160 and row["meta"]["depth"] in (0.2, 0.8)
        if row["method"] in ("snapkv", "ripplekv"):  # kvpress's kept count, per layer on average
            assert sum(row["kept_tokens"]) == 3 * int(row["prompt_tokens"] * (1 - (1 - row["budget"])))
        press = make_press(row["method"], row["budget"], profile=_profile(config), window_size=WINDOW)
        assert row["prediction"] == _direct_prediction(model, tokenizer, sample, press, config.protocol), row
    config_json = json.loads((out / CONFIG_FILE).read_text())
    assert config_json["config"]["needle_lengths"] == [160] and config_json["versions"]["ripplekv"]
    assert config_json["config"]["samples"]["count"] == 2


def _profile(config: EvalConfig) -> Any:
    from ripplekv.profiling.profile import SensitivityProfile

    return SensitivityProfile.load(config.profile or "")


def test_resume_after_interruption_and_truncated_line(
    needle_run: tuple[Path, EvalConfig], loaded: tuple[Any, Any], tmp_path: Path
) -> None:
    model, tokenizer = loaded
    reference, config = needle_run
    out = tmp_path / "resumed"

    class Interrupted(Exception):
        pass

    def stop_after_five(row: dict[str, Any]) -> None:
        stop_after_five.calls += 1  # type: ignore[attr-defined]
        if stop_after_five.calls == 5:  # type: ignore[attr-defined]
            raise Interrupted

    stop_after_five.calls = 0  # type: ignore[attr-defined]
    with pytest.raises(Interrupted):
        run_eval(config, out, model, tokenizer, on_row=stop_after_five, progress=False)
    assert len(_rows(out)) == 5
    summary = run_eval(config, out, model, tokenizer, progress=False)
    assert summary.new_rows == 14 - 5 and summary.rows == 14
    assert _comparable(_rows(out)) == _comparable(_rows(reference))

    # an interrupted write: the last line is cut in the middle; it is dropped and redone
    results = out / RESULTS_FILE
    data = results.read_bytes()
    results.write_bytes(data[: len(data) - 40])
    assert len(_rows(out)) == 13
    summary = run_eval(config, out, model, tokenizer, progress=False)
    assert summary.new_rows == 1 and summary.rows == 14
    assert results.read_bytes().endswith(b"\n")
    assert _comparable(_rows(out)) == _comparable(_rows(reference))

    # nothing left to do: no new rows
    assert run_eval(config, out, model, tokenizer, progress=False).new_rows == 0

    # another configuration is refused, naming what differs
    with pytest.raises(ConfigMismatchError, match="budgets"):
        run_eval(replace(config, budgets=(0.3,)), out, model, tokenizer, progress=False)

    # a damaged line that is not the last one is an error, not silently dropped
    lines = results.read_text().splitlines(keepends=True)
    results.write_text("".join([lines[0], "{broken\n", *lines[1:]]))
    with pytest.raises(ValueError, match="corrupt result row"):
        run_eval(config, out, model, tokenizer, progress=False)


def test_needle_report_tables_and_heatmaps(needle_run: tuple[Path, EvalConfig], tmp_path: Path) -> None:
    out, _ = needle_run
    text = report_module.report(out, "md", tmp_path / "plots")
    for method in ("full", "snapkv", "adakv", "ripplekv"):
        assert f"| {method} |" in text
    assert "## Average over 2 tasks" in text and "## L=160 depth=0.2" in text and "## L=160 depth=0.8" in text
    plots = {p.name for p in (tmp_path / "plots").iterdir()}
    assert {"score_vs_budget.png", "needle_full.png", "needle_snapkv_budget_0p3.png"} <= plots
    assert len(plots) == 1 + 1 + 3 * 2
    csv_text = report_module.report(out, "csv")
    assert csv_text.splitlines()[0] == "task,method,budget,score,percent_of_full,samples"
    assert any(line.startswith("average,full,1,") for line in csv_text.splitlines())


def test_report_scores_and_percent_of_full(tmp_path: Path) -> None:
    config = {
        "format": "ripplekv-eval/1",
        "config": {"suite": "ruler", "methods": ["full", "snapkv"], "budgets": [0.1, 0.2]},
    }
    config["config"]["samples"] = {"count": 4}
    (tmp_path / CONFIG_FILE).write_text(json.dumps(config))
    rows = []
    for task, full, snap in (("a", (1.0, 1.0), (0.5, 0.0)), ("b", (1.0, 0.5), (0.5, 0.25))):
        for i in range(2):
            rows.append({"sample_id": f"{task}/{i}", "task": task, "method": "full", "budget": 1.0, "score": full[i]})
            for budget in (0.1, 0.2):
                rows.append(
                    {"sample_id": f"{task}/{i}", "task": task, "method": "snapkv", "budget": budget, "score": snap[i]}
                )
    (tmp_path / RESULTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]))  # one row missing
    summary = report_module.summarize(*report_module.load_run(tmp_path))
    assert summary.value("a", "snapkv", 0.1) == 25.0 and summary.value("b", "full", 0.2) == 75.0
    assert summary.value("average", "full", 0.1) == 87.5 and summary.value("average", "snapkv", 0.1) == 31.25
    assert summary.value("b", "snapkv", 0.2) == 50.0  # only the first sample of b at 0.2 is present
    text = report_module.format_markdown(summary)
    assert "| full | 87.50 (100.0%) | 87.50 (100.0%) |" in text
    assert "| snapkv | 31.25 (35.7%) | 37.50 (42.9%) |" in text
    assert "**Incomplete run**: 11 of 12 results." in text
    assert "b,snapkv,0.1,37.50,50.00,2" in report_module.format_csv(summary)


def _write_longbench(folder: Path) -> None:
    text = essays()[1][1]
    records = {
        "hotpotqa": [
            {"input": "Who wrote the essay?", "context": text[:1500], "answers": ["Paul Graham"], "_id": "h1"},
            {"input": "What is it about?", "context": text[1500:2400], "answers": ["startups"], "_id": "h2"},
        ],
        "samsum": [
            {"input": "Dialogue: A: hi\nB: hello\nSummary: ", "context": text[:900], "answers": ["They greet."]},
            {"input": "Dialogue: A: bye\nSummary: ", "context": text[900:1800], "answers": ["A leaves."]},
        ],
    }
    folder.mkdir(parents=True, exist_ok=True)
    for task, rows in records.items():
        lines = []
        for i, row in enumerate(rows):
            full = {"length": len(row["context"].split()), "all_classes": None, "dataset": task, "_id": f"{task}{i}"}
            lines.append(json.dumps({**full, **row}))
        (folder / f"{task}.jsonl").write_text("\n".join(lines) + "\n")


def test_longbench_cli_eval_and_report(
    model_dir: Path, profile_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "longbench"
    _write_longbench(data)
    out = tmp_path / "runs" / "lb"
    args = ["eval", "--model", str(model_dir), "--suite", "longbench", "--data-dir", str(data)]
    args += ["--methods", "full,snapkv,ripplekv", "--budgets", "0.3,0.5", "--profile", str(profile_path)]
    args += ["--max-length", "200", "--window-size", str(WINDOW), "--max-new-tokens", "3", "--out", str(out)]
    assert main([*args, "--no-progress"]) == 0
    assert "20 results (20 new)" in capsys.readouterr().out
    rows = _rows(out)
    assert {r["task"] for r in rows} == {"hotpotqa", "samsum"}
    assert all(0.0 <= r["score"] <= 1.0 and r["generated_tokens"] <= 3 for r in rows)
    assert all(r["prompt_tokens"] <= 200 + 2 for r in rows)  # middle truncation to --max-length
    assert main([*args, "--no-progress"]) == 0  # resumes: nothing to do
    assert "20 results (0 new)" in capsys.readouterr().out
    assert main([*args[:-2], "--out", str(out), "--budgets", "0.2", "--no-progress"]) == 2
    assert "refusing to resume" in capsys.readouterr().err

    plots = tmp_path / "plots"
    assert main(["report", str(out), "--plots", str(plots)]) == 0
    text = capsys.readouterr().out
    assert "## hotpotqa (2 samples)" in text and "## samsum (2 samples)" in text
    for method in ("full", "snapkv", "ripplekv"):
        assert f"| {method} |" in text
    assert {p.name for p in plots.iterdir()} == {
        "score_vs_budget.png",
        "heatmap_budget_0p3.png",
        "heatmap_budget_0p5.png",
    }
    assert main(["report", str(out), "--format", "csv"]) == 0
    assert "hotpotqa,snapkv,0.3," in capsys.readouterr().out


def test_ruler_query_agnostic_matches_direct(loaded: tuple[Any, Any], profile_path: Path, tmp_path: Path) -> None:
    model, tokenizer = loaded
    config = EvalConfig(
        suite="ruler",
        methods=("full", "pyramidkv", "ripplekv"),
        budgets=(0.4,),
        tasks=("niah_single_noise_number", "vt"),
        limit=2,
        options={"context_tokens": 200},
        profile=str(profile_path),
        protocol="query-agnostic",
        window_size=WINDOW,
        max_new_tokens=4,
    )
    out = tmp_path / "ruler"
    summary = run_eval(config, out, model, tokenizer, progress=False)
    assert summary.samples == 4 and summary.rows == 4 * 3
    rows = _rows(out)
    samples = {s.id: s for s in build_samples(config, tokenizer, model)}
    for row in rows[:3] + rows[-1:]:
        sample = samples[row["sample_id"]]
        assert row["compressed_tokens"] == sample.question_start < row["prompt_tokens"]
        press = make_press(row["method"], row["budget"], profile=_profile(config), window_size=WINDOW)
        assert row["prediction"] == _direct_prediction(model, tokenizer, sample, press, "query-agnostic")
    text = report_module.report(out)
    assert "## niah_single_noise_number (2 samples)" in text and "## vt (2 samples)" in text


def test_one_profile_rule_for_every_run(profile_path: Path) -> None:
    """run_eval and run_eval_ray share load_run_profiles: the ripplekv methods take --profile, ripplekv-oracle
    takes --oracle-profile only, and a profile given to methods that do not use it is not read."""
    assert needs_sensitivity_profile(["full", "ripplekv-local"]) and needs_sensitivity_profile(["ripplekv-ada"])
    assert not needs_sensitivity_profile(["full", "snapkv", "pyramidkv", "ripplekv-oracle"])
    with pytest.raises(ValueError, match="need --profile"):
        load_run_profiles(EvalConfig(suite="needle", methods=("snapkv", "ripplekv")))
    with pytest.raises(ValueError, match="needs --oracle-profile"):
        load_run_profiles(EvalConfig(suite="needle", methods=("ripplekv-oracle",)))
    unused = load_run_profiles(EvalConfig(suite="needle", methods=("snapkv",), profile=str(profile_path) + ".nope"))
    assert unused.profile is None and unused.oracles == ()
    used = load_run_profiles(EvalConfig(suite="needle", methods=("ripplekv",), profile=str(profile_path)))
    assert used.profile is not None and used.oracles == ()


def test_bad_options_are_clear_errors(profile_path: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown method"):
        EvalConfig(suite="needle", methods=("full", "nope"))
    with pytest.raises(ValueError, match="needs --data-dir"):
        EvalConfig(suite="longbench")
    with pytest.raises(ValueError, match="budget 1.5 is above 1"):
        EvalConfig(suite="needle", budgets=(1.5,))
    with pytest.raises(ValueError, match="unknown RULER task"):
        EvalConfig(suite="ruler", tasks=("nope",))
    with pytest.raises(ValueError, match="need --profile"):
        run_eval(EvalConfig(suite="needle", methods=("ripplekv",)), tmp_path / "x", progress=False)
    with pytest.raises(FileNotFoundError, match="not an evaluation folder"):
        report_module.report(tmp_path)


def test_report_longbench_e_length_buckets(tmp_path: Path) -> None:
    config = {"format": "ripplekv-eval/1", "config": {"suite": "longbench", "methods": ["full"], "budgets": [0.1]}}
    (tmp_path / CONFIG_FILE).write_text(json.dumps(config))
    cases = [("x_e", 1000, 1.0), ("x_e", 3999, 0.5), ("x_e", 5000, 0.0), ("x_e", 9000, 0.5), ("y_e", 2000, 0.0)]
    cases.append(("z", 100, 1.0))  # not a LongBench-E task: not in any bucket
    rows = [
        {"sample_id": f"{t}/{i}", "task": t, "method": "full", "budget": 1.0, "score": s, "meta": {"length": n}}
        for i, (t, n, s) in enumerate(cases)
    ]
    (tmp_path / RESULTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = report_module.summarize(*report_module.load_run(tmp_path))
    # 0-4k: x_e scores 75, y_e scores 0 -> 37.5 over 2 tasks and 3 samples
    assert summary.group_sizes == {"LongBench-E 0-4k": (2, 3), "LongBench-E 4-8k": (1, 1), "LongBench-E 8k+": (1, 1)}
    assert summary.value("LongBench-E 0-4k", "full", 0.1) == 37.5
    assert summary.value("LongBench-E 4-8k", "full", 0.1) == 0.0
    assert summary.value("LongBench-E 8k+", "full", 0.1) == 50.0
    assert summary.value("average", "full", 0.1) == (50.0 + 0.0 + 100.0) / 3  # buckets do not enter it
    text = report_module.format_markdown(summary)
    assert "## LongBench-E 0-4k words: average over 2 `_e` tasks (3 samples)" in text
    assert "LongBench-E 8k+,full,1,50.00,100.00," in report_module.format_csv(summary)


def test_report_timing_from_logged_seconds() -> None:
    def row(sample: str, method: str, seconds: float, prefill: float, shared: bool) -> dict[str, Any]:
        return {
            "sample_id": sample,
            "task": "t",
            "method": method,
            "budget": 0.1,
            "score": 0.0,
            "seconds": seconds,
            "prefill_seconds": prefill,
            "shared_prefill": shared,
        }

    rows = []
    for sample, prefill_s in (("t/0", 10.0), ("t/1", 20.0)):
        rows += [row(sample, "full", 1.0, prefill_s, True), row(sample, "snapkv", 1.0, prefill_s, True)]
        rows.append(row(sample, "adakv", 12.0, 9.0, False))  # its own prefill, inside its seconds
    summary = report_module.summarize({"config": {"suite": "ruler"}}, rows)
    timing = summary.timing
    assert timing is not None and timing.samples == 2
    assert (timing.shared_prefill, timing.derived, timing.own_prefill) == (30.0, 4.0, 24.0)
    assert timing.separate_estimate == 4.0 + 2 * 10.0 + 2 * 20.0 and timing.total == 58.0
    assert timing.speedup_estimate == pytest.approx(64.0 / 34.0)
    assert "(1.88x, estimated from the logged prefill times)" in report_module.format_markdown(summary)
    old_rows = [{k: v for k, v in r.items() if k not in ("seconds", "prefill_seconds")} for r in rows]
    assert report_module.summarize({"config": {"suite": "ruler"}}, old_rows).timing is None


# ------------------------------------------------------------------------------- fidelity and decoding rules


class _DecodeCounter:
    """Wraps the runner's ``greedy_decode``, counting calls (the answers are unchanged)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from ripplekv_eval.running import rows as rows_module

        self.calls = 0
        self._decode = rows_module.greedy_decode
        monkeypatch.setattr(rows_module, "greedy_decode", self)

    def __call__(self, *args: Any, **kwargs: Any) -> list[int]:
        self.calls += 1
        return self._decode(*args, **kwargs)


def test_fidelity_fields_in_every_row(needle_run: tuple[Path, EvalConfig], loaded: tuple[Any, Any]) -> None:
    model, tokenizer = loaded
    out, config = needle_run
    rows = _rows(out)
    samples = {s.id: s for s in build_samples(config, tokenizer, model)}
    full = {r["sample_id"]: r for r in rows if r["method"] == "full"}
    assert len(full) == 2
    for row in full.values():
        assert row["fidelity_kl"] == 0.0 and row["top1_agreement"] == 1.0 and row["gold_nll_delta"] == 0.0
        answer = row["answer_ids"]
        assert row["answer_tokens"] == len(answer) == row["generated_tokens"] >= 1
        assert tokenizer.decode(answer, skip_special_tokens=True) == row["prediction"]
        # the gold answer is the needle's number, teacher-forced over the full cache
        sample = samples[row["sample_id"]]
        assert sample.gold == row["meta"]["answer"] and row["gold_nll"] > 0.0
    for row in rows:
        assert {"fidelity_kl", "top1_agreement", "gold_nll", "gold_nll_delta", "answer_tokens"} <= row.keys()
        assert ("answer_ids" in row) is (row["method"] == "full")
        reference = full[row["sample_id"]]
        assert row["answer_tokens"] == reference["answer_tokens"]
        assert row["fidelity_kl"] >= 0.0 and 0.0 <= row["top1_agreement"] <= 1.0
        assert row["gold_nll_delta"] == pytest.approx(row["gold_nll"] - reference["gold_nll"], abs=1e-12)
    compressed = [r for r in rows if r["method"] != "full"]
    assert any(r["fidelity_kl"] > 0.0 for r in compressed)  # a 30% cache of a random model is not the full cache
    # the KL recomputed by hand for one configuration: the full answer teacher-forced over both caches
    from ripplekv_eval.fastpath.fidelity import fidelity, teacher_forced_logprobs

    row = next(r for r in compressed if r["method"] == "snapkv")
    sample = samples[row["sample_id"]]
    ids = torch.tensor([list(sample.input_ids)])
    answer = full[row["sample_id"]]["answer_ids"]
    press = make_press("snapkv", row["budget"], window_size=WINDOW)
    reference = teacher_forced_logprobs(model, prefill(model, ids), answer)
    candidate = teacher_forced_logprobs(model, prefill(model, ids, press), answer)
    assert row["fidelity_kl"] == pytest.approx(fidelity(reference, candidate, answer).kl, rel=1e-6, abs=1e-9)


def test_score_fidelity_decodes_only_the_full_cache(
    needle_run: tuple[Path, EvalConfig], loaded: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = loaded
    reference, config = needle_run
    counter = _DecodeCounter(monkeypatch)
    out = tmp_path / "fidelity"
    summary = run_eval(replace(config, score="fidelity"), out, model, tokenizer, progress=False)
    assert summary.rows == 14 and counter.calls == 2  # one full-cache answer per sample, nothing else decoded
    assert json.loads((out / CONFIG_FILE).read_text())["config"]["score"] == "fidelity"
    both = _comparable(_rows(reference))
    for key, row in _comparable(_rows(out)).items():
        if row["method"] == "full":
            assert row == both[key]  # decoded and scored as in a "both" run
            continue
        assert row["prediction"] is None and row["score"] is None and row["generated_tokens"] == 0
        fidelity_fields = ("fidelity_kl", "top1_agreement", "gold_nll", "gold_nll_delta", "kept_tokens")
        assert {k: row[k] for k in fidelity_fields} == {k: both[key][k] for k in fidelity_fields}


def test_batched_decoding_gives_the_sequential_rows(
    needle_run: tuple[Path, EvalConfig], loaded: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default run decodes each sample's compressed configurations as one batch; one at a time gives the
    same rows (the reference run's predictions are also checked against direct prefills above)."""
    model, tokenizer = loaded
    reference, config = needle_run
    batched = [row for row in _rows(reference) if row["method"] != "full"]
    sizes = [row["decode_rows"] for row in batched]  # snapkv, adakv, ripplekv x 2 budgets per sample
    assert all(1 <= size <= 6 for size in sizes) and max(sizes) > 1
    counter = _DecodeCounter(monkeypatch)
    out = tmp_path / "sequential"
    run_eval(replace(config, decode="sequential"), out, model, tokenizer, progress=False)
    assert counter.calls == 14  # every configuration decoded alone
    sequential = _comparable(_rows(out))
    assert _comparable(_rows(reference)) == sequential
    counter.calls = 0
    run_eval(replace(config, decode_rows=4), tmp_path / "chunks", model, tokenizer, progress=False)
    assert counter.calls == 2  # the full caches only
    chunks = _comparable(_rows(tmp_path / "chunks"))
    assert {row.get("decode_rows") for row in _rows(tmp_path / "chunks")} <= {None, 1, 2, 3, 4}
    assert chunks == sequential


def test_resume_mid_sample_reuses_the_stored_answer(
    needle_run: tuple[Path, EvalConfig], loaded: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = loaded
    _, config = needle_run
    config = replace(config, score="fidelity")
    straight = tmp_path / "straight"
    run_eval(config, straight, model, tokenizer, progress=False)

    class Interrupted(Exception):
        pass

    def stop_after_two(row: dict[str, Any]) -> None:
        if row["method"] == "snapkv":  # the full row and one more of the first sample are written
            raise Interrupted

    out = tmp_path / "resumed"
    with pytest.raises(Interrupted):
        run_eval(config, out, model, tokenizer, on_row=stop_after_two, progress=False)
    assert [r["method"] for r in _rows(out)] == ["full", "snapkv"]
    counter = _DecodeCounter(monkeypatch)
    summary = run_eval(config, out, model, tokenizer, progress=False)
    assert summary.new_rows == 12 and counter.calls == 1  # only the second sample's answer is decoded
    assert _comparable(_rows(out)) == _comparable(_rows(straight))


def test_full_cache_is_the_reference_without_a_full_row(
    needle_run: tuple[Path, EvalConfig], loaded: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = loaded
    reference, config = needle_run
    counter = _DecodeCounter(monkeypatch)
    out = tmp_path / "no-full"
    summary = run_eval(replace(config, methods=("snapkv",), budgets=(0.3,)), out, model, tokenizer, progress=False)
    # the full cache's answer per sample, decoded alone (snapkv's goes through the batched decoder)
    assert summary.rows == 2 and counter.calls == 2
    both = _comparable(_rows(reference))
    for key, row in _comparable(_rows(out)).items():
        assert row["method"] == "snapkv" and "answer_ids" not in row
        assert {k: v for k, v in row.items() if k != "meta"} == {k: v for k, v in both[key].items() if k != "meta"}


def test_first_generated_token_is_never_a_stop_token(
    model_dir: Path, loaded: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LongBench's pred.py passes min_length so samsum never answers a bare newline; here for every task."""
    model, tokenizer = loaded
    data = tmp_path / "longbench"
    _write_longbench(data)
    options = {"data_dir": str(data), "max_length": 200}
    config = EvalConfig(suite="longbench", methods=("full",), options=options, window_size=WINDOW, max_new_tokens=3)
    samples = build_samples(config, tokenizer, model)
    # every sample's most likely first token is made a stop token (end of sequence)
    firsts = {int(prefill(model, torch.tensor([list(s.input_ids)])).next_logits.argmax()) for s in samples}
    eos = sorted(firsts | eos_ids(model, tokenizer))
    monkeypatch.setattr(model.generation_config, "eos_token_id", eos)
    run_eval(config, tmp_path / "out", model, tokenizer, progress=False)
    rows = _rows(tmp_path / "out")
    assert {r["task"] for r in rows} == {"hotpotqa", "samsum"} and len(rows) == 4
    for row, sample in zip(rows, samples):
        stops = set(eos) | sample.extra_stop_ids
        assert row["answer_ids"][0] not in stops, row
        assert row["generated_tokens"] >= 1 and row["prediction"]


def test_a_press_that_cannot_be_derived_runs_its_own_prefill(
    needle_run: tuple[Path, EvalConfig], loaded: tuple[Any, Any]
) -> None:
    from ripplekv.presses.full_press import FullPress
    from ripplekv_eval.running.rows import SampleRunner

    class HookPress(FullPress):
        """Overrides kvpress's forward hook: its effect cannot be replayed from a recorded prefill."""

        def forward_hook(self, *args: Any, **kwargs: Any) -> Any:
            return super().forward_hook(*args, **kwargs)

    model, tokenizer = loaded
    _, config = needle_run
    sample = build_samples(config, tokenizer, model)[0]
    runner = SampleRunner(config, model, tokenizer, {("full", 1.0): FullPress(), ("snapkv", 0.3): HookPress()})
    full, hooked = runner.run_sample(sample, [("full", 1.0), ("snapkv", 0.3)])
    assert hooked["kept_tokens"] == full["kept_tokens"] and hooked["fidelity_kl"] == 0.0  # the full cache, prefilled
    with pytest.raises(ValueError, match="must hold the full cache's press"):
        SampleRunner(config, model, tokenizer, {})


def test_decode_groups_stay_within_the_memory_bound(
    needle_run: tuple[Path, EvalConfig], loaded: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Configurations are laid out and decoded in groups within --decode-memory; earlier groups are released,
    and the rows are the reference run's whatever the bound (one group per row up to one group per sample)."""
    import gc
    import weakref

    from ripplekv.inference.generate import full_cache_bytes
    from ripplekv_eval.fastpath import derive as derive_module
    from ripplekv_eval.running import rows as rows_module
    from ripplekv_eval.running.runner import build_presses

    model, tokenizer = loaded
    reference, config = needle_run
    built: list[weakref.ref] = []
    derived: list[weakref.ref] = []
    make_row, derive = rows_module.decode_row, derive_module.derived_prefill

    def tracked_row(state: Any, room: int) -> Any:
        row = make_row(state, room)
        built.append(weakref.ref(row))
        return row

    def tracked_derive(record: Any, press: Any) -> Any:
        state, seconds = derive(record, press)
        derived.append(weakref.ref(state.cache))
        return state, seconds

    monkeypatch.setattr(rows_module, "decode_row", tracked_row)
    monkeypatch.setattr(derive_module, "derived_prefill", tracked_derive)
    sample = build_samples(config, tokenizer, model)[0]
    presses = build_presses(config, load_run_profiles(config).profile, model)
    expected = _comparable([r for r in _rows(reference) if r["sample_id"] == sample.id])
    full_bytes = full_cache_bytes(model, len(sample.input_ids))  # the default bound (question-aware)
    sizes = []
    for bound in (1, None, 10**12):
        groups: list[int] = []

        def on_group(nbytes: int, bound: int | None = bound, groups: list[int] = groups) -> None:
            gc.collect()
            live = [ref() for ref in built if ref() is not None]
            assert sum(row.nbytes() for row in live) == nbytes  # rows of earlier groups were released
            assert len([ref for ref in derived if ref() is not None]) <= 2  # the full cache and the one being scored
            assert len(live) == 1 or nbytes <= (bound or full_bytes)
            groups.append(len(live))

        built.clear()
        derived.clear()
        runner = rows_module.SampleRunner(replace(config, decode_memory=bound), model, tokenizer, presses, on_group)
        rows = list(runner.run_sample(sample, config.configurations))
        assert _comparable(rows) == expected
        assert [r["decode_rows"] for r in rows if r["method"] != "full"] == [n for n in groups for _ in range(n)]
        sizes.append(groups)
    assert sizes[0] == [1] * 6 and sizes[2] == [6]  # one row per group (a 1-byte bound) up to the whole sample
    assert all(n >= 1 for n in sizes[1])


def test_decode_memory_is_an_option(tmp_path: Path, needle_run: tuple[Path, EvalConfig]) -> None:
    _, config = needle_run
    with pytest.raises(ValueError, match="decode_memory must be an integer >= 1"):
        replace(config, decode_memory=0)
    from ripplekv.cli.main import build_parser

    args = build_parser().parse_args(["eval", "--suite", "needle", "--out", str(tmp_path), "--decode-memory", "1.5GiB"])
    assert args.decode_memory == 3 * 2**29
