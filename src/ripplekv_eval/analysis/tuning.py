"""``ripplekv tune``: choose RippleKV's allocation (profile, r, gamma), and any rival's knobs, by fidelity.

Every candidate (:class:`TuneConfig`) is scored on the same prompts, from one shared prefill, under the same scorer,
by ``fidelity_kl`` (:mod:`ripplekv_eval.running.rows`); candidates whose budgets coincide on a prompt share one cache.
Selection and held-out comparison: :mod:`ripplekv_eval.analysis.tuning_report`.

A row of ``tune.jsonl`` is one (prompt, budget): ``sample_id``, ``task``, ``method`` (``ripplekv``), ``budget``,
``prompt_tokens``, ``compressed_tokens``, ``kl`` and ``top1`` (candidate key -> value; a rival's key is its
canonical spec, ``cake:tau1=2``, its defaults the plain name), ``snapkv_kl`` and ``snapkv_top1`` (uniform budgets,
for reference), ``distinct`` (distinct budget vectors scored), ``answer_tokens``, ``answer_ids`` (reused on resume),
``seconds``, ``prefill_seconds``, ``meta``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.allocation.budget import DEFAULT_GAMMA, DEFAULT_RATIO
from ripplekv.inference.generate import Prefill, eos_ids, extend, greedy_decode, kept_tokens
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.headwise import headwise_of
from ripplekv.presses.method_lists import expand_grid
from ripplekv.presses.method_spec import MethodSpec, needs_profile, parse_method
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress
from ripplekv.presses.registry import FRACTION_ONLY_METHODS, METHODS_WITHOUT_SCORER, make_press
from ripplekv.presses.scorers import DEFAULT_SCORER, SCORERS
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv.validation import check_int
from ripplekv_eval.fastpath.batched import batched_teacher_forced_logprobs
from ripplekv_eval.fastpath.derive import compressed_prefill, recorded_statistics, residual_statistics_of
from ripplekv_eval.fastpath.fidelity import fidelity, teacher_forced_logprobs
from ripplekv_eval.fastpath.hidden_tail import hidden_states_tail, is_derivable, prescored_scorers
from ripplekv_eval.fastpath.record import record_prefill
from ripplekv_eval.reporting.stats import DEFAULT_RESAMPLES, MIN_RESAMPLES
from ripplekv_eval.running.budget_rows import budget_value, row_budget
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.rows import greedy_agreement
from ripplekv_eval.sample import MIN_NEW_TOKENS, EvalSample

TUNE_METHOD = "ripplekv"
DEFAULT_RATIOS: tuple[float, ...] = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
DEFAULT_GAMMAS: tuple[float, ...] = (1.5, 2.0, 3.0, 5.0)
TEACHER_FORCED_ROWS = 8
"""Caches teacher-forced per padded batch (the logits of a batch take ``rows x answer x vocab`` floats)."""


@dataclass(frozen=True)
class Candidate:
    """One allocation: a profile (by its label, unique in the run) and RippleKV's ``r`` and ``gamma`` (each >= 1)."""

    profile: str
    ratio: float
    gamma: float

    def __post_init__(self) -> None:
        if not isinstance(self.profile, str) or not self.profile or "|" in self.profile:
            raise ValueError(f"a profile label must be a non-empty string without '|', got {self.profile!r}")
        for name in ("ratio", "gamma"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1:
                raise ValueError(f"{name} must be a finite number >= 1, got {value!r}")

    @property
    def key(self) -> str:
        """``"<profile>|r=<ratio>|gamma=<gamma>"``: the candidate's name in rows and summaries."""
        return f"{self.profile}|r={float(self.ratio):g}|gamma={float(self.gamma):g}"


def method_grid(grids: Sequence[str]) -> tuple[MethodSpec, ...]:
    """Every candidate of the rivals' grids (``cake:tau1=0.5|1|2,tau2=0.5|1|2``), each method's defaults first;
    ValueError for a method given twice, without a scorer, set by a compression ratio, or RippleKV's own."""
    out: list[MethodSpec] = []
    seen: set[str] = set()
    for grid in grids:
        specs = expand_grid(grid)
        name = specs[0].name
        if name in seen:
            raise ValueError(f"method {name!r} has two grids: give each method one grid")
        if needs_profile(name):  # its candidates come from profiles, not from a grid
            raise ValueError(f"{name} is tuned by profiles, ratios and gammas (--profile, --ratios, --gammas)")
        if name in METHODS_WITHOUT_SCORER or name in FRACTION_ONLY_METHODS or name == "snapkv":
            raise ValueError(f"method {name!r} cannot be tuned here: tune allocations over a token scorer")
        seen.add(name)
        default = parse_method(name)
        out += [default] + [s for s in specs if s != default]
    return tuple(out)


def _numbers(name: str, values: Sequence[float]) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    if not out:
        raise ValueError(f"{name} must not be empty")
    for value in out:
        if not math.isfinite(value) or value < 1:
            raise ValueError(f"{name} must be numbers >= 1, got {value!r}")
    if len(set(out)) != len(out):
        raise ValueError(f"{name} holds duplicates: {out}")
    return out


@dataclass(frozen=True)
class TuneConfig:
    """What ``ripplekv tune`` runs: ``eval``'s suite (its methods, profile and score ignored); ``profiles`` label ->
    path, the first the defaults'; the ``ratios`` and ``gammas`` grids (the defaults added); the rivals' ``grids``
    (:func:`method_grid`); one ``scorer``; the ``calibration_fraction`` of each task's first prompts that selects."""

    eval: EvalConfig
    profiles: dict[str, str]
    ratios: tuple[float, ...] = DEFAULT_RATIOS
    gammas: tuple[float, ...] = DEFAULT_GAMMAS
    grids: tuple[str, ...] = ()
    scorer: str = DEFAULT_SCORER
    calibration_fraction: float = 0.5
    resamples: int = DEFAULT_RESAMPLES
    bootstrap_seed: int = 0
    candidates: tuple[Candidate, ...] = field(init=False)
    method_candidates: tuple[MethodSpec, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.eval, EvalConfig):
            raise TypeError(f"eval must be an EvalConfig, got {type(self.eval).__name__}")
        if not isinstance(self.profiles, dict) or not self.profiles:
            raise ValueError("tune needs at least one profile (label -> path)")
        ratios = _numbers("ratios", self.ratios)
        gammas = _numbers("gammas", self.gammas)
        ratios += () if DEFAULT_RATIO in ratios else (float(DEFAULT_RATIO),)
        gammas += () if DEFAULT_GAMMA in gammas else (float(DEFAULT_GAMMA),)
        object.__setattr__(self, "ratios", ratios)
        object.__setattr__(self, "gammas", gammas)
        fraction = self.calibration_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
            raise ValueError(f"calibration_fraction must be in (0, 1), got {fraction!r}")
        check_int("resamples", self.resamples, MIN_RESAMPLES)
        check_int("bootstrap_seed", self.bootstrap_seed, 0)
        if not self.eval.budget_values:
            raise ValueError("no budgets given")
        for budget in self.eval.budgets:
            if not 0 < float(budget) < 1:
                raise ValueError(f"budget {budget} out of range: tune takes kept fractions in (0, 1) (or tokens)")
        candidates = tuple(
            Candidate(label, r, g) for label in self.profiles for r in sorted(ratios) for g in sorted(gammas)
        )
        object.__setattr__(self, "candidates", candidates)
        object.__setattr__(self, "grids", tuple(self.grids))
        object.__setattr__(self, "method_candidates", method_grid(self.grids))
        if self.scorer not in SCORERS:
            raise ValueError(f"unknown scorer {self.scorer!r}; choose one of {', '.join(SCORERS)}")

    @property
    def default(self) -> Candidate:
        """The defaults: the first profile with ``r = 4`` and ``gamma = 3``."""
        return Candidate(next(iter(self.profiles)), float(DEFAULT_RATIO), float(DEFAULT_GAMMA))

    @property
    def method_groups(self) -> dict[str, list[str]]:
        """Each rival method's candidate keys (canonical specs), its defaults first, in grid order."""
        groups: dict[str, list[str]] = {}
        for spec in self.method_candidates:
            groups.setdefault(spec.name, []).append(spec.canonical())
        return groups


def teacher_forced(model: PreTrainedModel, states: Sequence[Prefill], tokens: Sequence[int]) -> list[torch.Tensor]:
    """Teacher-forced log-probabilities of ``tokens`` over every state: plain caches as padded batches, head-wise
    masked ones (AdaKV, LAVa) one at a time."""
    plain = [i for i, state in enumerate(states) if all(headwise_of(layer) is None for layer in state.cache.layers)]
    out: list[torch.Tensor | None] = [None] * len(states)
    if plain:
        batched = batched_teacher_forced_logprobs(model, [states[i] for i in plain], tokens, TEACHER_FORCED_ROWS)
        for i, lp in zip(plain, batched):
            out[i] = lp
    for i, state in enumerate(states):
        if out[i] is None:
            out[i] = teacher_forced_logprobs(model, state, tokens)
    return out  # type: ignore[return-value]


def split_samples(samples: Sequence[EvalSample], fraction: float) -> tuple[set[str], set[str]]:
    """``(calibration ids, held-out ids)``: each task's first ``round(n * fraction)`` prompts calibrate (at least one
    in each split from two prompts; a lone prompt calibrates)."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    by_task: dict[str, list[str]] = {}
    for sample in samples:
        by_task.setdefault(sample.task, []).append(sample.id)
    calibration: set[str] = set()
    heldout: set[str] = set()
    for ids in by_task.values():
        cut = len(ids) if len(ids) == 1 else min(len(ids) - 1, max(1, round(len(ids) * fraction)))
        calibration.update(ids[:cut])
        heldout.update(ids[cut:])
    if not heldout:
        raise ValueError("no prompt is held out: give at least two prompts in some task")
    return calibration, heldout


class TuneRunner:
    """Tuning rows of one prompt at a time (its prefill and answer shared by every budget and candidate)."""

    def __init__(
        self,
        config: TuneConfig,
        profiles: dict[str, SensitivityProfile],
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
    ) -> None:
        missing = [label for label in config.profiles if label not in profiles]
        if missing:
            raise ValueError(f"profiles {missing} were not loaded")
        self.config = config
        self.profiles = profiles
        self.model = enable_varlen_attention(model)
        self.tokenizer = tokenizer
        self.eos = eos_ids(model, tokenizer)
        self.n_layers = int(model.config.get_text_config().num_hidden_layers)
        self.full = make_press("full")
        window = config.eval.window_size
        budgets = {float(b): row_budget(b).kwargs() for b in config.eval.budget_values}
        scorer = config.scorer
        self.uniform = {
            b: make_press("snapkv", **given, window_size=window, scorer=scorer) for b, given in budgets.items()
        }
        self.presses = {
            (c.key, b): make_press(
                "ripplekv",
                **given,
                profile=profiles[c.profile],
                window_size=window,
                ratio=c.ratio,
                gamma=c.gamma,
                scorer=scorer,
            )
            for c in config.candidates
            for b, given in budgets.items()
        }
        self.rivals = {
            (spec.canonical(), b): make_press(spec, **given, window_size=window, scorer=scorer)
            for spec in config.method_candidates
            for b, given in budgets.items()
        }
        for press in self.rivals.values():
            press.post_init_from_model(self.model)
        every = [*self.uniform.values(), *self.presses.values(), *self.rivals.values()]
        every = [press for press in every if is_derivable(press)]  # the others run their own prefill
        self.prescore = prescored_scorers(every)
        self.hidden_tail = hidden_states_tail(every, self.prescore)
        self.residual_statistics = residual_statistics_of(every)

    def _rival_key(self, press: Any, record: Any) -> tuple[Any, ...] | None:
        """What identifies a derived per-prompt rival's cache on this record before deriving it (its scorer and
        budgets), None for any other."""
        if type(press) is not PerPromptBudgetPress or not is_derivable(press):  # LAVa's heads: more than its budgets
            return None
        stats = recorded_statistics(press, record.layers, self.model.config, record.memo)
        budgets = press.budgets(stats, self.model.config, record.prompt_tokens)
        return ("per-prompt", repr(press.press), tuple(sorted(budgets.items())))

    def run_sample(
        self, sample: EvalSample, budgets: Sequence[float], answer: Sequence[int] | None = None
    ) -> Iterator[dict[str, Any]]:
        """One row per budget for ``sample`` (fields in the module docstring); ``answer``: stored by an earlier run
        (decoded again when None)."""
        prefix, question = sample.split(self.config.eval.protocol)
        suffix = torch.tensor([list(question)], dtype=torch.long) if question else None

        def with_question(state: Prefill) -> Prefill:
            return extend(self.model, state, suffix) if suffix is not None else state

        record = record_prefill(
            self.model,
            torch.tensor([list(prefix)], dtype=torch.long),
            self.hidden_tail,
            self.residual_statistics,
            self.config.eval.prefill_chunk,
            self.prescore,
        )
        full = with_question(compressed_prefill(record, self.full))
        stops = self.eos | sample.extra_stop_ids
        tokens = list(answer) if answer else []
        if not tokens:
            tokens = greedy_decode(self.model, full, sample.max_new_tokens, stops, min_new_tokens=MIN_NEW_TOKENS)
        reference = teacher_forced_logprobs(self.model, full, tokens)
        for budget in budgets:
            started = time.perf_counter()
            groups: dict[tuple[int, ...], list[str]] = {}
            for candidate in self.config.candidates:
                press = self.presses[candidate.key, float(budget)]
                groups.setdefault(press.layer_budgets(self.n_layers, len(prefix)), []).append(candidate.key)
            rivals: dict[Any, list[str]] = {}
            for spec in self.config.method_candidates:
                key = spec.canonical()
                try:
                    shared = self._rival_key(self.rivals[key, float(budget)], record)
                except ValueError as err:
                    raise ValueError(f"sample {sample.id}, {key} at budget {budget}: {err}") from err
                rivals.setdefault(("rival", key) if shared is None else shared, []).append(key)
            vectors = list(groups)
            try:
                states = [with_question(compressed_prefill(record, self.uniform[float(budget)]))]
                for vector in vectors:
                    press = self.presses[groups[vector][0], float(budget)]
                    states.append(with_question(compressed_prefill(record, press)))
                kept: dict[str, list[int]] = {}
                for keys in rivals.values():
                    state = compressed_prefill(record, self.rivals[keys[0], float(budget)])
                    kept.update(dict.fromkeys(keys, kept_tokens(state)))
                    states.append(with_question(state))
            except ValueError as err:
                raise ValueError(f"sample {sample.id}, budget {budget}: {err}") from err
            logprobs = teacher_forced(self.model, states, tokens)
            scored = [(fidelity(reference, lp, tokens).kl, greedy_agreement(lp, tokens, stops)) for lp in logprobs]
            kl: dict[str, float] = {}
            top1: dict[str, float] = {}
            members = [groups[v] for v in vectors] + list(rivals.values())
            for keys, (value, agree) in zip(members, scored[1:]):
                for key in keys:
                    kl[key], top1[key] = value, agree
            yield {
                "sample_id": sample.id,
                "task": sample.task,
                "method": TUNE_METHOD,
                "budget": budget_value(budget),
                "prompt_tokens": len(sample.input_ids),
                "compressed_tokens": len(prefix),
                "kl": kl,
                "top1": top1,
                "snapkv_kl": scored[0][0],
                "snapkv_top1": scored[0][1],
                "distinct": len(vectors),
                **({"rival_distinct": len(rivals), "kept_tokens": kept} if rivals else {}),
                "scorer": self.config.scorer,
                "answer_tokens": len(tokens),
                "answer_ids": tokens,
                "seconds": round(time.perf_counter() - started, 4),
                "prefill_seconds": round(record.seconds, 4),
                "meta": dict(sample.meta),
            }
