"""``ripplekv tune``'s run: the rows of :mod:`ripplekv_eval.analysis.tuning`, resumable, then the summary.

Output folder::

    config.json   what ran (compared on resume: suite, prompts, model, budgets, profiles' content, the grid, split)
    tune.jsonl    one row per (prompt, budget), appended, flushed and fsynced as it finishes
    tune.json     the summary (:func:`ripplekv_eval.analysis.tuning_report.summarize_tuning`)

Re-running the same command resumes: finished rows are kept, an interrupted last line is redone, and a folder that
holds another configuration is refused. An interruption loses at most the prompt (budget) in flight.
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
from ripplekv.profiling.profile import SensitivityProfile, write_json_atomic
from ripplekv_eval.analysis.tuning import TUNE_METHOD, TuneConfig, TuneRunner, split_samples
from ripplekv_eval.analysis.tuning_report import summarize_tuning
from ripplekv_eval.running.results import open_results, run_pending
from ripplekv_eval.running.runner import build_samples, resolve_config
from ripplekv_eval.suites import get_suite

TUNE_FILE = "tune.jsonl"
SUMMARY_FILE = "tune.json"


@dataclass(frozen=True)
class TuneResult:
    """What one :func:`run_tune` call did."""

    out: Path
    summary: dict[str, Any]
    rows: int
    new_rows: int
    samples: int
    seconds: float


def _file_sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_tune(
    config: TuneConfig,
    out: str | os.PathLike[str],
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    progress: bool = True,
) -> TuneResult:
    """Run (or resume) the tuning ``config`` into ``out``; see the module docstring."""

    from ripplekv.models import model_identity

    start = time.perf_counter()
    options = replace(config.eval, methods=("snapkv",), score="fidelity", profile=None)
    profiles = {label: SensitivityProfile.load(path) for label, path in config.profiles.items()}
    if model is None or tokenizer is None:
        from ripplekv.models import load_model

        model, tokenizer = load_model(options.model, dtype=options.dtype, device=options.device)
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
        "profiles": {label: _file_sha256(path) for label, path in config.profiles.items()},
        "ratios": list(config.ratios),
        "gammas": list(config.gammas),
        "calibration_fraction": float(config.calibration_fraction),
    }
    if config.method_candidates or config.scorer != DEFAULT_SCORER:  # runs without them keep their old identity
        resolved["grids"] = [spec.canonical() for spec in config.method_candidates]
        resolved["scorer"] = config.scorer

    sources = {"model": options.model, **get_suite(options.suite).sources(options), "profiles": dict(config.profiles)}
    budgets = list(options.budget_values)
    configurations = [(TUNE_METHOD, b) for b in budgets]
    with open_results(out, resolved, sources, rows_file=TUNE_FILE, answers_from=None) as folder:
        written = run_pending(
            samples,
            configurations,
            folder,
            lambda sample, pending, answer: runner.run_sample(sample, [b for _, b in pending], answer),
            desc="tune",
            progress=progress,
        )
    out = folder.out

    ids = {s.id for s in samples}
    rows = [r for r in folder.log.read() if str(r["sample_id"]) in ids and float(r["budget"]) in budgets]
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
    return TuneResult(out, summary, len(rows), written, len(samples), time.perf_counter() - start)
