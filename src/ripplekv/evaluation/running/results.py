"""The files of an evaluation folder: ``config.json`` (what ran, compared on resume) and ``results.jsonl`` (rows).

``results.jsonl`` is append-only, one JSON row per (sample, method, budget), flushed and fsynced as soon as it is
written; :class:`ResultsLog` reads it back, cutting off a last line an interruption left incomplete.
:func:`open_results` and :func:`run_pending` are the resume-and-run loop every runner (``eval``, ``analyze``,
``tune``) shares: open the folder, skip the rows written, append each new row as soon as it exists.

One writer per folder: :func:`open_results` takes an exclusive lock on ``OUT/.lock`` (``flock``, released when the
run's :class:`RunFolder` is closed or its process ends, however it ends), so a second run into the same folder, which
would repair the first's half-written row away and append rows twice, stops at once with
:class:`RunFolderBusyError` naming the process that holds it. Where ``fcntl`` is missing (Windows) nothing is locked.
"""

from __future__ import annotations

import hashlib
import json
import os
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ripplekv.allocation.budgets import budget_value
from ripplekv.evaluation.sample import row_configuration
from ripplekv.profiling.profile import write_json_atomic

__all__ = [
    "CONFIG_FILE",
    "CONFIG_FORMAT",
    "RESULTS_FILE",
    "ROW_KEYS",
    "ConfigMismatchError",
    "LOCK_FILE",
    "FolderLock",
    "ResultsLog",
    "RowKey",
    "RunFolder",
    "RunFolderBusyError",
    "check_or_write_config",
    "complete_samples",
    "budgets_of",
    "open_results",
    "resume_state",
    "row_key",
    "run_pending",
    "sha256_json",
]

CONFIG_FILE = "config.json"
RESULTS_FILE = "results.jsonl"
CONFIG_FORMAT = "ripplekv-eval/1"
ROW_KEYS = ("sample_id", "method", "budget")

RowKey = tuple[str, str, float]


def complete_samples(
    rows: Sequence[Mapping[str, Any]], configurations: Iterable[tuple[str, float]]
) -> tuple[list[Mapping[str, Any]], int]:
    """The rows of the samples that hold a row for every one of ``configurations``, and how many samples do not.

    A run that is still going, or was interrupted, has samples with only some configurations; comparing means
    over different sample sets would compare different prompts, so statistics use complete samples only.

    Args:
        rows: result rows (``results.jsonl``).
        configurations: the (configuration name, budget) pairs every sample of the run gets.
    """
    expected = {(str(m), float(b)) for m, b in configurations}
    seen: dict[str, set[tuple[str, float]]] = {}
    for row in rows:
        seen.setdefault(str(row["sample_id"]), set()).add((row_configuration(row), float(row["budget"])))
    complete = {sample for sample, have in seen.items() if expected <= have}
    return [row for row in rows if str(row["sample_id"]) in complete], len(seen) - len(complete)


class ConfigMismatchError(ValueError):
    """The output folder holds a run of another configuration."""


class RunFolderBusyError(ValueError):
    """Another process is writing into the output folder."""


LOCK_FILE = ".lock"
"""The file of a run folder whose ``flock`` its one writer holds (it records that writer's pid)."""


