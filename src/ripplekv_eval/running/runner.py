"""``ripplekv eval``: score methods x budgets on a suite (LongBench, RULER, needle, a JSONL file, ...).

Per sample the prompt is prefilled **once** and recorded (:mod:`ripplekv_eval.fastpath`); every (method, budget)
cache is derived from it. The full cache's greedy answer, decoded once per sample (read back from the ``full`` row
on resume; decoded as the reference even when ``full`` is not run), and the gold answer are teacher-forced over
every cache for the fidelity columns (``top1_agreement`` excludes stop tokens at the first position, as decoding
does); with ``score="both"`` every configuration is also decoded and scored. ``query-agnostic`` compresses the
context only, then runs the question over each cache. Rows: :mod:`~ripplekv_eval.running.rows`; the folder and
its resume: :mod:`~ripplekv_eval.running.results` (a folder that only adds configurations, :data:`EXTENDABLE`,
is extended, keeping its rows).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpress.presses.base_press import BasePress
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.allocation.budget import BudgetSpec
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.presses.method_spec import base_method
from ripplekv.presses.registry import make_press
from ripplekv.profiling.damage_profile import (
    ORACLE_METHOD,
    damage_budget,
    require_damage_profile,
    select_oracle_profile,
)
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv_eval.running.config import DEFAULT_BUDGETS, DEFAULT_METHODS, FULL_BUDGET, EvalConfig, EvalSample
from ripplekv_eval.running.results import (
    CONFIG_FILE,
    RESULTS_FILE,
    ConfigMismatchError,
    ResultsLog,
    RunFolder,
    open_results,
    resume_state,
    run_pending,
    sha256_json,
)
from ripplekv_eval.running.rows import SampleRunner
from ripplekv_eval.sample import DEFAULT_SCORER, split_configuration
from ripplekv_eval.suites import SUITES, get_suite
from ripplekv_eval.suites.needle import DEFAULT_NEEDLE_DEPTHS, DEFAULT_NEEDLE_DIGITS, DEFAULT_NEEDLE_LENGTHS
from ripplekv_eval.suites.ruler import DEFAULT_CONTEXT_TOKENS, DEFAULT_RULER_SAMPLES

__all__ = [
    "CONFIG_FILE",
    "DEFAULT_BUDGETS",
    "DEFAULT_CONTEXT_TOKENS",
    "DEFAULT_METHODS",
    "DEFAULT_NEEDLE_DEPTHS",
    "DEFAULT_NEEDLE_DIGITS",
    "DEFAULT_NEEDLE_LENGTHS",
    "DEFAULT_RULER_SAMPLES",
    "FULL_BUDGET",
    "RESULTS_FILE",
    "SUITES",
    "ConfigMismatchError",
    "EvalConfig",
    "EvalSample",
    "EXTENDABLE",
    "EvalSummary",
    "ResultsLog",
    "RunFolder",
    "RunProfiles",
    "build_samples",
    "load_oracle_profiles",
    "load_run_profiles",
    "needs_sensitivity_profile",
    "open_run_folder",
    "resolve_config",
    "resume_state",
    "run_eval",
]


@dataclass(frozen=True)
class EvalSummary:
    """What one :func:`run_eval` call did: ``rows`` in ``results.jsonl`` at the end, ``new_rows`` written by it,
    ``configurations`` per sample, wall ``seconds``.
    """

    out: Path
    rows: int
    new_rows: int
    samples: int
    configurations: int
    seconds: float


def build_samples(
    config: EvalConfig, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None = None
) -> list[EvalSample]:
    """The samples of ``config.suite`` (in run order), with unique ids; ``model`` gives defaults (LongBench's
    ``max_length``).
    """
    samples = get_suite(config.suite).samples(config, tokenizer, model)
    if not samples:
        raise ValueError(f"the {config.suite} suite has no samples with these options")
    if len({s.id for s in samples}) != len(samples):
        raise ValueError("sample ids are not unique")
    return samples


def load_oracle_profiles(config: EvalConfig) -> tuple[SensitivityProfile, ...]:
    """The damage profiles of ``config.oracle_profile`` when ``ripplekv-oracle`` runs (else none), checked.

    Raises:
        ValueError: ``ripplekv-oracle`` runs without ``oracle_profile``, or a file is not a damage profile.
    """
    if ORACLE_METHOD not in {base_method(m) for m in config.methods}:
        return ()
    if not config.oracle_profile:
        raise ValueError(f"the {ORACLE_METHOD} method needs --oracle-profile (a damage profile: `ripplekv analyze`)")
    profiles = tuple(SensitivityProfile.load(path) for path in config.oracle_profile)
    for path, profile in zip(config.oracle_profile, profiles):
        try:
            require_damage_profile(ORACLE_METHOD, profile)
        except ValueError as err:
            raise ValueError(f"--oracle-profile {path}: {err}") from None
    return profiles


def resolve_config(
    config: EvalConfig,
    model: PreTrainedModel,
    samples: Sequence[EvalSample],
    profile: SensitivityProfile | None,
    oracles: Sequence[SensitivityProfile] | None = None,
) -> dict[str, Any]:
    """The configuration compared on resume: options with defaults filled in, the model's identity, the
    profile's content hash, and a hash of every sample's token ids (dataset, tokenizer and prompt format).

    The oracle profiles (``oracles``; None: loaded from ``config``) are recorded only when ``ripplekv-oracle`` runs, so
    the configuration of a run without it is unchanged.
    """
    oracles = load_oracle_profiles(config) if oracles is None else tuple(oracles)
    from ripplekv.models import model_identity

    resolved: dict[str, Any] = {
        "suite": config.suite,
        "model": model_identity(model),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "methods": list(config.methods),
        "budgets": [float(b) for b in config.budgets],
        **({"tokens": [int(t) for t in config.tokens]} if config.tokens else {}),  # absent: old runs resume
        **({"scorers": list(config.scorers)} if config.scorers != (DEFAULT_SCORER,) else {}),  # likewise
        "protocol": config.protocol,
        "window_size": config.window_size,
        "max_new_tokens": config.max_new_tokens,
        "seed": config.seed,
        "profile": None if profile is None else {"sha256": sha256_json(profile.to_dict())},
        "score": config.score,
        "chat_template": config.chat_template,
    }
    if oracles:
        resolved["oracle_profile"] = [{"sha256": sha256_json(p.to_dict()), "budget": damage_budget(p)} for p in oracles]
    agnostic = config.protocol == "query-agnostic"
    prefilled = (len(s.input_ids[: s.question_start] if agnostic else s.input_ids) for s in samples)
    if config.prefill_chunk is not None and max(prefilled, default=0) > config.prefill_chunk:
        resolved["prefill_chunk"] = config.prefill_chunk  # absent where no sample is cut into chunks: same results
    resolved.update(get_suite(config.suite).resolve(config, model))
    resolved["samples"] = {
        "count": len(samples),
        "sha256": sha256_json(
            [[s.id, list(s.input_ids), s.question_start, s.max_new_tokens, sorted(s.extra_stop_ids)] for s in samples]
        ),
    }
    return json.loads(json.dumps(resolved))  # tuples -> lists, as read back from the file


def build_presses(
    config: EvalConfig,
    profile: SensitivityProfile | None,
    model: PreTrainedModel,
    oracles: Sequence[SensitivityProfile] | None = None,
) -> dict[tuple[str, float], BasePress]:
    """The press of every configuration of ``config`` (and of ``("full", 1.0)``), checked against ``model``.

    A name is :func:`~ripplekv_eval.sample.split_configuration`'d (the scorer built with ``config.window_size``); a
    budget <= 1 is a kept fraction, > 1 a token count (``budget=`` or ``tokens=`` of
    :func:`~ripplekv.presses.registry.make_press`). ``oracles``: as :func:`resolve_config`.
    """
    oracles = load_oracle_profiles(config) if oracles is None else tuple(oracles)
    presses = {}
    for name, budget in [("full", FULL_BUDGET), *config.configurations]:
        method, scorer = split_configuration(name)
        given = select_oracle_profile(oracles, budget) if base_method(method) == ORACLE_METHOD else profile
        press = make_press(
            method,
            **BudgetSpec.from_value(budget).kwargs(),
            profile=given,
            window_size=config.window_size,
            strict_profile=config.strict_profile,
            scorer=scorer,
        )
        press.post_init_from_model(model)  # checks a profile against the model before any work
        presses[name, budget] = press
    return presses


EXTENDABLE: dict[str, list[Any]] = {"methods": [], "budgets": [], "tokens": [], "scorers": [DEFAULT_SCORER]}
"""The configuration keys a resumed ``eval`` may extend, key -> value when absent: rows written stay, the new
configurations run. A method bringing a profile the run did not have changes the ``profile`` key and is refused."""


# Steps run_eval and run_eval_ray share, so the two cannot drift.


def needs_sensitivity_profile(methods: Sequence[str]) -> bool:
    """Whether any of ``methods`` takes ``--profile``: the ``ripplekv*`` methods but ``ripplekv-oracle``, which takes
    damage profiles (``--oracle-profile``).
    """
    return any(m.startswith("ripplekv") and base_method(m) != ORACLE_METHOD for m in methods)


@dataclass(frozen=True)
class RunProfiles:
    """The profiles an evaluation's methods use, read and checked before any model is loaded."""

    profile: SensitivityProfile | None
    oracles: tuple[SensitivityProfile, ...]


