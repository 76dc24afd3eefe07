"""The LongBench v1 / LongBench-E evaluation protocol (THUDM/LongBench ``pred.py`` and ``eval.py``), English tasks.

Per record: the task's official template; middle truncation to ``max_length`` tokens; the chat template except for
:data:`NO_CHAT_TEMPLATE` (:func:`build_prompt`); greedy decoding for :data:`MAX_NEW_TOKENS` (samsum also stops at a
newline); scoring by :func:`score_record`, ``round(100 * mean, 2)`` per task, per length bucket for LongBench-E.
``<task>_e.jsonl`` files use their base task's prompt, length and metric.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ripplekv_eval.tasks.jsonlines import iter_json_lines, string_list
from ripplekv_eval.tasks.longbench_config import (
    CHAT_TEMPLATE_MODES,
    ENGLISH_TASKS,
    FIRST_LINE_TASKS,
    LONGBENCH_E_BUCKETS,
    MAX_NEW_TOKENS,
    NO_CHAT_TEMPLATE,
    PROMPTS,
    TASK_METRIC,
)
from ripplekv_eval.tasks.metrics import METRICS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from transformers import PreTrainedTokenizerBase

__all__ = [
    "CHAT_TEMPLATE_MODES",
    "ENGLISH_TASKS",
    "FIRST_LINE_TASKS",
    "LONGBENCH_E_BUCKETS",
    "MAX_NEW_TOKENS",
    "NO_CHAT_TEMPLATE",
    "PROMPTS",
    "TASK_METRIC",
    "BuiltPrompt",
    "LongBenchRecord",
    "base_task",
    "build_prompt",
    "length_bucket",
    "load_task",
    "newline_token_id",
    "postprocess",
    "score_record",
    "stop_on_newline",
    "task_score",
    "task_score_e",
    "uses_chat_template",
]


def base_task(task: str) -> str:
    """The LongBench v1 task behind ``task`` (``hotpotqa_e`` -> ``hotpotqa``); ValueError for an unknown task."""
    if task in PROMPTS:
        return task
    if task.endswith("_e") and task[:-2] in PROMPTS:
        return task[:-2]
    raise ValueError(f"unknown LongBench task {task!r}: expected one of {', '.join(ENGLISH_TASKS)} (or a '_e' variant)")


@dataclass(frozen=True)
class LongBenchRecord:
    """One LongBench sample. ``task`` is the file's task name (may be a LongBench-E ``_e`` variant)."""

    task: str
    input: str
    context: str
    answers: tuple[str, ...]
    all_classes: tuple[str, ...] | None
    length: int
    id: str

    @property
    def base_task(self) -> str:
        """The task whose prompt, generation length and metric apply (``_e`` suffix removed)."""
        return base_task(self.task)


def _parse_record(task: str, raw: Any, where: str) -> LongBenchRecord:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    missing = [field for field in ("input", "context", "answers", "length", "_id") if field not in raw]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    for field in ("input", "context", "_id"):
        if not isinstance(raw[field], str):
            raise ValueError(f"{where}: field {field!r} must be a string, got {type(raw[field]).__name__}")
    length = raw["length"]
    if isinstance(length, bool) or not isinstance(length, int):
        raise ValueError(f"{where}: field 'length' must be an integer, got {length!r}")
    answers = string_list(raw["answers"], "answers", where)
    if not answers:
        raise ValueError(f"{where}: field 'answers' is empty")
    classes = raw.get("all_classes")
    all_classes = None if classes is None else string_list(classes, "all_classes", where)
    return LongBenchRecord(
        task=task,
        input=raw["input"],
        context=raw["context"],
        answers=answers,
        all_classes=all_classes,
        length=length,
        id=raw["_id"],
    )


def load_task(data_dir: str | Path, task: str) -> list[LongBenchRecord]:
    """Read ``<data_dir>/<task>.jsonl`` (official LongBench format).

    Raises:
        ValueError: an unknown task or a malformed line (the message names the file and line).
        FileNotFoundError: the file is missing.
    """
    base_task(task)  # validates the name before touching the disk
    path = Path(data_dir) / f"{task}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"LongBench file for task {task!r} not found: {path}")
    records: list[LongBenchRecord] = []
    for where, _, raw in iter_json_lines(path):
        records.append(_parse_record(task, raw, where))
    return records


