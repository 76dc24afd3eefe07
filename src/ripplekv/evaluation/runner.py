"""``ripplekv eval``: score methods x budgets on LongBench, the RULER-style suite or needle prompts.

Every sample is prefilled **once**: the prefill is recorded (:mod:`ripplekv.inference.shared`) and the cache of
every (method, budget) is derived from that record, then decoded greedily. ``full`` runs once per sample
(budget 1.0). A press whose cache cannot be derived from a record (AdaKV, which masks keys through module state)
gets its own prefill instead; such configurations run after the derived ones of the sample.

Protocols: ``question-aware`` (default) prefills and compresses the whole prompt; ``query-agnostic`` prefills and
compresses the context part only (shared), then runs the question over each derived cache with ``extend``.

Output folder::

    config.json     the resolved configuration (compared on resume), library and dependency versions
    results.jsonl   one row per (sample, method, budget), appended, flushed and fsynced as soon as it finishes

Re-running the same command resumes: rows already in ``results.jsonl`` are skipped, a truncated last line (an
interrupted write) is dropped and redone, and a folder whose ``config.json`` holds a different configuration is
refused. An interruption loses at most the configuration in flight.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from kvpress.presses.base_press import BasePress
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.evaluation import longbench, ruler
from ripplekv.inference.generate import Prefill, chat_prompt_parts, eos_ids, extend, greedy_decode, prefill
from ripplekv.inference.shared import NotDerivableError, PrefillRecord, compress_recorded, record_prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.cache import layer_lengths
from ripplekv.presses.registry import DEFAULT_WINDOW, METHODS, make_press
from ripplekv.profiling.haystack import NeedlePrompt, build_needle_prompt
from ripplekv.profiling.profile import SensitivityProfile, write_json_atomic

__all__ = [
    "CONFIG_FILE",
    "DEFAULT_BUDGETS",
    "DEFAULT_METHODS",
    "FULL_BUDGET",
    "RESULTS_FILE",
    "SUITES",
    "ConfigMismatchError",
    "EvalConfig",
    "EvalSample",
    "EvalSummary",
    "ResultsLog",
    "build_samples",
    "run_eval",
]

SUITES = ("longbench", "ruler", "needle")
PROTOCOLS = ("question-aware", "query-agnostic")
DEFAULT_METHODS = ("full", "snapkv", "pyramidkv", "ripplekv")
DEFAULT_BUDGETS = (0.1, 0.2, 0.3)
DEFAULT_CONTEXT_TOKENS = 4096
DEFAULT_RULER_SAMPLES = 10
DEFAULT_NEEDLE_LENGTHS = (1024, 2048, 4096)
DEFAULT_NEEDLE_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_NEEDLE_DIGITS = 7
NEEDLE_MAX_NEW_TOKENS = 32
FULL_BUDGET = 1.0
CONFIG_FILE = "config.json"
RESULTS_FILE = "results.jsonl"
CONFIG_FORMAT = "ripplekv-eval/1"
ROW_KEYS = ("sample_id", "method", "budget")

RowKey = tuple[str, str, float]


class ConfigMismatchError(ValueError):
    """The output folder holds a run of another configuration."""


def _positive_int(name: str, value: object, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate (the options of ``ripplekv eval``).

    ``limit``: at most this many samples per task: the first ``limit`` records of each LongBench file (default
    all), ``limit`` generated samples per RULER task (default 10), ``limit`` needles (seeds ``seed .. seed +
    limit - 1``) per (length, depth) cell (default 1). ``max_length`` (LongBench middle truncation) defaults to the
    model's ``max_position_embeddings``. ``max_new_tokens`` caps every task's generation length (default: the
    task's own). ``full`` is run once per sample at budget 1.0 whatever ``budgets`` holds.
    """

    suite: str
    model: str = "smollm2-135m"
    methods: tuple[str, ...] = DEFAULT_METHODS
    budgets: tuple[float, ...] = DEFAULT_BUDGETS
    data_dir: str | None = None
    tasks: tuple[str, ...] | None = None
    limit: int | None = None
    profile: str | None = None
    protocol: str = "question-aware"
    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    max_length: int | None = None
    needle_lengths: tuple[int, ...] = DEFAULT_NEEDLE_LENGTHS
    needle_depths: tuple[float, ...] = DEFAULT_NEEDLE_DEPTHS
    needle_digits: int = DEFAULT_NEEDLE_DIGITS
    window_size: int = DEFAULT_WINDOW
    max_new_tokens: int | None = None
    seed: int = 0
    dtype: str | None = None
    device: str | None = None

    def __post_init__(self) -> None:
        if self.suite not in SUITES:
            raise ValueError(f"unknown suite {self.suite!r}; choose one of {', '.join(SUITES)}")
        if not self.methods:
            raise ValueError("no methods given")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods contain duplicates: {', '.join(self.methods)}")
        if any(m != "full" for m in self.methods) and not self.budgets:
            raise ValueError("no budgets given")
        for budget in self.budgets:
            if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget):
                raise ValueError(f"budget must be a number, got {budget!r}")
            if budget <= 0 or (budget > 1 and budget != int(budget)):
                raise ValueError(f"budget {budget} out of range: a kept fraction in (0, 1] or a whole token count > 1")
        if len(set(self.budgets)) != len(self.budgets):
            raise ValueError(f"budgets contain duplicates: {self.budgets}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.tasks is not None and (not self.tasks or len(set(self.tasks)) != len(self.tasks)):
            raise ValueError(f"tasks must be a non-empty list without duplicates, got {self.tasks!r}")
        _positive_int("limit", self.limit, allow_none=True)
        _positive_int("context_tokens", self.context_tokens)
        _positive_int("max_length", self.max_length, allow_none=True)
        _positive_int("window_size", self.window_size)
        _positive_int("max_new_tokens", self.max_new_tokens, allow_none=True)
        if not self.needle_lengths or not self.needle_depths:
            raise ValueError("needle lengths and depths must not be empty")
        for length in self.needle_lengths:
            _positive_int("needle length", length)
        for depth in self.needle_depths:
            if not (isinstance(depth, (int, float)) and 0.0 <= depth <= 1.0):
                raise ValueError(f"needle depth must be in [0, 1], got {depth!r}")
        if len(set(self.needle_lengths)) != len(self.needle_lengths) or len(set(self.needle_depths)) != len(
            self.needle_depths
        ):
            raise ValueError("needle lengths and depths must not contain duplicates")
        if not 1 <= self.needle_digits <= 18:
            raise ValueError(f"needle digits must be in [1, 18], got {self.needle_digits}")
        if self.suite == "longbench" and not self.data_dir:
            raise ValueError("the longbench suite needs --data-dir (a folder of official <task>.jsonl files)")
        if self.suite == "ruler" and self.tasks is not None:
            unknown = [t for t in self.tasks if t not in ruler.TASKS]
            if unknown:
                raise ValueError(f"unknown RULER task(s) {', '.join(unknown)}; tasks are: {', '.join(ruler.TASKS)}")
        if self.suite == "longbench" and self.tasks is not None:
            for task in self.tasks:
                longbench.base_task(task)
        if self.suite == "needle" and self.tasks is not None:
            raise ValueError("the needle suite has no tasks: choose --needle-lengths and --needle-depths")

    @property
    def configurations(self) -> list[tuple[str, float]]:
        """The (method, budget) pairs run on every sample: ``full`` once at 1.0, the others at every budget."""
        pairs = [("full", FULL_BUDGET)] if "full" in self.methods else []
        pairs += [(m, float(b)) for m in self.methods if m != "full" for b in self.budgets]
        return pairs


@dataclass(frozen=True)
class EvalSample:
    """One prompt, ready to prefill, and how to score an answer to it."""

    id: str  # unique within the run
    task: str
    input_ids: tuple[int, ...]
    question_start: int  # first token of the question part (query-agnostic: the context is input_ids[:this])
    max_new_tokens: int
    score: Callable[[str], float] = field(compare=False, repr=False)
    extra_stop_ids: frozenset[int] = frozenset()
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EvalSummary:
    out: Path
    rows: int  # rows in results.jsonl at the end
    new_rows: int  # rows written by this call
    samples: int
    configurations: int
    seconds: float


# --------------------------------------------------------------------------------------------------- samples


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def _split_prompt(tokenizer: PreTrainedTokenizerBase, head: str, tail: str) -> tuple[tuple[int, ...], int]:
    """Token ids of ``head + tail``, each tokenized on its own (as ``generate_answer`` does), and the split."""
    head_ids, tail_ids = _encode(tokenizer, head), _encode(tokenizer, tail)
    return tuple(head_ids + tail_ids), len(head_ids)


def _cap(config: EvalConfig, tokens: int) -> int:
    return min(tokens, config.max_new_tokens) if config.max_new_tokens else tokens


def _longbench_tasks(config: EvalConfig) -> list[str]:
    if config.tasks is not None:
        return list(config.tasks)
    data_dir = Path(config.data_dir or "")
    if not data_dir.is_dir():
        raise FileNotFoundError(f"LongBench data folder not found: {data_dir}")
    tasks = [task for task in longbench.ENGLISH_TASKS if (data_dir / f"{task}.jsonl").is_file()]
    if not tasks:
        raise ValueError(f"no LongBench task file (<task>.jsonl, English tasks) in {data_dir}")
    return tasks


def _longbench_samples(config: EvalConfig, tokenizer: PreTrainedTokenizerBase, max_length: int) -> list[EvalSample]:
    newline = None
    samples: list[EvalSample] = []
    for task in _longbench_tasks(config):
        records = longbench.load_task(config.data_dir or "", task)[: config.limit]
        seen: dict[str, int] = {}
        for record in records:
            built = longbench.build_prompt(record, tokenizer, max_length)
            stops: frozenset[int] = frozenset()
            if longbench.stop_on_newline(task):
                newline = longbench.newline_token_id(tokenizer) if newline is None else newline
                stops = frozenset({newline})
            count = seen.get(record.id, 0)
            seen[record.id] = count + 1
            sample_id = f"{task}/{record.id}" + (f"#{count}" if count else "")

            def score(prediction: str, record: longbench.LongBenchRecord = record) -> float:
                return longbench.score_record(record.task, prediction, record.answers, record.all_classes)

            samples.append(
                EvalSample(
                    id=sample_id,
                    task=task,
                    input_ids=tuple(built.input_ids),
                    question_start=built.question_start,
                    max_new_tokens=_cap(config, longbench.MAX_NEW_TOKENS[record.base_task]),
                    score=score,
                    extra_stop_ids=stops,
                    meta={"length": record.length, "truncated": built.truncated},
                )
            )
    return samples


def _ruler_parts(tokenizer: PreTrainedTokenizerBase, sample: ruler.SyntheticSample) -> tuple[str, str]:
    """Chat models: the chat prompt split at the question; base models: RULER's layout with its answer prefix."""
    if getattr(tokenizer, "chat_template", None):
        return chat_prompt_parts(tokenizer, sample.context, sample.question)
    return sample.context, "\n" + sample.question + sample.answer_prefix


def _ruler_samples(config: EvalConfig, tokenizer: PreTrainedTokenizerBase) -> list[EvalSample]:
    per_task = config.limit or DEFAULT_RULER_SAMPLES
    suite = ruler.generate_suite(tokenizer, config.context_tokens, per_task, seed=config.seed, tasks=config.tasks)
    samples = []
    counts: dict[str, int] = {}
    for synthetic in suite:
        index = counts.get(synthetic.task, 0)
        counts[synthetic.task] = index + 1
        ids, split = _split_prompt(tokenizer, *_ruler_parts(tokenizer, synthetic))

        def score(prediction: str, synthetic: ruler.SyntheticSample = synthetic) -> float:
            return ruler.score(synthetic, prediction)

        samples.append(
            EvalSample(
                id=f"{synthetic.task}/{index}",
                task=synthetic.task,
                input_ids=ids,
                question_start=split,
                max_new_tokens=_cap(config, synthetic.max_new_tokens),
                score=score,
                meta={"seed": synthetic.seed, "context_tokens": synthetic.context_tokens},
            )
        )
    return samples


def _needle_samples(config: EvalConfig, tokenizer: PreTrainedTokenizerBase) -> list[EvalSample]:
    samples = []
    for length in config.needle_lengths:
        for depth in config.needle_depths:
            for j in range(config.limit or 1):
                seed = config.seed + j
                needle = build_needle_prompt(tokenizer, length, depth=depth, seed=seed, digits=config.needle_digits)
                ids, split = _split_prompt(tokenizer, *chat_prompt_parts(tokenizer, needle.context, needle.question))

                def score(prediction: str, needle: NeedlePrompt = needle) -> float:
                    return 1.0 if needle.retrieved(prediction) else 0.0

                samples.append(
                    EvalSample(
                        id=f"needle/{length}/{depth:g}/{j}",
                        task="needle",
                        input_ids=ids,
                        question_start=split,
                        max_new_tokens=_cap(config, NEEDLE_MAX_NEW_TOKENS),
                        score=score,
                        meta={"length": length, "depth": float(depth), "seed": seed, "answer": needle.answer},
                    )
                )
    return samples


def default_max_length(model: PreTrainedModel) -> int:
    """LongBench's truncation length for ``model``: its ``max_position_embeddings``."""
    value = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if not isinstance(value, int) or value < 2:
        raise ValueError("the model config has no max_position_embeddings: pass --max-length")
    return value


def build_samples(
    config: EvalConfig, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None = None
) -> list[EvalSample]:
    """The samples of ``config.suite`` (in run order); ``model`` gives LongBench's default ``max_length``."""
    if config.suite == "longbench":
        if config.max_length is not None:
            max_length = config.max_length
        elif model is not None:
            max_length = default_max_length(model)
        else:
            raise ValueError("LongBench needs max_length or a model to take it from")
        samples = _longbench_samples(config, tokenizer, max_length)
    elif config.suite == "ruler":
        samples = _ruler_samples(config, tokenizer)
    else:
        samples = _needle_samples(config, tokenizer)
    if not samples:
        raise ValueError(f"the {config.suite} suite has no samples with these options")
    if len({s.id for s in samples}) != len(samples):
        raise ValueError("sample ids are not unique")
    return samples


# ---------------------------------------------------------------------------------------------- config file


def _sha256_json(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def resolve_config(
    config: EvalConfig,
    model: PreTrainedModel,
    samples: Sequence[EvalSample],
    profile: SensitivityProfile | None,
) -> dict[str, Any]:
    """The configuration compared on resume: options with their defaults filled in, the model's identity, the
    profile's content hash, and a hash of every sample's token ids (dataset, tokenizer and prompt format)."""
    from ripplekv.models import model_identity

    resolved: dict[str, Any] = {
        "suite": config.suite,
        "model": model_identity(model),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "methods": list(config.methods),
        "budgets": [float(b) for b in config.budgets],
        "protocol": config.protocol,
        "window_size": config.window_size,
        "max_new_tokens": config.max_new_tokens,
        "seed": config.seed,
        "profile": None if profile is None else {"sha256": _sha256_json(profile.to_dict())},
    }
    if config.suite == "longbench":
        resolved["tasks"] = _longbench_tasks(config)
        resolved["limit"] = config.limit
        resolved["max_length"] = config.max_length or default_max_length(model)
    elif config.suite == "ruler":
        resolved["tasks"] = list(config.tasks or ruler.TASKS)
        resolved["limit"] = config.limit or DEFAULT_RULER_SAMPLES
        resolved["context_tokens"] = config.context_tokens
    else:
        resolved["needle_lengths"] = list(config.needle_lengths)
        resolved["needle_depths"] = [float(d) for d in config.needle_depths]
        resolved["needle_digits"] = config.needle_digits
        resolved["limit"] = config.limit or 1
    resolved["samples"] = {
        "count": len(samples),
        "sha256": _sha256_json(
            [[s.id, list(s.input_ids), s.question_start, s.max_new_tokens, sorted(s.extra_stop_ids)] for s in samples]
        ),
    }
    return json.loads(json.dumps(resolved))  # tuples -> lists, as read back from the file


def _versions() -> dict[str, str]:
    import kvpress
    import transformers

    from ripplekv import __version__

    return {
        "ripplekv": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "kvpress": getattr(kvpress, "__version__", "unknown"),
    }


def _check_or_write_config(out: Path, resolved: dict[str, Any], sources: dict[str, Any]) -> None:
    path = out / CONFIG_FILE
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigMismatchError(f"{path} is not valid JSON ({err}): cannot resume into {out}") from None
        if not isinstance(saved, dict) or saved.get("format") != CONFIG_FORMAT:
            raise ConfigMismatchError(f"{path} is not a ripplekv eval config: cannot resume into {out}")
        previous = saved.get("config", {})
        if previous != resolved:
            keys = sorted(k for k in previous.keys() | resolved.keys() if previous.get(k) != resolved.get(k))
            details = "; ".join(
                f"{k}: saved {json.dumps(previous.get(k))[:80]} vs now {json.dumps(resolved.get(k))[:80]}" for k in keys
            )
            raise ConfigMismatchError(
                f"refusing to resume into {out}: its {CONFIG_FILE} holds another configuration ({details}). "
                "Use another --out folder, or delete this one to start over."
            )
        return
    if (out / RESULTS_FILE).exists():
        raise ConfigMismatchError(f"{out} holds {RESULTS_FILE} but no {CONFIG_FILE}: cannot tell what it ran")
    write_json_atomic(
        path,
        {
            "format": CONFIG_FORMAT,
            "config": resolved,
            "sources": sources,
            "versions": _versions(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        },
    )


# --------------------------------------------------------------------------------------------- results log


def row_key(row: Mapping[str, Any]) -> RowKey:
    return (str(row["sample_id"]), str(row["method"]), float(row["budget"]))


class ResultsLog:
    """An append-only JSONL file of result rows, durable row by row, repaired on open."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def read(self, repair: bool = False) -> list[dict[str, Any]]:
        """All complete rows, in file order.

        A last line without its newline, or one that does not parse as a row, is an interrupted write: with
        ``repair`` it is cut off the file (its configuration will be redone). A bad line before the last one is
        an error (the file was edited or damaged).
        """
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        rows: list[dict[str, Any]] = []
        offset = 0
        while offset < len(data):
            newline = data.find(b"\n", offset)
            end = len(data) if newline < 0 else newline + 1
            line = data[offset:end]
            if not line.strip():
                offset = end
                continue
            row = None
            if newline >= 0:
                try:
                    row = json.loads(line)
                except ValueError:  # JSONDecodeError and UnicodeDecodeError
                    row = None
            if isinstance(row, dict) and all(key in row for key in ROW_KEYS):
                rows.append(row)
                offset = end
                continue
            if data[end:].strip():
                raise ValueError(f"{self.path}: corrupt result row at byte {offset} (not an interrupted last write)")
            if repair:
                with self.path.open("r+b") as handle:
                    handle.truncate(offset)
                    handle.flush()
                    os.fsync(handle.fileno())
            break
        return rows

    def append(self, row: Mapping[str, Any]) -> None:
        line = json.dumps(row, allow_nan=False, ensure_ascii=False) + "\n"
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


# ------------------------------------------------------------------------------------------------- running


def _kept_tokens(model: PreTrainedModel, lengths: list[int]) -> list[int]:
    """Tokens kept per layer; for head-wise masking presses (AdaKV) the masked keys are not counted."""
    layers = model.model.layers if hasattr(model.model, "layers") else model.model.language_model.layers
    kept = list(lengths)
    for i, layer in enumerate(layers):
        masked = getattr(layer.self_attn, "masked_key_indices", None)
        if masked is not None and i < len(kept):
            kv_heads = model.config.get_text_config().num_key_value_heads or model.config.num_attention_heads
            kept[i] = lengths[i] - round(len(masked[0]) / kv_heads)
    return kept


def _clear_module_state(model: PreTrainedModel) -> None:
    """Drop head-wise key masks a fallback press (AdaKV) left on the attention modules."""
    for module in model.modules():
        if getattr(module, "masked_key_indices", None) is not None:
            module.masked_key_indices = None


class _Runner:
    def __init__(
        self,
        config: EvalConfig,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        presses: dict[tuple[str, float], BasePress],
    ) -> None:
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.presses = presses
        self.eos = eos_ids(model, tokenizer)
        self.device = next(model.parameters()).device
        self.not_derivable: set[str] = set()
        self.n_layers = model.config.get_text_config().num_hidden_layers

    def _ids(self, ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor([list(ids)], dtype=torch.long)

    def _finish(
        self,
        sample: EvalSample,
        method: str,
        budget: float,
        state: Prefill,
        kept: list[int],
        compressed_tokens: int,
        started: float,
        prefill_seconds: float,
        shared: bool,
    ) -> dict[str, Any]:
        tail = sample.input_ids[sample.question_start :] if self.config.protocol == "query-agnostic" else ()
        if tail:
            state = extend(self.model, state, self._ids(tail))
        tokens = greedy_decode(self.model, state, sample.max_new_tokens, self.eos | sample.extra_stop_ids)
        prediction = self.tokenizer.decode(tokens, skip_special_tokens=True)
        seconds = time.perf_counter() - started
        return {
            "sample_id": sample.id,
            "task": sample.task,
            "method": method,
            "budget": budget,
            "prediction": prediction,
            "score": float(sample.score(prediction)),
            "prompt_tokens": len(sample.input_ids),
            "compressed_tokens": compressed_tokens,
            "kept_tokens": kept,
            "kv_fraction": round(sum(kept) / (self.n_layers * compressed_tokens), 6),
            "generated_tokens": len(tokens),
            "seconds": round(seconds, 4),
            "prefill_seconds": round(prefill_seconds, 4),
            "shared_prefill": shared,
            "meta": dict(sample.meta),
        }

    def run_sample(self, sample: EvalSample, pending: list[tuple[str, float]]) -> Iterator[dict[str, Any]]:
        """Rows of the ``pending`` configurations of ``sample``: derived from one recorded prefill where the press
        allows it, then the others, each with its own prefill."""
        prefix = sample.input_ids
        if self.config.protocol == "query-agnostic":
            prefix = sample.input_ids[: sample.question_start]
        if not prefix:
            raise ValueError(f"sample {sample.id}: the context part of the prompt is empty")
        fallback = [(m, b) for m, b in pending if m in self.not_derivable]
        derivable = [(m, b) for m, b in pending if m not in self.not_derivable]
        if derivable:
            record = record_prefill(self.model, self._ids(prefix))
            for method, budget in derivable:
                row = self._derived_row(sample, method, budget, record, len(prefix))
                if row is None:
                    self.not_derivable.add(method)
                    fallback.append((method, budget))
                else:
                    yield row
            del record  # the full cache and hidden states: freed before any fallback prefill
        for method, budget in fallback:
            yield self._own_prefill_row(sample, method, budget, prefix)

    def _derived_row(
        self, sample: EvalSample, method: str, budget: float, record: PrefillRecord, compressed_tokens: int
    ) -> dict[str, Any] | None:
        """The row of one configuration with its cache derived from ``record``; None if the press cannot be."""
        started = time.perf_counter()
        try:
            cache = compress_recorded(record, self.presses[method, budget])
        except NotDerivableError:
            return None
        except ValueError as err:
            raise ValueError(f"sample {sample.id}, {method} at budget {budget}: {err}") from err
        state = Prefill(cache, record.next_logits, record.prompt_tokens, record.seconds)
        kept = layer_lengths(cache)
        return self._finish(sample, method, budget, state, kept, compressed_tokens, started, record.seconds, True)

    def _own_prefill_row(self, sample: EvalSample, method: str, budget: float, prefix: Sequence[int]) -> dict[str, Any]:
        """The row of one configuration prefilled with its own press (presses that cannot be derived)."""
        started = time.perf_counter()
        try:
            state = prefill(self.model, self._ids(prefix), self.presses[method, budget])
            kept = _kept_tokens(self.model, layer_lengths(state.cache))
            return self._finish(sample, method, budget, state, kept, len(prefix), started, state.seconds, False)
        finally:
            _clear_module_state(self.model)


def _build_presses(
    config: EvalConfig, profile: SensitivityProfile | None, model: PreTrainedModel
) -> dict[tuple[str, float], BasePress]:
    presses = {}
    for method, budget in config.configurations:
        press = make_press(method, budget=budget, profile=profile, window_size=config.window_size)
        press.post_init_from_model(model)  # checks a profile against the model before any work
        presses[method, budget] = press
    return presses


def run_eval(
    config: EvalConfig,
    out: str | os.PathLike[str],
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
) -> EvalSummary:
    """Run (or resume) the evaluation ``config`` into the folder ``out``; see the module docstring.

    ``model`` and ``tokenizer`` are loaded from ``config.model`` unless given. ``on_row`` is called with every
    row right after it was written.
    """
    from tqdm import tqdm

    start = time.perf_counter()
    needs_profile = any(m.startswith("ripplekv") for m in config.methods)
    if needs_profile and config.profile is None:
        raise ValueError("the ripplekv methods need --profile (make one with `ripplekv profile`)")
    profile = SensitivityProfile.load(config.profile) if config.profile is not None and needs_profile else None
    if model is None or tokenizer is None:
        from ripplekv.models import load_model

        model, tokenizer = load_model(config.model, dtype=config.dtype, device=config.device)
    enable_varlen_attention(model)
    presses = _build_presses(config, profile, model)
    samples = build_samples(config, tokenizer, model)
    resolved = resolve_config(config, model, samples, profile)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sources = {"model": config.model, "data_dir": config.data_dir, "profile": config.profile}
    _check_or_write_config(out, resolved, sources)
    log = ResultsLog(out / RESULTS_FILE)
    done = {row_key(row) for row in log.read(repair=True)}

    configurations = config.configurations
    planned = [(sample, [(m, b) for m, b in configurations if (sample.id, m, b) not in done]) for sample in samples]
    total = len(samples) * len(configurations)
    already = total - sum(len(pending) for _, pending in planned)
    runner = _Runner(config, model, tokenizer, presses)
    written = 0
    with tqdm(total=total, initial=already, desc=f"eval {config.suite}", unit="run", disable=not progress) as bar:
        for sample, pending in planned:
            if not pending:
                continue
            bar.set_postfix_str(sample.id[-40:], refresh=False)
            for row in runner.run_sample(sample, pending):
                log.append(row)
                written += 1
                bar.update(1)
                if on_row is not None:
                    on_row(row)
    rows = len(log.read())
    return EvalSummary(
        out=out,
        rows=rows,
        new_rows=written,
        samples=len(samples),
        configurations=len(configurations),
        seconds=time.perf_counter() - start,
    )
