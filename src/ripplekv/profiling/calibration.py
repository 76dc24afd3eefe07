"""Calibration text for KV-cache sensitivity profiling: essay windows, JSONL or LongBench records.

A sample is a ``context`` (prefilled) and a ``continuation`` (teacher-forced over the cache, so its loss measures
what compression destroys).
"""

from __future__ import annotations

import hashlib
import json
import random
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ripplekv.profiling.haystack import (
    ESSAY_PACKAGE,
    ESSAY_PACKAGE_VERSION,
    TextTokenizer,
    encode,
    essays,
    token_stream,
)
from ripplekv.validation import check_int

_JSONL_FIELDS = ("context", "continuation")
_LONGBENCH_FIELDS = ("input", "context", "answers")


@dataclass(frozen=True)
class CalibrationSample:
    context: str  # prefilled into the KV cache
    continuation: str  # teacher-forced over the cache (question+answer, or the text that follows)
    source: str = ""  # e.g. "pg-essays:<file>@<token offset>" or "jsonl:<path>:<line>"
    question: str = ""  # appended to the context for the model's own answer; not in the set's sha256

    def __post_init__(self) -> None:
        for name in ("context", "continuation"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"CalibrationSample.{name} must be a non-empty string, got {value!r:.60}")
        for name in ("source", "question"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"CalibrationSample.{name} must be a string, got {type(getattr(self, name)).__name__}")


@dataclass(frozen=True)
class CalibrationSet:
    samples: tuple[CalibrationSample, ...]
    description: str

    def __post_init__(self) -> None:
        if not isinstance(self.samples, tuple) or not self.samples:
            raise ValueError("CalibrationSet.samples must be a non-empty tuple of CalibrationSample")
        for sample in self.samples:
            if not isinstance(sample, CalibrationSample):
                raise ValueError(f"CalibrationSet.samples holds a {type(sample).__name__}, not a CalibrationSample")

    def sha256(self, fields: tuple[str, ...] = ("context", "continuation")) -> str:
        """Hex digest over the samples' ``fields``, in order, each prefixed by its UTF-8 length (8 bytes)."""
        digest = hashlib.sha256()
        for sample in self.samples:
            for name in fields:
                data = getattr(sample, name).encode("utf-8")
                digest.update(len(data).to_bytes(8, "little"))
                digest.update(data)
        return digest.hexdigest()

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[CalibrationSample]:
        return iter(self.samples)


def _check_n_samples(n_samples: int | None) -> None:
    if n_samples is not None:
        check_int("n_samples", n_samples)


def _take(samples: list[CalibrationSample], n_samples: int | None, where: str) -> tuple[CalibrationSample, ...]:
    if not samples:
        raise ValueError(f"no calibration records in {where}")
    if n_samples is not None and len(samples) < n_samples:
        warnings.warn(
            f"{where} holds {len(samples)} calibration records, fewer than the {n_samples} requested",
            stacklevel=3,
        )
    return tuple(samples if n_samples is None else samples[:n_samples])


def default_calibration(
    tokenizer: TextTokenizer,
    n_samples: int = 8,
    context_tokens: int = 2048,
    continuation_tokens: int = 32,
    seed: int = 0,
) -> CalibrationSet:
    """Windows of the Paul Graham essays: ``context_tokens`` tokens of context and the ``continuation_tokens`` after.

    Sample ``i`` starts at a seeded offset in the ``i``-th essay of a seeded shuffle and runs on into the next
    essays (re-tokenized, a decoded context has ``context_tokens`` up to a token or two at the cuts). Raises
    EssayCorpusMissingError without the essay package, ValueError beyond the whole corpus.
    """
    check_int("n_samples", n_samples)
    check_int("context_tokens", context_tokens)
    check_int("continuation_tokens", continuation_tokens)
    corpus = essays()
    rng = random.Random(seed)
    order = list(range(len(corpus)))
    rng.shuffle(order)
    needed = context_tokens + continuation_tokens
    first_lengths: dict[int, int] = {}
    samples: list[CalibrationSample] = []
    for i in range(n_samples):
        start = order[i % len(order)]
        name, first_text = corpus[start]
        if start not in first_lengths:
            first_lengths[start] = len(encode(tokenizer, first_text))
        first_len = first_lengths[start]
        stream_texts = [corpus[order[(i + j) % len(order)]][1] for j in range(len(order))]
        _, ids = token_stream(tokenizer, stream_texts, needed + first_len)
        if len(ids) < needed:
            raise ValueError(
                f"context_tokens + continuation_tokens = {needed} exceeds the whole essay corpus "
                f"({len(ids)} tokens with this tokenizer)"
            )
        offset = rng.randint(0, max(0, min(first_len - 1, len(ids) - needed)))
        context = tokenizer.decode(ids[offset : offset + context_tokens])
        continuation = tokenizer.decode(ids[offset + context_tokens : offset + needed])
        samples.append(CalibrationSample(context, continuation, source=f"pg-essays:{name}@{offset}"))
    return CalibrationSet(
        samples=tuple(samples),
        description=(
            f"{ESSAY_PACKAGE}=={ESSAY_PACKAGE_VERSION} Paul Graham essays: {n_samples} windows of "
            f"{context_tokens} context + {continuation_tokens} continuation tokens, seed {seed}"
        ),
    )


def _iter_json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for each non-blank line; ValueError naming file and line on bad JSON."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read calibration file {path}: {exc}") from exc
    with handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            yield lineno, record


