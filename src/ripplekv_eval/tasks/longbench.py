"""The LongBench v1 / LongBench-E evaluation protocol (THUDM/LongBench ``pred.py`` and ``eval.py``), English tasks.

Per record: the task's official template; middle truncation to ``max_length`` tokens; the chat template except for
:data:`NO_CHAT_TEMPLATE` (:func:`build_prompt`); greedy decoding for :data:`MAX_NEW_TOKENS` (samsum also stops at a
newline); scoring by :func:`score_record`, ``round(100 * mean, 2)`` per task, per length bucket for LongBench-E.
``<task>_e.jsonl`` files use their base task's prompt, length and metric.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ripplekv.validation import check_int
from ripplekv_eval.sample import use_chat_template
from ripplekv_eval.tasks.metrics import METRICS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from transformers import PreTrainedTokenizerBase

_MULTI_DOC_QA = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other words."
    "\n\nThe following are given passages.\n{context}\n\n"
    "Answer the question based on the given passages. Only give me the answer and do not output any other words."
    "\n\nQuestion: {input}\nAnswer:"
)

PROMPTS: dict[str, str] = {
    "narrativeqa": (  # "asconcisely" (twice) is the official text's typo, kept verbatim
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the question "
        "asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\n"
        "Story: {context}\n\n"
        "Now, answer the question based on the story asconcisely as you can, using a single phrase if possible. "
        "Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:"
    ),
    "qasper": (
        "You are given a scientific article and a question. Answer the question as concisely as you can, using a "
        "single phrase or sentence if possible. If the question cannot be answered based on the information in the "
        'article, write "unanswerable". If the question is a yes/no question, answer "yes", "no", or "unanswerable". '
        "Do not provide any explanation.\n\nArticle: {context}\n\n "
        "Answer the question based on the above article as concisely as you can, using a single phrase or sentence "
        "if possible. If the question cannot be answered based on the information in the article, write "
        '"unanswerable". If the question is a yes/no question, answer "yes", "no", or "unanswerable". '
        "Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:"
    ),
    "multifieldqa_en": (
        "Read the following text and answer briefly.\n\n{context}\n\n"
        "Now, answer the following question based on the above text, only give me the answer and do not output any "
        "other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "hotpotqa": _MULTI_DOC_QA,
    "2wikimqa": _MULTI_DOC_QA,
    "musique": _MULTI_DOC_QA,
    "gov_report": (
        "You are given a report by a government agency. Write a one-page summary of the report.\n\n"
        "Report:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:"
    ),
    "qmsum": (
        "You are given a meeting transcript and a query containing a question or instruction. Answer the query in "
        "one or more sentences.\n\nTranscript:\n{context}\n\n"
        "Now, answer the query based on the above meeting transcript in one or more sentences.\n\n"
        "Query: {input}\nAnswer:"
    ),
    "multi_news": (
        "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\n"
        "Now, write a one-page summary of all the news.\n\nSummary:"
    ),
    "trec": (
        "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}"
    ),
    "triviaqa": (
        "Answer the question based on the given passage. Only give me the answer and do not output any other words. "
        "The following are some examples.\n\n{context}\n\n{input}"
    ),
    "samsum": (
        "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}"
    ),
    "passage_count": (
        "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully "
        "read these paragraphs and determine how many unique paragraphs there are after removing duplicates. In "
        "other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\n"
        "Please enter the final count of unique paragraphs after removing duplicates. The output format should only "
        "contain the number, such as 1, 2, 3, and so on.\n\nThe final answer is: "
    ),
    "passage_retrieval_en": (
        "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the "
        "abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\n"
        "Please enter the number of the paragraph that the abstract is from. The answer format must be like "
        '"Paragraph 1", "Paragraph 2", etc.\n\nThe answer is: '
    ),
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}
"""Official prompt templates (``config/dataset2prompt.json``), character for character, typos included."""

ENGLISH_TASKS: tuple[str, ...] = tuple(PROMPTS)
"""The 16 English tasks of LongBench v1 (LongBench-E covers 13 of them: not narrativeqa, musique, qmsum)."""

_LENGTH_AND_METRIC: dict[str, tuple[int, str]] = {
    "narrativeqa": (128, "qa_f1_score"),
    "qasper": (128, "qa_f1_score"),
    "multifieldqa_en": (64, "qa_f1_score"),
    "hotpotqa": (32, "qa_f1_score"),
    "2wikimqa": (32, "qa_f1_score"),
    "musique": (32, "qa_f1_score"),
    "gov_report": (512, "rouge_score"),
    "qmsum": (512, "rouge_score"),
    "multi_news": (512, "rouge_score"),
    "trec": (64, "classification_score"),
    "triviaqa": (32, "qa_f1_score"),
    "samsum": (128, "rouge_score"),
    "passage_count": (32, "count_score"),
    "passage_retrieval_en": (32, "retrieval_score"),
    "lcc": (64, "code_sim_score"),
    "repobench-p": (64, "code_sim_score"),
}
"""Task -> its official generation length (``config/dataset2maxlen.json``) and metric (``eval.py``)."""

MAX_NEW_TOKENS: dict[str, int] = {task: length for task, (length, _) in _LENGTH_AND_METRIC.items()}
TASK_METRIC: dict[str, str] = {task: metric for task, (_, metric) in _LENGTH_AND_METRIC.items()}
"""Task -> metric name (a key of :data:`ripplekv_eval.tasks.metrics.METRICS`)."""

NO_CHAT_TEMPLATE: frozenset[str] = frozenset({"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"})
"""Tasks whose prompt is fed raw, without the chat template (few-shot and code completion)."""


FIRST_LINE_TASKS: frozenset[str] = frozenset({"trec", "triviaqa", "samsum", "lsht"})
"""Tasks whose prediction is cut to its first line before scoring."""

LONGBENCH_E_BUCKETS: tuple[str, ...] = ("0-4k", "4-8k", "8k+")
"""LongBench-E length buckets (``length`` in words: < 4000, < 8000, the rest)."""


def iter_json_lines(path: Path) -> Iterator[tuple[str, int, Any]]:
    """``(where, line_number, value)`` for every non-blank line of ``path`` (``where``: ``"path:line"``); ValueError
    naming the file, line and column for invalid JSON."""
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_number}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: invalid JSON ({error.msg} at column {error.colno})") from error
            yield where, line_number, raw


def _strings(value: Any, field: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{where}: field {field!r} must be a list of strings, got {value!r:.80}")
    return tuple(value)


def check_record(
    raw: Any, where: str, strings: tuple[str, ...], other: tuple[str, ...] = ()
) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """A JSON record's ``(answers, all_classes)``, after checking that it is an object holding the string fields
    ``strings``, the fields ``other`` and a non-empty list of strings ``answers`` (``where``: file and line)."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    missing = [field for field in (*strings, "answers", *other) if field not in raw]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    for field in strings:
        if not isinstance(raw[field], str):
            raise ValueError(f"{where}: field {field!r} must be a string, got {type(raw[field]).__name__}")
    answers = _strings(raw["answers"], "answers", where)
    if not answers:
        raise ValueError(f"{where}: field 'answers' is empty")
    classes = raw.get("all_classes")
    return answers, None if classes is None else _strings(classes, "all_classes", where)


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
    answers, all_classes = check_record(raw, where, ("input", "context", "_id"), ("length",))
    length = raw["length"]
    if isinstance(length, bool) or not isinstance(length, int):
        raise ValueError(f"{where}: field 'length' must be an integer, got {length!r}")
    return LongBenchRecord(task, raw["input"], raw["context"], answers, all_classes, length, raw["_id"])


