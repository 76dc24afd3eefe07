"""An evaluation folder: ``config.json`` (what ran, compared on resume or extended) and an append-only rows file
(:class:`ResultsLog`); :func:`open_results` and :func:`run_pending` are the resume-and-run loop of ``eval``,
``analyze`` and ``tune``."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock

from ripplekv.locking import writer_lock
from ripplekv.profiling.profile import write_json_atomic
from ripplekv_eval.running.budget_rows import budget_value
from ripplekv_eval.sample import row_configuration

CONFIG_FILE = "config.json"
RESULTS_FILE = "results.jsonl"
CONFIG_FORMAT = "ripplekv-eval/1"
LOCK_FILE = ".lock"
ROW_KEYS = ("sample_id", "method", "budget")

RowKey = tuple[str, str, float]


@dataclass(frozen=True)
class RunResult:
    """What one run call (``eval``, ``analyze``, ``tune``) did: ``rows`` in its rows file at the end, ``new_rows``
    written by it, wall ``seconds``; ``summary`` and ``files`` written (analyze, tune)."""

    out: Path
    rows: int
    new_rows: int
    samples: int
    seconds: float
    configurations: int = 0
    summary: dict[str, Any] = field(default_factory=dict)
    files: tuple[Path, ...] = ()


class ConfigMismatchError(ValueError):
    """The output folder holds a run of another configuration."""


def sha256_json(data: Any) -> str:
    """SHA-256 of ``data`` as canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _versions() -> dict[str, str]:
    import kvpress
    import torch
    import transformers

    from ripplekv.version import __version__

    return {
        "ripplekv": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "kvpress": getattr(kvpress, "__version__", "unknown"),
    }


def extends(previous: Mapping[str, Any], resolved: Mapping[str, Any], extendable: Mapping[str, Any]) -> bool:
    """Whether ``resolved`` is ``previous`` with more values in some ``extendable`` list keys (key -> value when
    absent), every other key equal."""
    fixed = (previous.keys() | resolved.keys()) - extendable.keys()
    if any(previous.get(k) != resolved.get(k) for k in fixed):
        return False
    for key, default in extendable.items():
        old, new = previous.get(key, default), resolved.get(key, default)
        if not isinstance(old, list) or not isinstance(new, list) or any(value not in new for value in old):
            return False
    return True


def check_or_write_config(
    out: Path,
    resolved: dict[str, Any],
    sources: dict[str, Any],
    rows_file: str = RESULTS_FILE,
    extendable: Mapping[str, Any] | None = None,
) -> None:
    """Write ``out/config.json``, or check that the one there holds ``resolved`` (``sources`` are recorded, not
    compared). A configuration that only adds values to ``extendable`` keys (:func:`extends`; for runs whose row
    identity covers them) rewrites it, keeping the previous one under ``extended_from``; ConfigMismatchError (naming
    the keys that differ) otherwise."""
    path = out / CONFIG_FILE
    record: dict[str, Any] = {"format": CONFIG_FORMAT, "config": resolved, "sources": sources}
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigMismatchError(f"{path} is not valid JSON ({err}): cannot resume into {out}") from None
        if not isinstance(saved, dict) or saved.get("format") != CONFIG_FORMAT:
            raise ConfigMismatchError(f"{path} is not a ripplekv eval config: cannot resume into {out}")
        previous = saved.get("config", {})
        if previous == resolved:
            return
        if not (extendable and extends(previous, resolved, extendable)):
            keys = sorted(k for k in previous.keys() | resolved.keys() if previous.get(k) != resolved.get(k))
            details = "; ".join(
                f"{k}: saved {json.dumps(previous.get(k))[:80]} vs now {json.dumps(resolved.get(k))[:80]}" for k in keys
            )
            raise ConfigMismatchError(
                f"refusing to resume into {out}: its {CONFIG_FILE} holds another configuration ({details}). "
                "Use another --out folder, or delete this one to start over."
            )
        history = [*saved.get("extended_from", []), {"config": previous, "created": saved.get("created")}]
        record["extended_from"] = history
    elif (out / rows_file).exists():
        raise ConfigMismatchError(f"{out} holds {rows_file} but no {CONFIG_FILE}: cannot tell what it ran")
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_json_atomic(path, {**record, "versions": _versions(), "created": created})


