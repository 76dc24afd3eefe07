"""What ``ripplekv eval`` runs: :class:`EvalConfig`, the options common to every suite (and the suite's own)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from ripplekv.allocation.budget import BudgetSpec
from ripplekv.inference.generate import PROTOCOLS
from ripplekv.models.chunked_prefill import DEFAULT_PREFILL_CHUNK, check_prefill_chunk
from ripplekv.presses.method_spec import base_method, parse_method
from ripplekv.presses.registry import DEFAULT_WINDOW, FRACTION_ONLY_METHODS, METHODS, METHODS_WITHOUT_SCORER
from ripplekv.presses.scorers import SCORERS
from ripplekv.validation import check_int
from ripplekv_eval.running.budget_rows import ROW_TOKENS_MIN
from ripplekv_eval.sample import CHAT_TEMPLATE_MODES, DEFAULT_SCORER, FULL_BUDGET, configuration_name

SCORE_MODES = ("both", "fidelity")
DECODE_MODES = ("batched", "sequential")
DEFAULT_METHODS = ("full", "snapkv", "pyramidkv", "ripplekv")
DEFAULT_BUDGETS = (0.1, 0.2, 0.3)


@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate: the options of ``ripplekv eval`` (docs/cli.md), checked. Methods are stored canonical
    (:mod:`ripplekv.presses.method_spec`), naming them in rows and reports; ``tokens`` are counts >= 2 (a row's
    budget column reads 1 as the fraction 1.0); ``options`` (the suite's flags with ``_`` for ``-``) become the
    suite's options dataclass; ``strict_profile``, ``decode``, ``decode_rows`` and ``decode_memory`` change no result
    and are not compared on resume."""

    suite: str
    model: str = "smollm2-135m"
    methods: tuple[str, ...] = DEFAULT_METHODS
    budgets: tuple[float, ...] = DEFAULT_BUDGETS
    tokens: tuple[int, ...] = ()
    scorers: tuple[str, ...] = (DEFAULT_SCORER,)
    tasks: tuple[str, ...] | None = None
    limit: int | None = None
    profile: str | None = None
    protocol: str = "question-aware"
    window_size: int = DEFAULT_WINDOW
    max_new_tokens: int | None = None
    seed: int = 0
    dtype: str | None = None
    device: str | None = None
    score: str = "both"
    chat_template: str = "auto"
    decode: str = "batched"
    decode_rows: int | None = None
    decode_memory: int | None = None
    prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK
    options: Any = field(default_factory=dict)
    oracle_profile: tuple[str, ...] | None = None
    strict_profile: bool = False

    def __post_init__(self) -> None:
        from ripplekv_eval.suites import get_suite

        suite = get_suite(self.suite)
        unknown = [str(m) for m in self.methods if base_method(str(m)) not in METHODS]
        if unknown:
            raise ValueError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
        object.__setattr__(self, "methods", tuple(parse_method(str(m)).canonical() for m in self.methods))
        for name in ("budgets", "tokens", "scorers"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.tasks is not None:
            object.__setattr__(self, "tasks", tuple(self.tasks))
        if not self.methods or not self.scorers:
            raise ValueError("no methods or no scorers given (the default scorer is snapkv)")
        unknown = [s for s in self.scorers if s not in SCORERS]
        if unknown:
            raise ValueError(f"unknown scorer(s) {', '.join(map(str, unknown))}; choose from {', '.join(SCORERS)}")
        for name in ("methods", "scorers", "budgets", "tokens"):
            if len(set(getattr(self, name))) != len(getattr(self, name)):
                raise ValueError(f"{name} contain duplicates: {getattr(self, name)}")
        if any(m != "full" for m in self.methods) and not self.budgets and not self.tokens:
            raise ValueError("no budgets given (budgets: kept fractions; tokens: token counts per layer)")
        for budget in self.budgets:
            if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget):
                raise ValueError(f"budget must be a number, got {budget!r}")
            if budget > 1:
                raise ValueError(
                    f"budget {budget} is above 1: budgets are kept fractions in (0, 1]; give token counts per layer "
                    "in tokens (--tokens)"
                )
            if budget <= 0:
                raise ValueError(f"budget {budget} out of range: a kept fraction in (0, 1]")
        for count in self.tokens:
            if BudgetSpec(tokens=count).tokens < ROW_TOKENS_MIN:  # type: ignore[operator]
                raise ValueError(
                    f"tokens {count}: a row stores its budget as one number, and {count} is the kept fraction 1.0 "
                    "(the full cache's row); evaluate 2 or more tokens per layer"
                )
        by_fraction = [m for m in self.methods if base_method(m) in FRACTION_ONLY_METHODS]
        if self.tokens and by_fraction:
            raise ValueError(
                f"{', '.join(by_fraction)} (kvpress's own presses) take kept fractions only, not token counts: "
                "drop them from the methods or drop tokens"
            )
        modes = {
            "protocol": PROTOCOLS,
            "score": SCORE_MODES,
            "decode": DECODE_MODES,
            "chat_template": CHAT_TEMPLATE_MODES,
        }
        for name, allowed in modes.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        for name in ("decode_rows", "decode_memory", "limit", "max_new_tokens"):
            check_int(name, getattr(self, name), allow_none=True)
        check_int("window_size", self.window_size)
        check_prefill_chunk(self.prefill_chunk)
        if self.tasks is not None and (not self.tasks or len(set(self.tasks)) != len(self.tasks)):
            raise ValueError(f"tasks must be a non-empty list without duplicates, got {self.tasks!r}")
        if self.oracle_profile is not None:
            paths = (
                (self.oracle_profile,) if isinstance(self.oracle_profile, (str, os.PathLike)) else self.oracle_profile
            )
            if not isinstance(paths, (tuple, list)):
                raise TypeError(f"oracle_profile must be a path or a sequence of paths, got {type(paths).__name__}")
            paths = tuple(os.fspath(p) if isinstance(p, os.PathLike) else p for p in paths)
            if not paths or not all(isinstance(p, str) and p for p in paths) or len(set(paths)) != len(paths):
                raise ValueError(f"oracle_profile must be one or more distinct profile paths, got {paths!r}")
            object.__setattr__(self, "oracle_profile", paths)
        check_int("seed", self.seed, -(2**63))
        object.__setattr__(self, "options", suite.parse_options(self.options))
        suite.check_tasks(self.tasks)

    @property
    def budget_values(self) -> tuple[float | int, ...]:
        """Every budget as results rows store it: the fractions (floats <= 1), then the token counts (ints >= 2)."""
        return tuple(float(b) for b in self.budgets) + tuple(int(t) for t in self.tokens)

    @property
    def configurations(self) -> list[tuple[str, float]]:
        """The (configuration name, budget) pairs run on every sample: ``full`` once at 1.0, the others at every
        budget, each method built on a scorer once per scorer (scorer by scorer, in the given order); names are
        :func:`~ripplekv_eval.sample.configuration_name`'s, budgets :attr:`budget_values`."""
        pairs = [("full", FULL_BUDGET)] if "full" in self.methods else []
        for index, scorer in enumerate(self.scorers):
            for method in self.methods:
                unscored = base_method(method) in METHODS_WITHOUT_SCORER
                if method == "full" or (unscored and index > 0):
                    continue
                name = method if unscored else configuration_name(method, scorer)
                pairs += [(name, b) for b in self.budget_values]
        return pairs
