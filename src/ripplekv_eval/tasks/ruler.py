"""RULER-style synthetic long-context tasks, generated locally from a seed and scored by string match.

The task families follow RULER (Hsieh et al., 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?"): needle retrieval (:mod:`~ripplekv_eval.tasks.ruler_niah`), variable tracking, common- and
frequent-words extraction (:mod:`~ripplekv_eval.tasks.ruler_tasks`). Nothing is downloaded: the haystack is
:mod:`ripplekv.profiling.haystack`'s essays, other text is drawn from a seeded :class:`random.Random`; contexts are
sized in the tokenizer's tokens (:mod:`~ripplekv_eval.tasks.ruler_text`).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ripplekv.profiling.haystack import TextTokenizer
from ripplekv_eval.tasks.ruler_niah import NIAH_TASKS, generate_niah
from ripplekv_eval.tasks.ruler_tasks import OTHER_TASKS

__all__ = ["METRICS", "TASKS", "SyntheticSample", "generate", "generate_suite", "score"]

METRICS = ("all", "part")


@dataclass(frozen=True)
class SyntheticSample:
    task: str  # e.g. "niah_single_essay_number"
    context: str  # the long text: task instruction, then haystack with needles / variable chains / word list
    question: str  # the query, asked after the context
    answers: tuple[str, ...]
    metric: str  # "all" (every answer must appear in the prediction) or "part" (any)
    context_tokens: int  # token count of ``context``, measured with the tokenizer that built it
    seed: int
    max_new_tokens: int
    answer_prefix: str = ""  # RULER's answer prefix (starts with a space), for prompting base models

    def prompt(self, with_answer_prefix: bool = False) -> str:
        """Context, a newline, the question (and, when asked, the answer prefix right after it)."""
        suffix = self.answer_prefix if with_answer_prefix else ""
        return f"{self.context}\n{self.question}{suffix}"


TASKS: tuple[str, ...] = (*NIAH_TASKS, *OTHER_TASKS)


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def generate(task: str, tokenizer: TextTokenizer, context_tokens: int, seed: int) -> SyntheticSample:
    """One sample of ``task`` whose context has at most (and close to) ``context_tokens`` tokens.

    Everything is drawn from ``seed``: the same arguments always give the same sample.

    Raises:
        ValueError: an unknown task, or a context too small for the task's fixed parts.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks are: {', '.join(TASKS)}")
    _check_int("context_tokens", context_tokens, 1)
    _check_int("seed", seed, -(2**63))
    rng = random.Random(f"ripplekv.ruler:{task}:{seed}")
    if task in NIAH_TASKS:
        spec = NIAH_TASKS[task]
        context, count, question, answers, prefix = generate_niah(spec, tokenizer, context_tokens, rng, task)
        max_new_tokens = spec.max_new_tokens
    else:
        generator, max_new_tokens = OTHER_TASKS[task]
        context, count, question, answers, prefix = generator(tokenizer, context_tokens, rng, task)
    return SyntheticSample(
        task=task,
        context=context,
        question=question,
        answers=answers,
        metric="all",
        context_tokens=count,
        seed=seed,
        max_new_tokens=max_new_tokens,
        answer_prefix=prefix,
    )


def _sample_seed(seed: int, index: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=6).digest()
    return int.from_bytes(digest, "big")


def generate_suite(
    tokenizer: TextTokenizer,
    context_tokens: int,
    samples_per_task: int,
    seed: int = 0,
    tasks: Sequence[str] | None = None,
) -> list[SyntheticSample]:
    """``samples_per_task`` samples of each task (all of :data:`TASKS` by default), grouped by task.

    Sample ``j``'s seed derives from ``(seed, j)`` and is stored in ``sample.seed``, so
    ``generate(sample.task, tokenizer, context_tokens, sample.seed)`` rebuilds it.
    """
    _check_int("samples_per_task", samples_per_task, 1)
    _check_int("seed", seed, -(2**63))
    if isinstance(tasks, str):
        raise ValueError(f"tasks must be a sequence of task names, not the string {tasks!r}")
    names = list(TASKS if tasks is None else tasks)
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; tasks are: {', '.join(TASKS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"tasks contains duplicates: {names}")
    seeds = [_sample_seed(seed, j) for j in range(samples_per_task)]
    return [generate(name, tokenizer, context_tokens, s) for name in names for s in seeds]


_CONTROL = re.compile(r"[\x00-\x1f]")


def score(
    sample_or_metric: SyntheticSample | str, prediction: str, answers: Sequence[str] | str | None = None
) -> float:
    """RULER's string match for one prediction, in [0, 1].

    ``"all"`` (``string_match_all``): the fraction of answers found in the prediction; ``"part"``
    (``string_match_part``): 1.0 when any is. Case-insensitive substring search after RULER's post-processing (control
    characters become newlines, whitespace stripped). A sample gives its metric, and its answers unless passed.
    """
    if isinstance(sample_or_metric, SyntheticSample):
        metric = sample_or_metric.metric
        if answers is None:
            answers = sample_or_metric.answers
    elif isinstance(sample_or_metric, str):
        metric = sample_or_metric
    else:
        raise ValueError(f"expected a SyntheticSample or a metric name, got {type(sample_or_metric).__name__}")
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {METRICS}")
    if answers is None:
        raise ValueError("answers are required when scoring with a metric name")
    if not isinstance(prediction, str):
        raise ValueError(f"prediction must be a string, got {type(prediction).__name__}")
    references = (answers,) if isinstance(answers, str) else tuple(answers)
    if not references:
        raise ValueError("answers must not be empty")
    text = _CONTROL.sub("\n", prediction).strip().lower()
    hits = [1.0 if str(reference).lower() in text else 0.0 for reference in references]
    return sum(hits) / len(hits) if metric == "all" else max(hits)