@dataclass(frozen=True)
class BuiltPrompt:
    """The model input for one record: the final prompt ``text`` (truncated, chat template applied) and its ids.

    ``question_start`` indexes the first token of what follows ``{context}`` in the template (the question, plus the
    chat template's assistant header), for query-agnostic protocols that prefill ``input_ids[:question_start]`` alone;
    best effort, see :func:`build_prompt`.
    """

    text: str
    input_ids: list[int]
    truncated: bool
    question_start: int


def _encode(tokenizer: PreTrainedTokenizerBase, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=add_special_tokens, truncation=False)["input_ids"])


def _token_index_at(
    tokenizer: PreTrainedTokenizerBase, text: str, input_ids: list[int], char_index: int, add_special_tokens: bool
) -> int:
    """Index of the first token of ``input_ids`` (the encoding of ``text``) that covers ``char_index`` or later."""
    if getattr(tokenizer, "is_fast", False):
        encoding = tokenizer(text, add_special_tokens=add_special_tokens, truncation=False, return_offsets_mapping=True)
        if list(encoding["input_ids"]) == input_ids:
            for index, (_, end) in enumerate(encoding["offset_mapping"]):
                if end > char_index:
                    return index
            return len(input_ids)
    # Slow tokenizer: tokenize the prefix alone (may be off by a token where a merge crosses the boundary).
    return min(len(_encode(tokenizer, text[:char_index], add_special_tokens)), len(input_ids))


def _question_char_index(text: str, question: str) -> int:
    """Where the question part starts in ``text``; -1 when none of it is left.

    Trailing whitespace is ignored (chat templates often trim the message). When truncation cut into the question, the
    start of its longest tail in ``text`` is found by bisection (a tail present implies every shorter one is).
    """
    question = question.rstrip()
    if not question:
        return -1
    position = text.rfind(question)
    if position >= 0:
        return position
    low, high = 1, len(question)  # invariant: question[high:] (possibly empty) is present; question[low - 1:] is not
    while low < high:
        middle = (low + high) // 2
        if question[middle:] in text:
            high = middle
        else:
            low = middle + 1
    if high >= len(question):
        return -1
    return text.rfind(question[high:])


def uses_chat_template(task: str, tokenizer: PreTrainedTokenizerBase, chat_template: str = "auto") -> bool:
    """Whether the prompt of ``task`` goes through the tokenizer's chat template.

    ``chat_template``: ``auto`` (pred.py: every task but :data:`NO_CHAT_TEMPLATE`, when the tokenizer has a template),
    ``on`` (every task; the tokenizer must have one) or ``off``.
    """
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise ValueError(f"chat_template must be one of {', '.join(CHAT_TEMPLATE_MODES)}, got {chat_template!r}")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat_template == "on" and not has_template:
        raise ValueError("chat_template='on' but the tokenizer has no chat template")
    if chat_template == "off":
        return False
    return has_template and (chat_template == "on" or base_task(task) not in NO_CHAT_TEMPLATE)


