"""``ripplekv analyze``: per-layer damage on a suite's prompts, its rank agreement with a profile, oracle profiles.

The prompts are ``ripplekv eval``'s (:func:`ripplekv_eval.running.runner.build_samples`). Output folder::

    config.json                   what ran (compared on resume; profile and statistics options only shape the summary)
    damage.jsonl                  one row per (prompt, budget), flushed and fsynced as it finishes
    analysis.json                 the summary (:func:`ripplekv_eval.analysis.report.summarize`)
    damage_profile_b<budget>.json the damage profile per budget (:mod:`ripplekv.profiling.damage_profile`)
    plots/                        :func:`ripplekv_eval.analysis.plots.write_analysis_plots`

A row: ``sample_id``, ``task``, ``method`` (``snapkv``), ``budget``, ``prompt_tokens``, ``compressed_tokens`` (the
prefilled part), ``kept_tokens``, ``damage_kl`` and ``damage_top1`` (per layer, only that layer compressed),
``uniform_kl`` and ``uniform_top1`` (every layer compressed), ``answer_tokens``, ``answer_ids`` (reused on resume),
``seconds``, ``prefill_seconds``, ``meta``. Re-running resumes (an interrupted last line is redone); a folder of
another configuration is refused.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.profiling.damage_profile import make_damage_profile
from ripplekv.profiling.profile import SensitivityProfile, write_json_atomic
from ripplekv_eval.analysis.damage import DAMAGE_METHOD, DamageRunner
from ripplekv_eval.analysis.report import summarize
from ripplekv_eval.reporting.stats import DEFAULT_RESAMPLES, MIN_RESAMPLES
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.results import budgets_of, open_results, run_pending
from ripplekv_eval.running.runner import build_samples, resolve_config
from ripplekv_eval.suites import get_suite

__all__ = [
    "ANALYSIS_FILE",
    "DAMAGE_FILE",
    "DEFAULT_ANSWER_TOKENS",
    "DEFAULT_TOP_K",
    "AnalysisConfig",
    "AnalysisSummary",
    "damage_profile_name",
    "run_analysis",
]

DAMAGE_FILE = "damage.jsonl"
ANALYSIS_FILE = "analysis.json"
DEFAULT_TOP_K = 5
DEFAULT_ANSWER_TOKENS = 32
"""``ripplekv analyze``'s default cap on the answer teacher-forced."""


def damage_profile_name(budget: float) -> str:
    """The file name of the damage profile at ``budget`` (``damage_profile_b0p1.json`` for 0.1)."""
    return "damage_profile_b" + f"{float(budget):g}".replace(".", "p") + ".json"


@dataclass(frozen=True)
class AnalysisConfig:
    """What ``ripplekv analyze`` runs.

    Args:
        eval: the suite and its options, as for ``ripplekv eval``; its ``methods`` and ``score`` are ignored (one layer
            is compressed with SnapKV; only fidelity is measured).
        top_k: how many of the most damaging layers are compared with each predictor's (>= 1).
        resamples: bootstrap resamples (at least the report's minimum, 2000).
    """

    eval: EvalConfig
    top_k: int = DEFAULT_TOP_K
    resamples: int = DEFAULT_RESAMPLES
    bootstrap_seed: int = 0
    plots: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.eval, EvalConfig):
            raise TypeError(f"eval must be an EvalConfig, got {type(self.eval).__name__}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"top_k must be an integer >= 1, got {self.top_k!r}")
        if isinstance(self.resamples, bool) or not isinstance(self.resamples, int) or self.resamples < MIN_RESAMPLES:
            raise ValueError(f"resamples must be an integer >= {MIN_RESAMPLES}, got {self.resamples!r}")
        if isinstance(self.bootstrap_seed, bool) or not isinstance(self.bootstrap_seed, int) or self.bootstrap_seed < 0:
            raise ValueError(f"bootstrap_seed must be an integer >= 0, got {self.bootstrap_seed!r}")
        if not isinstance(self.plots, bool):
            raise TypeError(f"plots must be a bool, got {type(self.plots).__name__}")
        if not self.eval.budget_values:
            raise ValueError("no budgets given")
        for budget in self.eval.budgets:
            if not 0 < float(budget) <= 1:
                raise ValueError(f"budget {budget} out of range: analyze takes kept fractions in (0, 1]")


@dataclass(frozen=True)
class AnalysisSummary:
    """What one :func:`run_analysis` call did.

    Args:
        rows: damage rows in ``damage.jsonl`` at the end.
        new_rows: rows written by this call.
        files: the files written besides ``damage.jsonl`` (summary, damage profiles, plots).
    """

    out: Path
    summary: dict[str, Any]
    rows: int
    new_rows: int
    samples: int
    files: tuple[Path, ...]
    seconds: float


def run_analysis(
    config: AnalysisConfig,
    out: str | os.PathLike[str],
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    progress: bool = True,
) -> AnalysisSummary:
    """Run (or resume) the analysis ``config`` into ``out`` (created).

    ``model`` is loaded from ``config.eval.model`` unless given together with ``tokenizer``.
    """

    from ripplekv.models import model_identity
    from ripplekv.models.identity import weights_fingerprint
    from ripplekv.version import __version__

    start = time.perf_counter()
    options = replace(config.eval, methods=(DAMAGE_METHOD,), score="fidelity")
    profile = SensitivityProfile.load(options.profile) if options.profile is not None else None
    if model is None or tokenizer is None:
        from ripplekv.models import load_model

        model, tokenizer = load_model(options.model, dtype=options.dtype, device=options.device)
    if profile is not None:
        profile.check_model(model)
    runner = DamageRunner(options, model, tokenizer)
    samples = build_samples(options, tokenizer, model)
    resolved = {"kind": "layer-damage", **resolve_config(options, model, samples, None)}

    sources = {"model": options.model, **get_suite(options.suite).sources(options), "profile": options.profile}
    budgets = list(options.budget_values)
    configurations = [(DAMAGE_METHOD, b) for b in budgets]
    with open_results(out, resolved, sources, rows_file=DAMAGE_FILE, answers_from=None) as folder:
        written = run_pending(
            samples, configurations, folder, budgets_of(runner.run_sample), desc="analyze", progress=progress
        )
    out = folder.out

    order = {s.id: i for i, s in enumerate(samples)}
    rows = sorted(
        (r for r in folder.log.read() if str(r["sample_id"]) in order and float(r["budget"]) in budgets),
        key=lambda r: (order[str(r["sample_id"])], float(r["budget"])),
    )
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
    for budget in budgets:
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
        files.append(damage.save(out / damage_profile_name(budget)))
    if config.plots:
        from ripplekv_eval.analysis.plots import write_analysis_plots

        files += write_analysis_plots(summary, out / "plots")
    return AnalysisSummary(
        out=out,
        summary=summary,
        rows=len(rows),
        new_rows=written,
        samples=len(samples),
        files=tuple(files),
        seconds=time.perf_counter() - start,
    )