def load_task(data_dir: str | Path, task: str) -> list[LongBenchRecord]:
    """Read ``<data_dir>/<task>.jsonl`` (official LongBench format)."""
    base_task(task)  # validates the name before touching the disk
    path = Path(data_dir) / f"{task}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"LongBench file for task {task!r} not found: {path}")
    return [_parse_record(task, raw, where) for where, _, raw in iter_json_lines(path)]


@dataclass(frozen=True)
class BuiltPrompt:
    """The model input for one record: the final prompt ``text`` and its ids (see :func:`build_prompt`)."""

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
    return -1 if high >= len(question) else text.rfind(question[high:])


def uses_chat_template(task: str, tokenizer: PreTrainedTokenizerBase, chat_template: str = "auto") -> bool:
    """Whether the prompt of ``task`` goes through the tokenizer's chat template (``auto``: pred.py's rule, every
    task but :data:`NO_CHAT_TEMPLATE`)."""
    return use_chat_template(tokenizer, chat_template) and (
        chat_template == "on" or base_task(task) not in NO_CHAT_TEMPLATE
    )


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
    check_int("max_length", max_length, 2)  # two non-empty halves
    use_chat = uses_chat_template(record.task, tokenizer, chat_template)
    template = PROMPTS[record.base_task]
    prompt = template.format(context=record.context, input=record.input)

    ids = _encode(tokenizer, prompt, add_special_tokens=True)
    truncated = len(ids) > max_length
    if truncated:
        half = max_length // 2
        head = tokenizer.decode(ids[:half], skip_special_tokens=True)
        tail = tokenizer.decode(ids[-half:], skip_special_tokens=True)
        prompt = head + tail

    text = prompt
    if use_chat:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        if not isinstance(text, str):
            raise ValueError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str")
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
    return prediction.lstrip("\n").split("\n")[0] if base_task(task) in FIRST_LINE_TASKS else prediction


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


def length_bucket(length: int) -> str:
    """The LongBench-E bucket of a record's ``length`` (words): ``0-4k``, ``4-8k`` or ``8k+``."""
    if length < 4000:
        return "0-4k"
    if length < 8000:
        return "4-8k"
    return "8k+"
