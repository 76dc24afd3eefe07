"""``ripplekv analyze``: per-layer damage on a suite's prompts, its rank agreement with a profile, oracle profiles.

The prompts are ``ripplekv eval``'s (:func:`ripplekv_eval.running.runner.build_samples`). Output folder::

    config.json                   what ran (compared on resume; profile and statistics options only shape the summary)
    damage.jsonl                  one row per (prompt, budget), flushed and fsynced as it finishes
    analysis.json                 the summary (:func:`ripplekv_eval.analysis.report.summarize`)
    damage_profile_b<budget>.json the damage profile per budget (:mod:`ripplekv.profiling.damage_profile`)
    plots/                        :func:`ripplekv_eval.reporting.plots.write_analysis_plots`

A row: ``sample_id``, ``task``, ``method`` (``snapkv``), ``budget``, ``prompt_tokens``, ``compressed_tokens`` (the
prefilled part), ``kept_tokens``, ``damage_kl`` and ``damage_top1`` (per layer, only that layer compressed),
``uniform_kl`` and ``uniform_top1`` (every layer compressed), ``answer_tokens``, ``answer_ids`` (reused on resume),
``seconds``, ``prefill_seconds``, ``meta``. ``ripplekv tune`` (:func:`run_tune`) writes ``config.json``,
``tune.jsonl`` (:mod:`~ripplekv_eval.analysis.tuning`'s rows) and ``tune.json`` (its summary) the same way; both resume.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.presses.method_spec import parse_method
from ripplekv.presses.scorers import DEFAULT_SCORER
from ripplekv.profiling.damage_profile import make_damage_profile
from ripplekv.profiling.profile import ProfileError, SensitivityProfile, write_json_atomic
from ripplekv.validation import check_int
from ripplekv_eval.analysis.damage import DAMAGE_METHOD, DamageRunner
from ripplekv_eval.analysis.report import summarize
from ripplekv_eval.analysis.tuning import TUNE_METHOD, TuneConfig, TuneRunner, split_samples
from ripplekv_eval.analysis.tuning_report import summarize_tuning
from ripplekv_eval.reporting.stats import DEFAULT_RESAMPLES, MIN_RESAMPLES
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.results import RunResult, open_results, run_pending
from ripplekv_eval.running.runner import build_samples, loaded_model, resolve_config
from ripplekv_eval.sample import EvalSample
from ripplekv_eval.suites import get_suite

DAMAGE_FILE = "damage.jsonl"
ANALYSIS_FILE = "analysis.json"
TUNE_FILE = "tune.jsonl"
SUMMARY_FILE = "tune.json"
_KINDS = {"layer-damage": (DAMAGE_METHOD, DAMAGE_FILE, "analyze"), "tune": (TUNE_METHOD, TUNE_FILE, "tune")}
"""A run's ``config.json`` kind -> the method of its rows, its rows file, its progress label."""
DEFAULT_TOP_K = 5


def damage_profile_name(budget: float) -> str:
    """The file name of the damage profile at ``budget`` (``damage_profile_b0p1.json`` for 0.1)."""
    return "damage_profile_b" + f"{float(budget):g}".replace(".", "p") + ".json"


@dataclass(frozen=True)
class AnalysisConfig:
    """What ``ripplekv analyze`` runs."""

    eval: EvalConfig
    top_k: int = DEFAULT_TOP_K
    resamples: int = DEFAULT_RESAMPLES
    bootstrap_seed: int = 0
    plots: bool = True

    def __post_init__(self) -> None:  # the suite and budgets are checked by EvalConfig
        check_int("top_k", self.top_k)
        check_int("resamples", self.resamples, MIN_RESAMPLES)
        check_int("bootstrap_seed", self.bootstrap_seed, 0)


def _run_rows(
    runner: DamageRunner | TuneRunner,
    options: EvalConfig,
    samples: list[EvalSample],
    resolved: dict[str, Any],
    sources: dict[str, Any],
    out: str | os.PathLike[str],
    progress: bool,
) -> tuple[Path, int, list[dict[str, Any]]]:
    """Run (or resume) ``runner`` on ``samples`` at every budget into ``out`` (``sources`` recorded after the model's
    and the suite's); return the folder, the rows written and the samples' rows it holds."""
    sources = {"model": options.model, **get_suite(options.suite).sources(options), **sources}
    budgets = options.budget_values
    method, rows_file, desc = _KINDS[resolved["kind"]]
    with open_results(out, resolved, sources, rows_file=rows_file, answers_from=None) as folder:
        written = run_pending(
            samples,
            [(method, b) for b in budgets],
            folder,
            lambda sample, pending, answer: runner.run_sample(sample, [b for _, b in pending], answer),
            desc=desc,
            progress=progress,
        )
    ids = {s.id for s in samples}
    rows = [r for r in folder.log.read() if str(r["sample_id"]) in ids and float(r["budget"]) in budgets]
    return folder.out, written, rows


def _save_unless_unchanged(profile: SensitivityProfile, path: Path) -> Path:
    """Write ``profile`` unless ``path`` already holds it but for its ``created`` time: rerunning a complete analysis
    then leaves its damage profiles byte for byte, so runs that fingerprint them (``--oracle-profile``) resume."""
    if path.is_file():
        try:
            saved = SensitivityProfile.load(path)
        except ProfileError:
            saved = None
        if saved is not None and replace(profile, created=saved.created) == saved:
            return path
    return profile.save(path)


