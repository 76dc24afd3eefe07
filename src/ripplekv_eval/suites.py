"""The evaluation suites: ``ripplekv eval --suite NAME`` runs ``SUITES[NAME]``.

A :class:`Suite` turns a run's request into scored samples; it owns its options (a frozen dataclass validated in
``__post_init__``, fields named as the ``ripplekv eval`` flags with ``_`` for ``-``), task names, samples and its part
of ``config.json``. The runner reaches suites only through :data:`SUITES` and that interface.
"""

from __future__ import annotations

import dataclasses
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ripplekv.inference.generate import chat_prompt_parts
from ripplekv.profiling.haystack import NeedlePrompt, build_needle_prompt
from ripplekv.validation import check_int
from ripplekv_eval.sample import EvalSample, use_chat_template
from ripplekv_eval.tasks import longbench, ruler
from ripplekv_eval.tasks.longbench import check_record, iter_json_lines
from ripplekv_eval.tasks.metrics import METRICS

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class SuiteRequest(Protocol):
    """What a run asks of a suite (``running.config.EvalConfig`` is one)."""

    options: Any
    tasks: Sequence[str] | None
    limit: int | None
    chat_template: str
    max_new_tokens: int | None
    seed: int


class Suite(ABC):
    """One kind of evaluation: ``name``, ``description``, ``options_type`` (see the module docstring)."""

    name: ClassVar[str]
    description: ClassVar[str]
    options_type: ClassVar[type]

    def parse_options(self, options: Any) -> Any:
        """The options dataclass from a mapping of option name -> value (an option of another suite: ValueError)."""
        if isinstance(options, self.options_type):
            return options
        if not isinstance(options, Mapping):
            raise TypeError(f"options must be a mapping of option name to value, got {type(options).__name__}")
        known = [f.name for f in dataclasses.fields(self.options_type)]
        unknown = [name for name in options if name not in known]
        if unknown:
            flags = {name: "--" + str(name).replace("_", "-") for name in [*known, *unknown]}
            raise ValueError(
                f"{', '.join(flags[name] for name in unknown)} does not apply to the {self.name} suite "
                f"(its own options: {', '.join(flags[name] for name in known) or 'none'})"
            )
        return self.options_type(**options)

    @abstractmethod
    def check_tasks(self, tasks: Sequence[str] | None) -> None:
        """Raise ValueError for task names the suite does not have (None: the suite's default)."""

    @abstractmethod
    def samples(
        self, config: SuiteRequest, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None
    ) -> list[EvalSample]:
        """The samples of ``config`` in run order (``model``, may be None: LongBench's default ``max_length``)."""

    @abstractmethod
    def resolve(self, config: SuiteRequest, model: PreTrainedModel) -> dict[str, Any]:
        """The suite's part of ``config.json``'s resolved configuration, defaults filled in (compared on resume)."""

    def sources(self, config: SuiteRequest) -> dict[str, Any]:
        """Where the suite's data came from (recorded in ``config.json``, not compared on resume)."""
        return {}


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens."""
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def split_prompt(tokenizer: PreTrainedTokenizerBase, head: str, tail: str) -> tuple[tuple[int, ...], int]:
    """Token ids of ``head + tail``, each tokenized on its own (as ``generate_answer`` does), and the split."""
    head_ids, tail_ids = encode(tokenizer, head), encode(tokenizer, tail)
    return tuple(head_ids + tail_ids), len(head_ids)


def cap_new_tokens(config: SuiteRequest, tokens: int) -> int:
    """A task's own answer length ``tokens``, capped by ``config.max_new_tokens``."""
    return min(tokens, config.max_new_tokens) if config.max_new_tokens else tokens


def prompt_ids(
    tokenizer: PreTrainedTokenizerBase, context: str, question: str, mode: str, plain: str | None = None
) -> tuple[tuple[int, ...], int]:
    """:func:`split_prompt` of the prompt of ``context`` + ``question``: with the chat template
    :func:`ripplekv.inference.generate.chat_prompt_parts`, else ``context`` and ``plain`` (default that function's
    plain layout, ``"\\n\\n" + question + "\\nAnswer:"``)."""
    if use_chat_template(tokenizer, mode):
        return split_prompt(tokenizer, *chat_prompt_parts(tokenizer, context, question))
    return split_prompt(tokenizer, context, "\n\n" + question + "\nAnswer:" if plain is None else plain)