def build_prompt(
    record: LongBenchRecord, tokenizer: PreTrainedTokenizerBase, max_length: int, chat_template: str = "auto"
) -> BuiltPrompt:
    """Official prompt for ``record``: template, middle truncation to ``max_length`` (>= 2) tokens, chat template.

    As ``pred.py``: the prompt is tokenized with the tokenizer's special tokens (e.g. a BOS); past ``max_length``
    tokens, the first and last ``max_length // 2`` are decoded separately (special tokens skipped) and joined. The
    chat template's text already holds its special tokens, so it is tokenized with ``add_special_tokens=False``.

    ``question_start``: the first token covering the last occurrence of the template's text after ``{context}`` (fast
    tokenizer: offset mapping; slow: the prefix tokenized alone). When truncation cut into it (``max_length`` under
    about twice the question) its longest remaining tail is used; when none is left, ``len(input_ids)``.
    """
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an integer >= 2 (two non-empty halves), got {max_length!r}")
    use_chat = uses_chat_template(record.task, tokenizer, chat_template)
    task = record.base_task
    template = PROMPTS[task]
    prompt = template.format(context=record.context, input=record.input)

    ids = _encode(tokenizer, prompt, add_special_tokens=True)
    truncated = len(ids) > max_length
    if truncated:
        half = max_length // 2
        head = tokenizer.decode(ids[:half], skip_special_tokens=True)
        tail = tokenizer.decode(ids[-half:], skip_special_tokens=True)
        prompt = head + tail

    if use_chat:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        if not isinstance(text, str):
            raise ValueError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str")
    else:
        text = prompt
    add_special_tokens = not use_chat
    input_ids = _encode(tokenizer, text, add_special_tokens=add_special_tokens)

    question = template.split("{context}", 1)[1].format(input=record.input)
    char_index = _question_char_index(text, question)
    if char_index < 0:
        question_start = len(input_ids)
    else:
        question_start = _token_index_at(tokenizer, text, input_ids, char_index, add_special_tokens)
    return BuiltPrompt(text=text, input_ids=input_ids, truncated=truncated, question_start=question_start)


def stop_on_newline(task: str) -> bool:
    """Whether generation also stops at a newline token (samsum: the model otherwise keeps writing dialogues)."""
    return base_task(task) == "samsum"


def newline_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The extra stop token for :func:`stop_on_newline` tasks: ``tokenizer.encode("\\n")[-1]``, as in ``pred.py``."""
    ids = tokenizer.encode("\n", add_special_tokens=False)
    if not ids:
        raise ValueError("the tokenizer encodes '\\n' to no token")
    return int(ids[-1])


def postprocess(task: str, prediction: str) -> str:
    """The prediction as scored: its first line (after leading newlines) for :data:`FIRST_LINE_TASKS`, else as is."""
    if base_task(task) in FIRST_LINE_TASKS:
        return prediction.lstrip("\n").split("\n")[0]
    return prediction


def score_record(task: str, prediction: str, answers: Sequence[str], all_classes: Sequence[str] | None = None) -> float:
    """Official per-sample score: the max over ``answers`` of the task metric on the post-processed prediction.

    Starts from 0.0 as ``eval.py`` does, so an empty ``answers`` scores 0.0.
    """
    if isinstance(answers, str):
        raise ValueError("answers must be a sequence of strings, not a single string")
    metric = METRICS[TASK_METRIC[base_task(task)]]
    text = postprocess(task, prediction)
    score = 0.0
    for answer in answers:
        score = max(score, metric(text, answer, all_classes=all_classes))
    return score


def task_score(scores: Sequence[float]) -> float:
    """A task's score from its per-sample scores: ``round(100 * mean, 2)``."""
    if len(scores) == 0:
        raise ValueError("task_score needs at least one sample score")
    return round(100 * sum(scores) / len(scores), 2)


def length_bucket(length: int) -> str:
    """The LongBench-E bucket of a record's ``length`` (words): ``0-4k``, ``4-8k`` or ``8k+``."""
    if length < 4000:
        return "0-4k"
    if length < 8000:
        return "4-8k"
    return "8k+"


def task_score_e(scores: Sequence[float], lengths: Sequence[int]) -> dict[str, float]:
    """LongBench-E scores per length bucket, ``round(100 * mean, 2)`` each; NaN for an empty bucket (as official)."""
    if len(scores) != len(lengths):
        raise ValueError(f"got {len(scores)} scores but {len(lengths)} lengths")
    buckets: dict[str, list[float]] = {name: [] for name in LONGBENCH_E_BUCKETS}
    for score, length in zip(scores, lengths):
        buckets[length_bucket(length)].append(score)
    return {name: round(100 * sum(values) / len(values), 2) if values else math.nan for name, values in buckets.items()}
