"""``ripplekv eval`` in one process: the samples, presses and resolved configuration of a run, and the run loop
(its rows: :mod:`~ripplekv_eval.running.rows`; its folder and resume: :mod:`~ripplekv_eval.running.results`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from kvpress.presses.base_press import BasePress
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.models.attention import enable_varlen_attention
from ripplekv.presses.method_spec import DAMAGE, SENSITIVITY, needs_profile
from ripplekv.presses.registry import make_press
from ripplekv.profiling.damage_profile import (
    ORACLE_METHOD,
    damage_budget,
    require_damage_profile,
    select_oracle_profile,
)
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv_eval.running.budget_rows import row_budget
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.results import RunFolder, RunResult, open_results, run_pending, sha256_json
from ripplekv_eval.running.rows import SampleRunner
from ripplekv_eval.sample import DEFAULT_SCORER, FULL_BUDGET, EvalSample, split_configuration
from ripplekv_eval.suites import get_suite


def build_samples(
    config: EvalConfig, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None = None
) -> list[EvalSample]:
    """The samples of ``config.suite`` in run order, ids checked unique (``model``: LongBench's default length)."""
    samples = get_suite(config.suite).samples(config, tokenizer, model)
    if not samples:
        raise ValueError(f"the {config.suite} suite has no samples with these options")
    if len({s.id for s in samples}) != len(samples):
        raise ValueError("sample ids are not unique")
    return samples


def load_oracle_profiles(config: EvalConfig) -> tuple[SensitivityProfile, ...]:
    """The damage profiles of ``config.oracle_profile`` when ``ripplekv-oracle`` runs (else none), checked."""
    if not any(needs_profile(m) == DAMAGE for m in config.methods):
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
    """The configuration compared on resume: options with defaults filled in, the model's identity, the profiles'
    content hashes (the oracles' only when ``ripplekv-oracle`` runs; None: loaded from ``config``) and a hash of every
    sample's token ids."""
    oracles = load_oracle_profiles(config) if oracles is None else tuple(oracles)
    from ripplekv.models.identity import model_identity

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
    """The press of every configuration of ``config`` and of ``("full", 1.0)``, checked against ``model``."""
    oracles = load_oracle_profiles(config) if oracles is None else tuple(oracles)
    presses = {}
    for name, budget in [("full", FULL_BUDGET), *config.configurations]:
        method, scorer = split_configuration(name)
        given = select_oracle_profile(oracles, budget) if needs_profile(method) == DAMAGE else profile
        press = make_press(
            method,
            **row_budget(budget).kwargs(),
            profile=given,
            window_size=config.window_size,
            strict_profile=config.strict_profile,
            scorer=scorer,
        )
        press.post_init_from_model(model)  # checks a profile against the model before any work
        presses[name, budget] = press
    return presses


EXTENDABLE: dict[str, list[Any]] = {"methods": [], "budgets": [], "tokens": [], "scorers": [DEFAULT_SCORER]}
"""Keys a resumed ``eval`` may extend (key -> value when absent): rows written stay, the new configurations run."""


def needs_sensitivity_profile(methods: Sequence[str]) -> bool:
    """Whether any of ``methods`` takes ``--profile`` (needs a sensitivity profile)."""
    return any(needs_profile(m) == SENSITIVITY for m in methods)


class RunProfiles(NamedTuple):
    """The profiles of a run's methods, read and checked before any model is loaded."""

    profile: SensitivityProfile | None
    oracles: tuple[SensitivityProfile, ...]


def load_run_profiles(config: EvalConfig) -> RunProfiles:
    """The profiles of ``config``'s methods (the first step of every run)."""
    wanted = needs_sensitivity_profile(config.methods)
    if wanted and config.profile is None:
        raise ValueError("the ripplekv methods need --profile (make one with `ripplekv profile`)")
    profile = SensitivityProfile.load(config.profile) if config.profile is not None and wanted else None
    return RunProfiles(profile=profile, oracles=load_oracle_profiles(config))


def prepare(
    config: EvalConfig, profiles: RunProfiles, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> tuple[SampleRunner, list[EvalSample], dict[str, Any]]:
    """The sample runner, samples and resolved configuration of ``config`` on ``model`` (every worker's first step)."""
    enable_varlen_attention(model)
    presses = build_presses(config, profiles.profile, model, profiles.oracles)
    samples = build_samples(config, tokenizer, model)
    resolved = resolve_config(config, model, samples, profiles.profile, profiles.oracles)
    return SampleRunner(config, model, tokenizer, presses), samples, resolved


def open_run_folder(
    config: EvalConfig, out: str | os.PathLike[str], resolved: dict[str, Any], profiles: RunProfiles
) -> RunFolder:
    """Open ``out`` for ``config`` (:func:`~ripplekv_eval.running.results.open_results`), its lock held."""
    sources = {"model": config.model, **get_suite(config.suite).sources(config), "profile": config.profile}
    if profiles.oracles:
        sources["oracle_profile"] = list(config.oracle_profile or ())
    return open_results(out, resolved, sources, extendable=EXTENDABLE)


def loaded_model(
    config: EvalConfig, model: PreTrainedModel | None, tokenizer: PreTrainedTokenizerBase | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``model`` and ``tokenizer`` when both are given, else ``config.model`` loaded."""
    if model is not None and tokenizer is not None:
        return model, tokenizer
    from ripplekv.models.loading import load_model

    return load_model(config.model, dtype=config.dtype, device=config.device)


def run_eval(
    config: EvalConfig,
    out: str | os.PathLike[str],
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
) -> RunResult:
    """Run (or resume) ``config`` into ``out`` (the model loaded unless given with its tokenizer)."""
    start = time.perf_counter()
    profiles = load_run_profiles(config)
    model, tokenizer = loaded_model(config, model, tokenizer)
    runner, samples, resolved = prepare(config, profiles, model, tokenizer)
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
    seconds = time.perf_counter() - start
    return RunResult(folder.out, rows, written, len(samples), seconds, configurations=len(config.configurations))