@dataclass(frozen=True)
class LongBenchOptions:
    """Options of the LongBench suite; ``skip``: records skipped at the start of each task file before ``limit``
    counts (a held-out split: ``--limit 15`` in one run, ``--skip 15`` in another)."""

    data_dir: str | None = None
    max_length: int | None = None
    skip: int | None = None

    def __post_init__(self) -> None:
        if not self.data_dir:
            raise ValueError("the longbench suite needs --data-dir (a folder of official <task>.jsonl files)")
        object.__setattr__(self, "data_dir", str(self.data_dir))
        check_int("max_length", self.max_length, allow_none=True)
        check_int("skip", self.skip, 0, allow_none=True)


class LongBenchSuite(Suite):
    """LongBench v1 / LongBench-E, English tasks. ``limit``: the first N records of each task file after ``skip``."""

    name = "longbench"
    description = "LongBench v1 / LongBench-E files (official prompts, truncation, chat rule and metrics)"
    options_type = LongBenchOptions

    def check_tasks(self, tasks: Sequence[str] | None) -> None:
        for task in tasks or ():
            longbench.base_task(task)

    def tasks(self, config: SuiteRequest) -> list[str]:
        """``config.tasks``, or every English task with a file in the data folder."""
        if config.tasks is not None:
            return list(config.tasks)
        data_dir = Path(config.options.data_dir)
        if not data_dir.is_dir():
            raise FileNotFoundError(f"LongBench data folder not found: {data_dir}")
        tasks = [task for task in longbench.ENGLISH_TASKS if (data_dir / f"{task}.jsonl").is_file()]
        if not tasks:
            raise ValueError(f"no LongBench task file (<task>.jsonl, English tasks) in {data_dir}")
        return tasks

    def max_length(self, config: SuiteRequest, model: PreTrainedModel | None) -> int:
        """The truncation length: the option, else the model's ``max_position_embeddings``."""
        if config.options.max_length is not None:
            return config.options.max_length
        value = None if model is None else getattr(model.config.get_text_config(), "max_position_embeddings", None)
        if not isinstance(value, int) or value < 2:
            raise ValueError("the model config has no max_position_embeddings: pass --max-length")
        return value

    def samples(
        self, config: SuiteRequest, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None
    ) -> list[EvalSample]:
        max_length = self.max_length(config, model)
        newline = None
        samples: list[EvalSample] = []
        for task in self.tasks(config):
            skip = config.options.skip or 0
            records = longbench.load_task(config.options.data_dir, task)[skip:][: config.limit]
            seen: dict[str, int] = {}
            for record in records:
                built = longbench.build_prompt(record, tokenizer, max_length, config.chat_template)
                stops: frozenset[int] = frozenset()
                if longbench.stop_on_newline(task):
                    newline = longbench.newline_token_id(tokenizer) if newline is None else newline
                    stops = frozenset({newline})
                count = seen.get(record.id, 0)
                seen[record.id] = count + 1

                def score(prediction: str, record: longbench.LongBenchRecord = record) -> float:
                    return longbench.score_record(record.task, prediction, record.answers, record.all_classes)

                samples.append(
                    EvalSample(
                        id=f"{task}/{record.id}" + (f"#{count}" if count else ""),
                        task=task,
                        input_ids=tuple(built.input_ids),
                        question_start=built.question_start,
                        max_new_tokens=cap_new_tokens(config, longbench.MAX_NEW_TOKENS[record.base_task]),
                        score=score,
                        gold=record.answers[0],
                        extra_stop_ids=stops,
                        meta={"length": record.length, "truncated": built.truncated},
                    )
                )
        return samples

    def resolve(self, config: SuiteRequest, model: PreTrainedModel) -> dict[str, Any]:
        resolved = {"tasks": self.tasks(config), "limit": config.limit, "max_length": self.max_length(config, model)}
        if config.options.skip:  # only when set: runs from before the option resume unchanged
            resolved["skip"] = config.options.skip
        return resolved

    def sources(self, config: SuiteRequest) -> dict[str, Any]:
        return {"data_dir": config.options.data_dir}