def run_analysis(
    config: AnalysisConfig,
    out: str | os.PathLike[str],
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    progress: bool = True,
) -> RunResult:
    """Run (or resume) the analysis ``config`` into ``out`` (the model loaded unless given with its tokenizer)."""
    from ripplekv.models.identity import model_identity, weights_fingerprint
    from ripplekv.version import __version__

    start = time.perf_counter()
    options = replace(config.eval, methods=(DAMAGE_METHOD,), score="fidelity")
    profile = SensitivityProfile.load(options.profile) if options.profile is not None else None
    model, tokenizer = loaded_model(options, model, tokenizer)
    if profile is not None:
        profile.check_model(model)
    runner = DamageRunner(options, model, tokenizer)
    samples = build_samples(options, tokenizer, model)
    resolved = {"kind": "layer-damage", **resolve_config(options, model, samples, None)}
    out, written, rows = _run_rows(runner, options, samples, resolved, {"profile": options.profile}, out, progress)
    order = {s.id: i for i, s in enumerate(samples)}
    rows.sort(key=lambda r: (order[str(r["sample_id"])], float(r["budget"])))
    identity = model_identity(model)
    context = {
        "model": identity.get("name_or_path"),
        "suite": options.suite,
        "prompts": len(samples),
        "layers": identity["num_hidden_layers"],
        "scorer": DAMAGE_METHOD,
        "window_size": options.window_size,
        "protocol": options.protocol,
        "samples_sha256": resolved["samples"]["sha256"],
        "profile_path": options.profile,
    }
    summary = summarize(
        rows, profile, options.window_size, config.top_k, config.resamples, config.bootstrap_seed, context=context
    )
    files = [write_json_atomic(out / ANALYSIS_FILE, summary)]
    fingerprint = weights_fingerprint(model)
    for budget in options.budget_values:
        at_budget = [r for r in rows if float(r["budget"]) == budget]
        calibration = {
            "description": f"layer damage on {len(at_budget)} {options.suite} prompts ({out / DAMAGE_FILE})",
            "sha256": resolved["samples"]["sha256"],
            "samples": len(at_budget),
            "suite": options.suite,
            "sample_ids": [str(r["sample_id"]) for r in at_budget],
        }
        damage = make_damage_profile(
            identity,
            [r["damage_kl"] for r in at_budget],
            budget,
            calibration,
            DAMAGE_METHOD,
            options.window_size,
            __version__,
            fingerprint,
        )
        files.append(_save_unless_unchanged(damage, out / damage_profile_name(budget)))
    if config.plots:
        from ripplekv_eval.reporting.plots import write_analysis_plots

        files += write_analysis_plots(summary, out / "plots")
    seconds = time.perf_counter() - start
    return RunResult(out, len(rows), written, len(samples), seconds, summary=summary, files=tuple(files))


def run_tune(
    config: TuneConfig,
    out: str | os.PathLike[str],
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    progress: bool = True,
) -> RunResult:
    """Run (or resume) the tuning ``config`` into ``out``; see the module docstring."""
    from ripplekv.models.identity import model_identity

    start = time.perf_counter()
    options = replace(config.eval, methods=("snapkv",), score="fidelity", profile=None)
    profiles = {label: SensitivityProfile.load(path) for label, path in config.profiles.items()}
    model, tokenizer = loaded_model(options, model, tokenizer)
    for label, profile in profiles.items():
        try:
            profile.check_model(model)
        except ValueError as err:
            raise ValueError(f"profile {label!r} ({config.profiles[label]}): {err}") from err
    runner = TuneRunner(config, profiles, model, tokenizer)
    samples = build_samples(options, tokenizer, model)
    calibration, heldout = split_samples(samples, config.calibration_fraction)
    resolved = {
        "kind": "tune",
        **resolve_config(options, model, samples, None),
        "profiles": {
            label: hashlib.sha256(Path(path).read_bytes()).hexdigest() for label, path in config.profiles.items()
        },
        "ratios": list(config.ratios),
        "gammas": list(config.gammas),
        "calibration_fraction": float(config.calibration_fraction),
    }
    if config.method_candidates or config.scorer != DEFAULT_SCORER:  # runs without them keep their old identity
        resolved["grids"] = [spec.canonical() for spec in config.method_candidates]
        resolved["scorer"] = config.scorer
    out, written, rows = _run_rows(
        runner, options, samples, resolved, {"profiles": dict(config.profiles)}, out, progress
    )
    context = {
        "model": model_identity(model).get("name_or_path"),
        "suite": options.suite,
        "prompts": len(samples),
        "calibration_prompts": len(calibration),
        "heldout_prompts": len(heldout),
        "profiles": dict(config.profiles),
        "ratios": list(config.ratios),
        "gammas": list(config.gammas),
        "window_size": options.window_size,
        "protocol": options.protocol,
        "samples_sha256": resolved["samples"]["sha256"],
    }
    summary = summarize_tuning(
        rows,
        [c.key for c in config.candidates],
        config.default.key,
        calibration,
        heldout,
        config.resamples,
        config.bootstrap_seed,
        context=context,
    )
    if config.method_candidates:
        groups = config.method_groups
        summary["methods"] = {  # each rival's grid against its own defaults (its plain name), as RippleKV's
            method: summarize_tuning(
                rows, list(keys), method, calibration, heldout, config.resamples, config.bootstrap_seed
            )
            for method, keys in groups.items()
        }
        shared = next(c for c in config.candidates if c.key == summary["shared"])
        ripple = parse_method("ripplekv", r=float(shared.ratio), gamma=float(shared.gamma)).canonical()
        summary["settings"] = {"ripplekv": ripple} | {m: entry["shared"] for m, entry in summary["methods"].items()}
        summary["context"]["grids"] = {name: list(keys) for name, keys in groups.items()}
        summary["context"]["scorer"] = config.scorer
    write_json_atomic(out / SUMMARY_FILE, summary)
    return RunResult(out, len(rows), written, len(samples), time.perf_counter() - start, summary=summary)