class FolderLock:
    """An exclusive, non-blocking ``flock`` on ``folder/.lock``, held until :meth:`release` (or the process ends).

    Args:
        folder: the run folder (it exists).

    Raises:
        RunFolderBusyError: another open lock (another process, or another run in this one) holds it.
    """

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK_FILE
        self._fd: int | None = None
        try:
            import fcntl
        except ImportError:  # no flock (Windows): nothing is locked
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise RunFolderBusyError(
                f"{folder} is being written by another run (pid {holder}): wait for it to finish, or use another --out"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Give the lock up (closing its file releases the ``flock``); a second call does nothing."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.release()


def sha256_json(data: Any) -> str:
    """SHA-256 of ``data`` as canonical JSON (sorted keys, no spaces).

    Args:
        data: any JSON-serialisable value.
    """
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def row_key(row: Mapping[str, Any]) -> RowKey:
    """``(sample_id, configuration, budget)`` of a row: what identifies it on resume (the configuration is its
    method under its scorer, :func:`~ripplekv.evaluation.sample.row_configuration`).

    Args:
        row: a result row.
    """
    return (str(row["sample_id"]), row_configuration(row), float(row["budget"]))


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
    """Whether ``resolved`` is ``previous`` with more values in some of the ``extendable`` list keys.

    Every other key must be equal; an extendable key's saved values must all be among the new ones (a key absent
    from a configuration holds the default that ``extendable`` gives for it).

    Args:
        previous: the saved resolved configuration.
        resolved: the new one.
        extendable: key -> its value when absent (``{"scorers": ["snapkv"], ...}``).
    """
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
    """Write ``out/config.json``, or check that the one there holds the same resolved configuration.

    Args:
        out: the evaluation folder.
        resolved: the resolved configuration (compared key by key on resume).
        sources: where the model, data and profile came from (recorded, not compared).
        rows_file: the name of the folder's rows file (a folder holding one but no config is refused).
        extendable: list keys a resumed run may extend (key -> its value when absent; see :func:`extends`): a
            configuration that only adds values to them (another method, budget or scorer over the same samples,
            model and settings) resumes, keeps every row, and its ``config.json`` is rewritten to the extended
            configuration, the previous one kept under ``extended_from``. Only for runs whose row identity covers
            those keys (``eval``'s rows: sample, method under scorer, budget).

    Raises:
        ConfigMismatchError: the folder holds another configuration (the message names the keys that differ), an
            unreadable config, or results without a config.
    """
    path = out / CONFIG_FILE
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigMismatchError(f"{path} is not valid JSON ({err}): cannot resume into {out}") from None
        if not isinstance(saved, dict) or saved.get("format") != CONFIG_FORMAT:
            raise ConfigMismatchError(f"{path} is not a ripplekv eval config: cannot resume into {out}")
        previous = saved.get("config", {})
        if previous != resolved and extendable and extends(previous, resolved, extendable):
            history = [*saved.get("extended_from", []), {"config": previous, "created": saved.get("created")}]
            saved.update(config=resolved, sources=sources, versions=_versions(), extended_from=history)
            saved["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            write_json_atomic(path, saved)
            return
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
    if (out / rows_file).exists():
        raise ConfigMismatchError(f"{out} holds {rows_file} but no {CONFIG_FILE}: cannot tell what it ran")
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


class ResultsLog:
    """An append-only JSONL file of result rows, durable row by row, repaired on open.

    Args:
        path: the ``results.jsonl`` file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def read(self, repair: bool = False) -> list[dict[str, Any]]:
        """All complete rows, in file order.

        A last line without its newline, or one that does not parse as a row, is an interrupted write: with
        ``repair`` it is cut off the file (its configuration will be redone). A bad line before the last one is
        an error (the file was edited or damaged).

        Args:
            repair: cut an interrupted last line off the file.
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
        """Append ``row`` as one line, flushed and fsynced.

        Args:
            row: the result row (JSON-serialisable, no NaN).
        """
        line = json.dumps(row, allow_nan=False, ensure_ascii=False) + "\n"
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


def resume_state(
    rows: Sequence[Mapping[str, Any]], answers_from: str | None = "full"
) -> tuple[set[RowKey], dict[str, list[int]]]:
    """What a run resumes from: the keys of the rows written, and each sample's stored reference answer.

    Args:
        rows: the rows of the folder's rows file.
        answers_from: the method whose rows hold the reference answer (the full cache's, ``"full"``, in ``eval``);
            ``None`` takes it from any row that holds ``answer_ids`` (``analyze`` and ``tune`` store the full
            cache's answer on every row).
    """
    done = {row_key(row) for row in rows}
    answers: dict[str, list[int]] = {}
    for row in rows:
        ids = row.get("answer_ids")
        if (answers_from is None or row["method"] == answers_from) and isinstance(ids, list) and ids:
            answers[str(row["sample_id"])] = [int(t) for t in ids]
    return done, answers


@dataclass(frozen=True)
class RunFolder:
    """A run folder ready to append rows to, its writer's lock held (see the module docstring).

    Use it as a context manager (``with open_results(...) as folder:``) or call :meth:`close` when the run is done.

    Args:
        out: the folder.
        log: its rows file.
        done: the keys of the rows already written (:func:`run_pending` adds the rows it writes).
        answers: each sample's stored reference answer (token ids), see :func:`resume_state`.
        lock: the folder's writer lock.
    """

    out: Path
    log: ResultsLog
    done: set[RowKey]
    answers: dict[str, list[int]]
    lock: FolderLock | None = None

    def close(self) -> None:
        """Release the folder's lock (the rows stay readable through :attr:`log`)."""
        if self.lock is not None:
            self.lock.release()

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: types.TracebackType | None,
    ) -> None:
        self.close()


def open_results(
    out: str | os.PathLike[str],
    resolved: dict[str, Any],
    sources: dict[str, Any],
    rows_file: str = RESULTS_FILE,
    answers_from: str | None = "full",
    extendable: Mapping[str, Any] | None = None,
) -> RunFolder:
    """Create ``out`` (or check that its ``config.json`` holds ``resolved``), repair its rows file and read what a
    run resumes from.

    Args:
        out: the output folder.
        resolved: the resolved configuration (compared on resume).
        sources: where the model, data and profiles came from (recorded, not compared).
        rows_file: the rows file's name in ``out``.
        answers_from: see :func:`resume_state`.
        extendable: list keys a resumed run may extend (see :func:`check_or_write_config`).

    Raises:
        ConfigMismatchError: ``out`` holds another run (see :func:`check_or_write_config`).
        RunFolderBusyError: another run is writing into ``out``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lock = FolderLock(out)  # before the config is checked or the rows file repaired: one writer at a time
    try:
        check_or_write_config(out, resolved, sources, rows_file, extendable)
        log = ResultsLog(out / rows_file)
        done, answers = resume_state(log.read(repair=True), answers_from)
    except BaseException:
        lock.release()
        raise
    return RunFolder(out=out, log=log, done=done, answers=answers, lock=lock)


RunSample = Callable[[Any, list[tuple[str, float]], "list[int] | None"], Iterable[dict[str, Any]]]


def budgets_of(
    run_budgets: Callable[[Any, list[float], list[int] | None], Iterable[dict[str, Any]]],
) -> RunSample:
    """Adapt a runner of one method at several budgets (``analyze``'s and ``tune``'s ``run_sample(sample, budgets,
    answer)``) to :func:`run_pending`'s (method, budget) configurations.

    Args:
        run_budgets: yields the rows of one sample's pending budgets.
    """

    def run_sample(sample: Any, pending: list[tuple[str, float]], answer: list[int] | None) -> Iterable[dict[str, Any]]:
        return run_budgets(sample, [budget for _, budget in pending], answer)

    return run_sample


def run_pending(
    samples: Sequence[Any],
    configurations: Sequence[tuple[str, float]],
    folder: RunFolder,
    run_sample: RunSample,
    desc: str,
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> int:
    """Run every (sample, configuration) the folder lacks, one sample at a time, appending each row as it comes.

    A sample whose configurations are all written is skipped; otherwise ``run_sample(sample, pending, answer)``
    gets the configurations it still lacks, in ``configurations`` order, and the stored reference answer (or
    ``None``). Returns the number of rows written.

    Args:
        samples: the run's samples (each with an ``id``).
        configurations: the (method, budget) pairs every sample gets.
        folder: the open run folder (:func:`open_results`).
        run_sample: yields the rows of one sample's pending configurations.
        desc: the progress bar's label.
        progress: show a progress bar.
        on_row: called with every row right after it was written.
    """
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