def load_run_profiles(config: EvalConfig) -> RunProfiles:
    """The profiles of ``config``'s methods (the first step of every run).

    Raises:
        ValueError: a method needs ``profile`` and it is not given, ``ripplekv-oracle`` runs without
            ``oracle_profile``, or a file is not a valid profile of its kind.
        OSError: a profile file cannot be read.
    """
    needs_profile = needs_sensitivity_profile(config.methods)
    if needs_profile and config.profile is None:
        raise ValueError("the ripplekv methods need --profile (make one with `ripplekv profile`)")
    profile = SensitivityProfile.load(config.profile) if config.profile is not None and needs_profile else None
    return RunProfiles(profile=profile, oracles=load_oracle_profiles(config))


def open_run_folder(
    config: EvalConfig, out: str | os.PathLike[str], resolved: dict[str, Any], profiles: RunProfiles
) -> RunFolder:
    """Create ``out`` (or check that its ``config.json`` holds ``resolved``) and read what it resumes from.

    Raises:
        ConfigMismatchError: ``out`` holds another run (see
            :func:`~ripplekv_eval.running.results.check_or_write_config`).
        RunFolderBusyError: another run is writing into ``out`` (the folder's lock; close the returned folder, or use
            it in a ``with`` block, to release it).
    """
    sources = {"model": config.model, **get_suite(config.suite).sources(config), "profile": config.profile}
    if profiles.oracles:
        sources["oracle_profile"] = list(config.oracle_profile or ())
    return open_results(out, resolved, sources, extendable=EXTENDABLE)


