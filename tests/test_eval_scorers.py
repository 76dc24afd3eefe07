"""The token scorer as an axis of ``ripplekv eval`` (``--scorers``): configurations, rows, resume and report."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ripplekv.presses import scorers as scorer_registry
from ripplekv.presses.descriptions import SCORER_DESCRIPTIONS
from ripplekv.presses.registry import make_press
from ripplekv.profiling.haystack import ESSAY_PACKAGE, INSTALL_COMMAND
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv_eval.reporting import report as report_module
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.results import ConfigMismatchError, ResultsLog, complete_samples, row_key
from ripplekv_eval.running.runner import build_samples, resolve_config, run_eval
from ripplekv_eval.sample import DEFAULT_SCORER, configuration_name, row_configuration, split_configuration
from tests.test_eval_runner import RESULTS_FILE, TIMING, WINDOW, _direct_prediction, loaded, model_dir, profile_path

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec(ESSAY_PACKAGE) is None, reason=f"essay package missing: {INSTALL_COMMAND}"
    ),
    pytest.mark.usefixtures("one_thread"),
]

__all__ = ["loaded", "model_dir", "profile_path"]  # fixtures used here

SCORERS = ("snapkv", "expected_attention", "tova")
SCHEDULES = ("snapkv", "pyramidkv", "ripplekv", "cake", "squeezeattention", "dynamickv", "lava")
METHODS = ("full", "streamingllm", *SCHEDULES)


def _config(profile: Path, **changes: Any) -> EvalConfig:
    config = EvalConfig(
        suite="needle",
        methods=METHODS,
        scorers=SCORERS,
        budgets=(0.3,),
        profile=str(profile),
        options={"needle_lengths": (160,), "needle_depths": (0.2, 0.8), "needle_digits": 4},
        window_size=WINDOW,
        max_new_tokens=4,
    )
    return replace(config, **changes)


def _rows(out: Path) -> list[dict[str, Any]]:
    return ResultsLog(out / RESULTS_FILE).read()


def _keyed(rows: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    return {row_key(r): {k: v for k, v in r.items() if k not in TIMING} for r in rows}


def test_the_default_scorer_keeps_every_name_and_the_registries_agree() -> None:
    assert DEFAULT_SCORER == scorer_registry.DEFAULT_SCORER == scorer_registry.SCORERS[0]
    assert set(SCORER_DESCRIPTIONS) == set(scorer_registry.SCORERS)
    assert configuration_name("ripplekv", "snapkv") == "ripplekv" == configuration_name("ripplekv", None)
    assert configuration_name("ripplekv", "tova") == "ripplekv@tova"
    assert split_configuration("ripplekv@tova") == ("ripplekv", "tova")
    assert split_configuration("ripplekv-local") == ("ripplekv-local", None)
    old_row = {"sample_id": "a", "method": "cake", "budget": 0.1}  # written before rows had a scorer
    assert row_configuration(old_row) == "cake" == row_configuration({**old_row, "scorer": "snapkv"})
    assert row_configuration({**old_row, "scorer": "tova"}) == "cake@tova"


def test_configurations_run_every_scored_method_under_every_scorer(profile_path: Path) -> None:
    config = _config(profile_path)
    names = [name for name, _ in config.configurations]
    assert names == [
        "full",
        "streamingllm",  # no scorer: once
        *SCHEDULES,
        *(f"{m}@expected_attention" for m in SCHEDULES),
        *(f"{m}@tova" for m in SCHEDULES),
    ]
    default = _config(profile_path, scorers=("snapkv",))
    assert [n for n, _ in default.configurations] == list(METHODS)


@pytest.mark.parametrize(
    ("scorers", "message"),
    [((), "no scorers"), (("tova", "nope"), "unknown scorer"), (("tova", "tova"), "duplicates")],
)
def test_bad_scorers_are_clear_errors(profile_path: Path, scorers: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _config(profile_path, scorers=scorers)


def test_make_press_takes_a_scorer_by_name() -> None:
    built = make_press("snapkv", 0.3, scorer="knorm")
    assert type(built.press).__name__ == "KnormPress"
    assert make_press("snapkv", 0.3, scorer="snapkv", window_size=16).press.window_size == 16
    with pytest.raises(ValueError, match="unknown scorer"):
        make_press("snapkv", 0.3, scorer="nope")
    with pytest.raises(ValueError, match="no token scorer"):
        make_press("streamingllm", 0.3, scorer="tova")


@pytest.fixture(scope="module")
def scored_run(
    loaded: tuple[Any, Any], profile_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, EvalConfig]:
    model, tokenizer = loaded
    out = tmp_path_factory.mktemp("runs") / "scorers"
    config = _config(profile_path)
    summary = run_eval(config, out, model, tokenizer, progress=False)
    assert summary.rows == summary.new_rows == 2 * len(config.configurations)
    return out, config


def test_rows_record_method_and_scorer_and_match_direct_prefills(
    scored_run: tuple[Path, EvalConfig], loaded: tuple[Any, Any]
) -> None:
    """Every row is what a prefill with ``make_press(method, scorer=...)`` itself gives (no state shared across the
    scorers of one recorded prefill)."""
    model, tokenizer = loaded
    out, config = scored_run
    rows = _rows(out)
    samples = {s.id: s for s in build_samples(config, tokenizer, model)}
    profile = SensitivityProfile.load(config.profile)
    seen = set()
    for row in rows:
        seen.add((row["method"], row["scorer"]))
        if row["method"] in ("full", "streamingllm"):
            assert row["scorer"] is None
            continue
        press = make_press(row["method"], row["budget"], profile=profile, window_size=WINDOW, scorer=row["scorer"])
        sample = samples[row["sample_id"]]
        assert row["prediction"] == _direct_prediction(model, tokenizer, sample, press, config.protocol), row
    assert seen == {("full", None), ("streamingllm", None)} | {(m, s) for m in SCHEDULES for s in SCORERS}
    kl = {(r["sample_id"], r["method"], r["scorer"]): r["fidelity_kl"] for r in rows}
    assert any(kl[sid, m, "tova"] != kl[sid, m, "snapkv"] for sid, m, s in kl if s == "snapkv"), (
        "the scorers must change the caches"
    )


def test_one_scorer_alone_gives_the_rows_of_a_run_over_several(
    scored_run: tuple[Path, EvalConfig], loaded: tuple[Any, Any], tmp_path: Path
) -> None:
    model, tokenizer = loaded
    out, config = scored_run
    alone = tmp_path / "tova"
    run_eval(replace(config, scorers=("tova",), methods=("full", "cake")), alone, model, tokenizer, progress=False)
    together = _keyed(_rows(out))
    for key, row in _keyed(_rows(alone)).items():
        assert together[key] == row


def test_the_default_scorer_resumes_runs_written_before_the_axis(
    loaded: tuple[Any, Any], profile_path: Path, tmp_path: Path
) -> None:
    """A default run's configuration holds no ``scorers`` (so older folders resume), and rows without a ``scorer``
    field count as SnapKV's when a run resumes."""
    model, tokenizer = loaded
    config = _config(profile_path, scorers=("snapkv",), methods=("full", "snapkv", "cake"))
    samples = build_samples(config, tokenizer, model)
    assert "scorers" not in resolve_config(config, model, samples, SensitivityProfile.load(config.profile))
    assert "scorers" in resolve_config(_config(profile_path), model, samples, SensitivityProfile.load(config.profile))
    out = tmp_path / "old"
    run_eval(config, out, model, tokenizer, progress=False)
    log = out / RESULTS_FILE
    old_rows = [{k: v for k, v in r.items() if k != "scorer"} for r in _rows(out)]
    log.write_text("".join(json.dumps(r) + "\n" for r in old_rows))
    assert run_eval(config, out, model, tokenizer, progress=False).new_rows == 0
    complete, missing = complete_samples(old_rows, config.configurations)
    assert len(complete) == len(old_rows) and missing == 0