DEFAULT_CONTEXT_TOKENS = 4096
DEFAULT_RULER_SAMPLES = 10


@dataclass(frozen=True)
class RulerOptions:
    """Options of the RULER suite: ``context_tokens``, each sample's context length in the model's tokens."""

    context_tokens: int = DEFAULT_CONTEXT_TOKENS

    def __post_init__(self) -> None:
        check_int("context_tokens", self.context_tokens)


class RulerSuite(Suite):
    """RULER-style tasks. ``limit``: generated samples per task (default 10); ``seed`` draws them."""

    name = "ruler"
    description = "RULER-style synthetic tasks generated locally (needles, variable tracking, common/frequent words)"
    options_type = RulerOptions

    def check_tasks(self, tasks: Sequence[str] | None) -> None:
        unknown = [t for t in tasks or () if t not in ruler.TASKS]
        if unknown:
            raise ValueError(f"unknown RULER task(s) {', '.join(unknown)}; tasks are: {', '.join(ruler.TASKS)}")

    def samples(
        self, config: SuiteRequest, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None
    ) -> list[EvalSample]:
        per_task = config.limit or DEFAULT_RULER_SAMPLES
        context_tokens = config.options.context_tokens
        generated = ruler.generate_suite(tokenizer, context_tokens, per_task, seed=config.seed, tasks=config.tasks)
        samples = []
        counts: dict[str, int] = {}
        for synthetic in generated:
            index = counts.get(synthetic.task, 0)
            counts[synthetic.task] = index + 1
            plain = "\n" + synthetic.question + synthetic.answer_prefix
            ids, split = prompt_ids(tokenizer, synthetic.context, synthetic.question, config.chat_template, plain)

            def score(prediction: str, synthetic: ruler.SyntheticSample = synthetic) -> float:
                return ruler.score(prediction, synthetic.answers)

            samples.append(
                EvalSample(
                    id=f"{synthetic.task}/{index}",
                    task=synthetic.task,
                    input_ids=ids,
                    question_start=split,
                    max_new_tokens=cap_new_tokens(config, synthetic.max_new_tokens),
                    score=score,
                    gold=", ".join(synthetic.answers),
                    meta={"seed": synthetic.seed, "context_tokens": synthetic.context_tokens},
                )
            )
        return samples

    def resolve(self, config: SuiteRequest, model: PreTrainedModel) -> dict[str, Any]:
        return {
            "tasks": list(config.tasks or ruler.TASKS),
            "limit": config.limit or DEFAULT_RULER_SAMPLES,
            "context_tokens": config.options.context_tokens,
        }


DEFAULT_NEEDLE_LENGTHS = (1024, 2048, 4096)
DEFAULT_NEEDLE_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_NEEDLE_DIGITS = 7
NEEDLE_MAX_NEW_TOKENS = 32


@dataclass(frozen=True)
class NeedleOptions:
    """Options of the needle suite: context lengths in tokens, depths in [0, 1] (0: start), digits 1 to 18."""

    needle_lengths: tuple[int, ...] = DEFAULT_NEEDLE_LENGTHS
    needle_depths: tuple[float, ...] = DEFAULT_NEEDLE_DEPTHS
    needle_digits: int = DEFAULT_NEEDLE_DIGITS

    def __post_init__(self) -> None:
        object.__setattr__(self, "needle_lengths", tuple(self.needle_lengths))
        object.__setattr__(self, "needle_depths", tuple(self.needle_depths))
        if not self.needle_lengths or not self.needle_depths:
            raise ValueError("needle lengths and depths must not be empty")
        for length in self.needle_lengths:
            check_int("needle length", length)
        for depth in self.needle_depths:
            if isinstance(depth, bool) or not (isinstance(depth, (int, float)) and 0.0 <= depth <= 1.0):
                raise ValueError(f"needle depth must be in [0, 1], got {depth!r}")
        if any(len(set(values)) != len(values) for values in (self.needle_lengths, self.needle_depths)):
            raise ValueError("needle lengths and depths must not contain duplicates")
        check_int("needle digits", self.needle_digits)
        if self.needle_digits > 18:
            raise ValueError(f"needle digits must be in [1, 18], got {self.needle_digits}")


