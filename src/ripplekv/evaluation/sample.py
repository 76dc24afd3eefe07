"""What one evaluation sample is (:class:`EvalSample`) and the validators and constants every suite shares.

A leaf module of :mod:`ripplekv.evaluation`: suites, the runner and the rows import it; it imports nothing of the
package, so the suites never import :mod:`ripplekv.evaluation.config` back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FULL_BUDGET", "MIN_NEW_TOKENS", "EvalSample", "positive_int"]

FULL_BUDGET = 1.0
"""The budget recorded in the ``full`` cache's rows."""
MIN_NEW_TOKENS = 1
"""Greedy decoding never stops on a stop token before this many new tokens (LongBench pred.py's ``min_length``)."""


def positive_int(name: str, value: object, allow_none: bool = False) -> None:
    """Raise ValueError unless ``value`` is an integer >= 1 (or None when ``allow_none``).

    Args:
        name: the option's name, for the message.
        value: the value to check.
        allow_none: whether None is accepted.
    """
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class EvalSample:
    """One prompt, ready to prefill, and how to score an answer to it.

    Args:
        id: unique within the run.
        task: the task it belongs to (rows are grouped by it).
        input_ids: the whole prompt's token ids.
        question_start: first token of the question part (query-agnostic: the context is
            ``input_ids[:question_start]``).
        max_new_tokens: answer length.
        score: the suite's metric, prediction text -> score.
        gold: the gold answer text teacher-forced for ``gold_nll`` (None: the suite has none).
        extra_stop_ids: stop tokens besides the model's end-of-sequence ids.
        meta: copied into every row.
    """

    id: str
    task: str
    input_ids: tuple[int, ...]
    question_start: int
    max_new_tokens: int
    score: Callable[[str], float] = field(compare=False, repr=False)
    gold: str | None = None
    extra_stop_ids: frozenset[int] = frozenset()
    meta: Mapping[str, Any] = field(default_factory=dict)
