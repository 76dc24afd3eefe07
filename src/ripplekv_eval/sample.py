"""One evaluation sample (:class:`EvalSample`), configuration names and the validators every suite shares.

A leaf: it imports nothing of the package, so the suites never import :mod:`ripplekv_eval.running.config` back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

FULL_BUDGET = 1.0
"""The budget recorded in the ``full`` cache's rows."""
MIN_NEW_TOKENS = 1
"""Greedy decoding never stops before this many new tokens, on every task: LongBench's ``pred.py`` passes
``min_length=context_length + 1`` for samsum, where a model starting with its stop token (a newline) answers
nothing; the same can happen on any task with an end-of-sequence."""
DEFAULT_SCORER = "snapkv"
"""The scorer whose configurations keep the plain method name; ``ripplekv.presses.scorers.DEFAULT_SCORER`` repeated
so that reading results never imports torch (a test checks they agree)."""
SCORER_SEPARATOR = "@"


def configuration_name(method: str, scorer: str | None) -> str:
    """The name of a (method, scorer) pair in reports and on resume: ``method`` under the default scorer (SnapKV) or
    without a scorer (None), ``method@scorer`` otherwise (``ripplekv@tova``)."""
    return method if scorer is None or scorer == DEFAULT_SCORER else f"{method}{SCORER_SEPARATOR}{scorer}"


def split_configuration(name: str) -> tuple[str, str | None]:
    """Invert :func:`configuration_name`; the scorer is None for a plain name (default scorer or none)."""
    method, sep, scorer = name.partition(SCORER_SEPARATOR)
    return (method, scorer) if sep else (method, None)


def row_configuration(row: Mapping[str, Any]) -> str:
    """The configuration name of a result row (a row without ``scorer`` ran SnapKV's)."""
    return configuration_name(str(row["method"]), row.get("scorer"))


def scored_methods(rows: Sequence[Mapping[str, Any]]) -> set[str]:
    """The methods some row of which names a scorer (the argument :func:`row_scorer` needs)."""
    return {str(row["method"]) for row in rows if row.get("scorer") is not None}


def row_scorer(row: Mapping[str, Any], scored: set[str]) -> str | None:
    """A row's token scorer, None for a method without one.

    Old rows lack the ``scorer`` field: those of a method in ``scored`` (:func:`scored_methods` of the run) ran the
    default scorer (SnapKV), the others (the full cache, scorer-less methods) have none.
    """
    if "scorer" in row:
        return None if row["scorer"] is None else str(row["scorer"])
    return DEFAULT_SCORER if str(row["method"]) in scored else None


CHAT_TEMPLATE_MODES = ("auto", "on", "off")


def use_chat_template(tokenizer: Any, mode: str) -> bool:
    """Whether prompts go through the tokenizer's chat template: ``auto`` when it has one, ``on`` (it must), ``off``."""
    if mode not in CHAT_TEMPLATE_MODES:
        raise ValueError(f"chat_template must be one of {', '.join(CHAT_TEMPLATE_MODES)}, got {mode!r}")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if mode == "on" and not has_template:
        raise ValueError("chat_template 'on', but the tokenizer has no chat template")
    return has_template and mode != "off"


@dataclass(frozen=True)
class EvalSample:
    """One prompt, ready to prefill, and how to score an answer to it (``meta`` is copied into every row)."""

    id: str  # unique within the run
    task: str
    input_ids: tuple[int, ...]
    question_start: int  # first token of the question (query-agnostic: the context is input_ids[:question_start])
    max_new_tokens: int
    score: Callable[[str], float] = field(compare=False, repr=False)  # the suite's metric of a prediction
    gold: str | None = None  # teacher-forced for gold_nll (None: the suite has none)
    extra_stop_ids: frozenset[int] = frozenset()  # besides the model's end-of-sequence ids
    meta: Mapping[str, Any] = field(default_factory=dict)

    def split(self, protocol: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(prefilled, question)``: query-agnostic, the context is prefilled (and compressed) and the question run
        over it after; question-aware, the whole prompt is prefilled. An empty context is an error."""
        agnostic = protocol == "query-agnostic"
        prefix = self.input_ids[: self.question_start] if agnostic else self.input_ids
        if not prefix:
            raise ValueError(f"sample {self.id}: the context part of the prompt is empty")
        return prefix, self.input_ids[self.question_start :] if agnostic else ()