class NeedleSuite(Suite):
    """Needles over length x depth. ``limit``: needles (seeds ``seed .. seed + limit - 1``) per cell (default 1)."""

    name = "needle"
    description = "a number hidden in essay text, over context lengths x depths"
    options_type = NeedleOptions

    def check_tasks(self, tasks: Sequence[str] | None) -> None:
        if tasks is not None:
            raise ValueError("the needle suite has no tasks: choose --needle-lengths and --needle-depths")

    def samples(
        self, config: SuiteRequest, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None
    ) -> list[EvalSample]:
        options: NeedleOptions = config.options
        samples = []
        for length in options.needle_lengths:
            for depth in options.needle_depths:
                for j in range(config.limit or 1):
                    seed = config.seed + j
                    digits = options.needle_digits
                    needle = build_needle_prompt(tokenizer, length, depth=depth, seed=seed, digits=digits)
                    ids, split = prompt_ids(tokenizer, needle.context, needle.question, config.chat_template)

                    def score(prediction: str, needle: NeedlePrompt = needle) -> float:
                        return 1.0 if needle.retrieved(prediction) else 0.0

                    samples.append(
                        EvalSample(
                            id=f"needle/{length}/{depth:g}/{j}",
                            task="needle",
                            input_ids=ids,
                            question_start=split,
                            max_new_tokens=cap_new_tokens(config, NEEDLE_MAX_NEW_TOKENS),
                            score=score,
                            gold=needle.answer,
                            meta={"length": length, "depth": float(depth), "seed": seed, "answer": needle.answer},
                        )
                    )
        return samples

    def resolve(self, config: SuiteRequest, model: PreTrainedModel) -> dict[str, Any]:
        options: NeedleOptions = config.options
        return {
            "needle_lengths": list(options.needle_lengths),
            "needle_depths": [float(d) for d in options.needle_depths],
            "needle_digits": options.needle_digits,
            "limit": config.limit or 1,
        }


DEFAULT_JSONL_METRIC = "qa_f1_score"
JSONL_MAX_NEW_TOKENS = 64


@dataclass(frozen=True)
class JsonlOptions:
    """Options of the JSONL suite: ``data``, the file (required); ``metric``, a LongBench metric's name."""

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


def _parse(raw: Any, index: int, metric: str, where: str) -> JsonlRecord:
    answers, all_classes = check_record(raw, where, ("context", "question"))
    if not raw["context"]:
        raise ValueError(f"{where}: field 'context' is empty")
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
    """The records of a JSONL file, checked (fields, types, unique ids, scorable by ``metric``; ValueError naming
    the file and line)."""
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
        limit = None if model is None else getattr(model.config.get_text_config(), "max_position_embeddings", None)
        samples = []
        for record in load_jsonl(options.data, options.metric)[: config.limit]:
            ids, split = prompt_ids(tokenizer, record.context, record.question, config.chat_template)
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


SUITES: dict[str, Suite] = {}
"""Registered suites by name, in registration order."""


def register_suite(suite: Suite) -> Suite:
    """Add ``suite`` to :data:`SUITES` under ``suite.name`` (a name already taken is an error)."""
    if not isinstance(suite, Suite):
        raise TypeError(f"expected a Suite, got {type(suite).__name__}")
    if suite.name in SUITES:
        raise ValueError(f"a suite named {suite.name!r} is already registered")
    SUITES[suite.name] = suite
    return suite


def get_suite(name: str) -> Suite:
    """The registered suite ``name``; ValueError naming the registered ones otherwise."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; choose one of {', '.join(SUITES)}")
    return SUITES[name]


for _suite in (LongBenchSuite(), RulerSuite(), NeedleSuite(), JsonlSuite()):
    register_suite(_suite)