def _string_field(record: dict[str, Any], field: str, where: str, allow_empty: bool = False) -> str:
    if field not in record:
        raise ValueError(f"{where}: missing field '{field}'")
    value = record[field]
    if not isinstance(value, str) or (not value and not allow_empty):
        raise ValueError(f"{where}: field '{field}' must be a non-empty string, got {value!r:.60}")
    return value


def load_jsonl_calibration(path: str | Path, n_samples: int | None = None) -> CalibrationSet:
    """Records ``{"context": str, "continuation": str[, "question": str]}``, one per line, the first ``n_samples``
    (None: all; a warning when fewer)."""
    _check_n_samples(n_samples)
    path = Path(path)
    samples: list[CalibrationSample] = []
    for lineno, record in _iter_json_lines(path):
        where = f"{path}:{lineno}"
        context = _string_field(record, "context", where)
        continuation = _string_field(record, "continuation", where)
        question = _string_field(record, "question", where, allow_empty=True) if "question" in record else ""
        samples.append(CalibrationSample(context, continuation, source=f"jsonl:{path}:{lineno}", question=question))
        if n_samples is not None and len(samples) >= n_samples:
            break
    chosen = _take(samples, n_samples, str(path))
    return CalibrationSet(samples=chosen, description=f"JSONL {path}: {len(chosen)} samples")


def _longbench_sample(record: dict[str, Any], where: str, source: str) -> CalibrationSample:
    question = _string_field(record, "input", where, allow_empty=True)
    context = _string_field(record, "context", where)
    answers = record.get("answers")
    if "answers" not in record:
        raise ValueError(f"{where}: missing field 'answers'")
    if not isinstance(answers, list) or not answers or not isinstance(answers[0], str) or not answers[0]:
        raise ValueError(f"{where}: field 'answers' must be a non-empty list of strings, got {answers!r:.60}")
    prompt = "\n\nQuestion: " + question + "\nAnswer:"
    return CalibrationSample(context, prompt + " " + answers[0], source=source, question=prompt)


def _longbench_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.glob("*.jsonl") if p.is_file())
        if not files:
            raise ValueError(f"no *.jsonl files in LongBench directory {path}")
        return files
    if not path.is_file():
        raise ValueError(f"LongBench path {path} does not exist")
    return [path]


def load_longbench_calibration(path_or_dir: str | Path, n_samples: int | None = None) -> CalibrationSet:
    """LongBench records as samples: ``context`` and ``"\\n\\nQuestion: <input>\\nAnswer: <answers[0]>"``
    (``question`` without the answer); a directory's ``*.jsonl`` files interleaved round-robin, so the first
    ``n_samples`` cover the tasks evenly."""
    _check_n_samples(n_samples)
    root = Path(path_or_dir)
    files = _longbench_files(root)
    per_file: list[list[CalibrationSample]] = []
    for file in files:
        per_file.append(
            [
                _longbench_sample(record, f"{file}:{lineno}", source=f"longbench:{file.stem}:{lineno}")
                for lineno, record in _iter_json_lines(file)
            ]
        )
    samples: list[CalibrationSample] = []
    for rank in range(max((len(s) for s in per_file), default=0)):
        samples.extend(s[rank] for s in per_file if rank < len(s))
    chosen = _take(samples, n_samples, str(root))
    task_names = ", ".join(f.stem for f in files)
    return CalibrationSet(samples=chosen, description=f"LongBench {root} ({task_names}): {len(chosen)} samples")


def load_calibration(
    spec: str | None,
    tokenizer: TextTokenizer,
    n_samples: int | None = 8,
    context_tokens: int = 2048,
    continuation_tokens: int = 32,
    seed: int = 0,
) -> CalibrationSet:
    """Calibration set from a CLI spec: ``None``/``"default"`` (essays), a JSONL file, or LongBench file(s), the
    kind read from the first record (for files only ``n_samples`` applies; None: all)."""
    if spec is None or spec == "default":
        if n_samples is None:
            raise ValueError("n_samples is required for the default calibration set")
        return default_calibration(
            tokenizer,
            n_samples=n_samples,
            context_tokens=context_tokens,
            continuation_tokens=continuation_tokens,
            seed=seed,
        )
    path = Path(spec)
    expected = (
        f"expected 'default', a JSONL file with fields {list(_JSONL_FIELDS)}, or a LongBench JSONL file or "
        f"directory with fields {list(_LONGBENCH_FIELDS)}"
    )
    if path.is_dir():
        files = sorted(p for p in path.glob("*.jsonl") if p.is_file())
        if not files:
            raise ValueError(f"calibration directory {path} holds no *.jsonl files; {expected}")
        probe = files[0]
    elif path.is_file():
        probe = path
    else:
        raise ValueError(f"calibration spec {spec!r} is not 'default' and no such file or directory; {expected}")
    first = next((record for _, record in _iter_json_lines(probe)), None)
    if first is None:
        raise ValueError(f"{probe} holds no records; {expected}")
    if path.is_file() and all(field in first for field in _JSONL_FIELDS):
        return load_jsonl_calibration(path, n_samples=n_samples)
    if all(field in first for field in _LONGBENCH_FIELDS):
        return load_longbench_calibration(path, n_samples=n_samples)
    raise ValueError(f"{probe}: first record has fields {sorted(first)}; {expected}")