def complete_samples(
    rows: Sequence[Mapping[str, Any]], configurations: Iterable[tuple[str, float]]
) -> tuple[list[Mapping[str, Any]], int]:
    """The rows of the samples that hold a row for every one of ``configurations`` (statistics compare the same
    prompts), and how many samples do not."""
    expected = {(str(m), float(b)) for m, b in configurations}
    seen: dict[str, set[tuple[str, float]]] = {}
    for row in rows:
        seen.setdefault(str(row["sample_id"]), set()).add((row_configuration(row), float(row["budget"])))
    complete = {sample for sample, have in seen.items() if expected <= have}
    return [row for row in rows if str(row["sample_id"]) in complete], len(seen) - len(complete)


def row_key(row: Mapping[str, Any]) -> RowKey:
    """``(sample_id, configuration, budget)``: what identifies a row on resume."""
    return (str(row["sample_id"]), row_configuration(row), float(row["budget"]))


class ResultsLog:
    """An append-only JSONL file of result rows, durable row by row, repaired on open."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def read(self, repair: bool = False) -> list[dict[str, Any]]:
        """All complete rows, in file order. A last line without its newline, or not a row, is an interrupted write
        (``repair`` cuts it off the file); a bad line before the last one is an error."""
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
        """Append ``row`` as one line, flushed and fsynced."""
        line = json.dumps(row, allow_nan=False, ensure_ascii=False) + "\n"
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


def resume_state(
    rows: Sequence[Mapping[str, Any]], answers_from: str | None = "full"
) -> tuple[set[RowKey], dict[str, list[int]]]:
    """The keys of the rows written, and each sample's reference answer from the rows of ``answers_from`` (None:
    any row holding ``answer_ids``)."""
    done = {row_key(row) for row in rows}
    answers: dict[str, list[int]] = {}
    for row in rows:
        ids = row.get("answer_ids")
        if (answers_from is None or row["method"] == answers_from) and isinstance(ids, list) and ids:
            answers[str(row["sample_id"])] = [int(t) for t in ids]
    return done, answers


@dataclass(frozen=True)
class RunFolder:
    """A run folder ready to append rows to, its writer's lock held until :meth:`close` (or the ``with`` block ends);
    ``done`` holds the keys of the rows written, ``answers`` each sample's reference answer."""

    out: Path
    log: ResultsLog
    done: set[RowKey]
    answers: dict[str, list[int]]
    lock: FileLock

    def close(self) -> None:
        self.lock.release()

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_results(
    out: str | os.PathLike[str],
    resolved: dict[str, Any],
    sources: dict[str, Any],
    rows_file: str = RESULTS_FILE,
    answers_from: str | None = "full",
    extendable: Mapping[str, Any] | None = None,
) -> RunFolder:
    """Lock ``out`` (created; WriterBusyError while another run writes into it), check or write its config
    (:func:`check_or_write_config`), repair its rows file and read what the run resumes from."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lock = writer_lock(out / LOCK_FILE, str(out))  # before the config is checked or the rows file repaired
    try:
        check_or_write_config(out, resolved, sources, rows_file, extendable)
        log = ResultsLog(out / rows_file)
        done, answers = resume_state(log.read(repair=True), answers_from)
    except BaseException:
        lock.release()
        raise
    return RunFolder(out=out, log=log, done=done, answers=answers, lock=lock)


RunSample = Callable[[Any, list[tuple[str, float]], "list[int] | None"], Iterable[dict[str, Any]]]


def run_pending(
    samples: Sequence[Any],
    configurations: Sequence[tuple[str, float]],
    folder: RunFolder,
    run_sample: RunSample,
    desc: str,
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> int:
    """Run every (sample, configuration) the folder lacks: ``run_sample(sample, pending, answer)`` gets a sample's
    missing configurations in order and its stored reference answer (or None); each row is appended as it comes.
    Returns the number of rows written."""
    from tqdm import tqdm

    planned = [
        (sample, [(m, budget_value(b)) for m, b in configurations if (sample.id, m, float(b)) not in folder.done])
        for sample in samples
    ]
    total = len(samples) * len(configurations)
    already = total - sum(len(pending) for _, pending in planned)
    written = 0
    with tqdm(total=total, initial=already, desc=desc, unit="run", disable=not progress) as bar:
        for sample, pending in planned:
            if not pending:
                continue
            bar.set_postfix_str(sample.id[-40:], refresh=False)
            for row in run_sample(sample, pending, folder.answers.get(sample.id)):
                folder.log.append(row)
                folder.done.add(row_key(row))
                written += 1
                bar.update(1)
                if on_row is not None:
                    on_row(row)
    return written
