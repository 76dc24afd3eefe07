"""The JSONL suite: a user's own file of ``{"context", "question", "answers"}`` records, scored by a LongBench metric.

Optional fields: ``id`` (or ``_id``; string or integer, unique; default the record's index), ``all_classes`` (for
``classification_score``) and ``task`` (sub-tasks of one file; default the file's name without ``.jsonl``). The
prompt is :func:`ripplekv_eval.suites.base.prompt_parts`'s; a prediction scores the max of the metric over
``answers``, as LongBench's ``eval.py`` does; ``gold_nll``'s gold answer is the first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ripplekv_eval.sample import EvalSample
from ripplekv_eval.suites.base import Suite, SuiteRequest, prompt_parts, split_prompt
from ripplekv_eval.tasks.jsonlines import iter_json_lines
from ripplekv_eval.tasks.metrics import METRICS

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


__all__ = ["DEFAULT_JSONL_METRIC", "JSONL_MAX_NEW_TOKENS", "JsonlOptions", "JsonlRecord", "JsonlSuite", "load_jsonl"]

DEFAULT_JSONL_METRIC = "qa_f1_score"
JSONL_MAX_NEW_TOKENS = 64


@dataclass(frozen=True)
class JsonlOptions:
    """Options of the JSONL suite: ``data``, the file (required); ``metric``, a key of
    :data:`ripplekv_eval.tasks.metrics.METRICS`.
    """

    data: str | None = None
    metric: str = DEFAULT_JSONL_METRIC

    def __post_init__(self) -> None:
        if not self.data:
            raise ValueError("the jsonl suite needs --data (a .jsonl file of context/question/answers records)")
        object.__setattr__(self, "data", str(self.data))
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; choose one of {', '.join(METRICS)}")


@dataclass(frozen=True)
class JsonlRecord:
    """One record of a JSONL file (``task`` None: the file's task)."""

    id: str
    context: str
    question: str
    answers: tuple[str, ...]
    all_classes: tuple[str, ...] | None = None
    task: str | None = None


def _strings(value: Any, field: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{where}: field {field!r} must be a list of strings, got {value!r:.80}")
    return tuple(value)


def _parse(raw: Any, index: int, metric: str, where: str) -> JsonlRecord:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    missing = [name for name in ("context", "question", "answers") if name not in raw]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    for name in ("context", "question"):
        if not isinstance(raw[name], str):
            raise ValueError(f"{where}: field {name!r} must be a string, got {type(raw[name]).__name__}")
    if not raw["context"]:
        raise ValueError(f"{where}: field 'context' is empty")
    answers = _strings(raw["answers"], "answers", where)
    if not answers:
        raise ValueError(f"{where}: field 'answers' is empty")
    classes = raw.get("all_classes")
    all_classes = None if classes is None else _strings(classes, "all_classes", where)
    identifier = raw.get("id", raw.get("_id", index))
    if isinstance(identifier, bool) or not isinstance(identifier, (str, int)):
        raise ValueError(f"{where}: field 'id' must be a string or an integer, got {identifier!r:.80}")
    task = raw.get("task")
    if task is not None and (not isinstance(task, str) or not task or "/" in task or task != task.strip()):
        raise ValueError(
            f"{where}: field 'task' must be a non-empty string without '/' or edge spaces, got {task!r:.80}"
        )
    for answer in answers:  # a metric that cannot score this record (no all_classes, no "Paragraph N") fails here
        try:
            METRICS[metric]("", answer, all_classes=all_classes)
        except ValueError as err:
            raise ValueError(f"{where}: {metric} cannot score this record: {err}") from None
    return JsonlRecord(str(identifier), raw["context"], raw["question"], answers, all_classes, task)


def load_jsonl(path: str | Path, metric: str = DEFAULT_JSONL_METRIC) -> list[JsonlRecord]:
    """The records of a JSONL file, checked (fields, types, unique ids, scorable by ``metric``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a malformed line or record (the message names the file and line), or a repeated id.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"JSONL data file not found: {path}")
    records: list[JsonlRecord] = []
    lines: dict[str, int] = {}
    for where, line_number, raw in iter_json_lines(path):
        record = _parse(raw, len(records), metric, where)
        if record.id in lines:
            raise ValueError(f"{where}: id {record.id!r} repeats the record on line {lines[record.id]}")
        lines[record.id] = line_number
        records.append(record)
    if not records:
        raise ValueError(f"{path} holds no record")
    return records


class JsonlSuite(Suite):
    """A user's JSONL file. ``limit``: its first N records; ``max_new_tokens``: the answer length (default 64)."""

    name = "jsonl"
    description = "a JSONL file of context/question/answers records, scored with a LongBench metric"
    options_type = JsonlOptions

    def task(self, config: SuiteRequest) -> str:
        """The task name: the file's name without its ``.jsonl`` suffix."""
        name = Path(config.options.data).name
        return name.removesuffix(".jsonl") or name

    def check_tasks(self, tasks: Sequence[str] | None) -> None:
        if tasks is not None:
            raise ValueError("the jsonl suite has one task, named after its --data file: --tasks does not apply")

    def samples(
        self, config: SuiteRequest, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None
    ) -> list[EvalSample]:
        options: JsonlOptions = config.options
        metric = METRICS[options.metric]
        task = self.task(config)
        limit = None
        if model is not None:
            limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        samples = []
        for record in load_jsonl(options.data, options.metric)[: config.limit]:
            parts = prompt_parts(tokenizer, record.context, record.question, config.chat_template)
            ids, split = split_prompt(tokenizer, *parts)
            if isinstance(limit, int) and len(ids) > limit:
                raise ValueError(
                    f"{options.data}: record {record.id!r} has {len(ids)} prompt tokens, more than the model's "
                    f"{limit} positions: shorten its context"
                )

            def score(prediction: str, record: JsonlRecord = record) -> float:
                return max(metric(prediction, answer, all_classes=record.all_classes) for answer in record.answers)

            own = record.task or task
            samples.append(
                EvalSample(
                    id=f"{own}/{record.id}",
                    task=own,
                    input_ids=ids,
                    question_start=split,
                    max_new_tokens=config.max_new_tokens or JSONL_MAX_NEW_TOKENS,
                    score=score,
                    gold=record.answers[0],
                )
            )
        return samples

    def resolve(self, config: SuiteRequest, model: PreTrainedModel) -> dict[str, Any]:
        options: JsonlOptions = config.options
        digest = hashlib.sha256(Path(options.data).read_bytes()).hexdigest()
        own = dict.fromkeys(r.task for r in load_jsonl(options.data, options.metric)[: config.limit] if r.task)
        tasks = list(own) if own else [self.task(config)]
        return {"tasks": tasks, "limit": config.limit, "metric": options.metric, "data_sha256": digest}

    def sources(self, config: SuiteRequest) -> dict[str, Any]:
        return {"data": config.options.data}