def run_eval(
    config: EvalConfig,
    out: str | os.PathLike[str],
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
) -> EvalSummary:
    """Run (or resume) the evaluation ``config`` into the folder ``out``; see the module docstring.

    ``model`` is loaded from ``config.model`` unless given together with ``tokenizer``; ``on_row`` is called with every
    row right after it was written.
    """
    start = time.perf_counter()
    profiles = load_run_profiles(config)
    if model is None or tokenizer is None:
        from ripplekv.models import load_model

        model, tokenizer = load_model(config.model, dtype=config.dtype, device=config.device)
    enable_varlen_attention(model)
    presses = build_presses(config, profiles.profile, model, profiles.oracles)
    samples = build_samples(config, tokenizer, model)
    resolved = resolve_config(config, model, samples, profiles.profile, profiles.oracles)
    runner = SampleRunner(config, model, tokenizer, presses)
    with open_run_folder(config, out, resolved, profiles) as folder:  # its lock: one writer at a time
        written = run_pending(
            samples,
            config.configurations,
            folder,
            runner.run_sample,
            desc=f"eval {config.suite}",
            progress=progress,
            on_row=on_row,
        )
        rows = len(folder.log.read())
    return EvalSummary(
        out=folder.out,
        rows=rows,
        new_rows=written,
        samples=len(samples),
        configurations=len(config.configurations),
        seconds=time.perf_counter() - start,
    )