def test_report_analyses_each_scorer_on_its_own(scored_run: tuple[Path, EvalConfig]) -> None:
    out, _ = scored_run
    text = report_module.report(out, resamples=2000)
    assert "## Allocation x scorer" in text
    for scorer in SCORERS:
        assert f"## Significance (scorer {scorer})" in text
        assert f"| {scorer} |" in text  # the scorers' legend
    # within a scorer the schedules are compared over that scorer only: never a name of another scorer
    part = text.split("## Significance (scorer expected_attention)")[1].split("## Significance (scorer tova)")[0]
    assert "@" not in part and "ripplekv vs snapkv" in part
    document = json.loads(report_module.report(out, fmt="json", resamples=2000))
    assert document["statistics"] is None
    by_scorer = document["statistics_by_scorer"]
    assert list(by_scorer) == list(SCORERS)
    assert by_scorer["tova"]["methods"] == list(METHODS)
    estimates = by_scorer["expected_attention"]["statistics"]["metrics"]["fidelity_kl"]["estimates"]
    assert {e["method"] for e in estimates} == set(METHODS)


def test_rows_written_before_the_scorer_field_report_under_every_scorer(
    scored_run: tuple[Path, EvalConfig], tmp_path: Path
) -> None:
    """A run extended with scorers holds its old rows without a ``scorer`` field: the full cache's (and a method
    without a scorer) count under every scorer, a scored method's as SnapKV's, so the report is the one of the
    same rows written with the field (reading a missing field as SnapKV's left the full cache out of every other
    scorer's complete samples)."""
    out, _ = scored_run
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_text((out / "config.json").read_text())
    rows = [
        {k: v for k, v in r.items() if k != "scorer" or r["scorer"] not in (None, DEFAULT_SCORER)} for r in _rows(out)
    ]
    assert any("scorer" not in r and r["method"] == "full" for r in rows)
    (legacy / RESULTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    options = {"fmt": "json", "resamples": 2000}
    expected = json.loads(report_module.report(out, **options))
    got = json.loads(report_module.report(legacy, **options))
    assert got["statistics_by_scorer"] == expected["statistics_by_scorer"]
    # the summary reads the field as the statistics do: streamingllm's rows ran once, not once per scorer
    assert got["expected_rows"] == got["rows"] == len(rows)
    assert got == expected


def test_a_run_extended_with_scorers_keeps_its_rows_and_runs_only_the_new(
    loaded: tuple[Any, Any], profile_path: Path, tmp_path: Path
) -> None:
    model, tokenizer = loaded
    narrow = _config(profile_path, scorers=("snapkv",), methods=("full", "snapkv", "cake"))
    out = tmp_path / "grow"
    first = run_eval(narrow, out, model, tokenizer, progress=False)
    before = _keyed(_rows(out))
    wide = replace(narrow, scorers=("snapkv", "tova"), budgets=(0.3, 0.5))
    summary = run_eval(wide, out, model, tokenizer, progress=False)
    assert summary.new_rows == 2 * len(wide.configurations) - first.rows  # only the new configurations ran
    after = _keyed(_rows(out))
    assert {k: after[k] for k in before} == before
    saved = json.loads((out / "config.json").read_text())
    assert saved["config"]["scorers"] == ["snapkv", "tova"] and len(saved["extended_from"]) == 1
    assert "scorers" not in saved["extended_from"][0]["config"]
    with pytest.raises(ConfigMismatchError, match="window_size"):  # not an extension: another setting
        run_eval(replace(wide, window_size=WINDOW + 1), out, model, tokenizer, progress=False)
    with pytest.raises(ConfigMismatchError, match="scorers"):  # fewer scorers than the folder holds
        run_eval(narrow, out, model, tokenizer, progress=False)


def test_query_agnostic_rows_of_every_scorer_match_direct_prefills(
    loaded: tuple[Any, Any], profile_path: Path, tmp_path: Path
) -> None:
    """kvpress's protocol: the context compressed before the question is seen, for per-prompt schedules under
    several scorers too (the statistics come from the context's own window)."""
    model, tokenizer = loaded
    config = _config(
        profile_path,
        protocol="query-agnostic",
        methods=("full", "cake", "squeezeattention", "ripplekv"),
        scorers=("snapkv", "tova"),
    )
    out = tmp_path / "qa"
    run_eval(config, out, model, tokenizer, progress=False)
    samples = {s.id: s for s in build_samples(config, tokenizer, model)}
    profile = SensitivityProfile.load(config.profile)
    rows = [r for r in _rows(out) if r["method"] != "full"]
    assert len(rows) == 2 * 3 * 2
    for row in rows:
        sample = samples[row["sample_id"]]
        assert row["compressed_tokens"] == sample.question_start < row["prompt_tokens"]
        press = make_press(row["method"], row["budget"], profile=profile, window_size=WINDOW, scorer=row["scorer"])
        assert row["prediction"] == _direct_prediction(model, tokenizer, sample, press, "query-agnostic"), row
