"""The files of an evaluation folder: ``config.json`` (what ran, compared on resume) and ``results.jsonl`` (rows).

``results.jsonl`` is append-only, one JSON row per (sample, method, budget), flushed and fsynced as soon as it is
written; :class:`ResultsLog` reads it back, cutting off a last line an interruption left incomplete.
:func:`open_results` and :func:`run_pending` are the resume-and-run loop every runner (``eval``, ``analyze``,
``tune``) shares: open the folder, skip the rows written, append each new row as soon as it exists. The folder's
``config.json`` is :mod:`ripplekv_eval.running.folder_config`'s (its names are re-exported here).

One writer per folder: :func:`open_results` takes an exclusive lock on ``OUT/.lock`` (``filelock``, released when
the run's :class:`RunFolder` is closed or its process ends, however it ends), so a second run into the same folder,
which would repair the first's half-written row away and append rows twice, stops at once with
:class:`RunFolderBusyError`.
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from ripplekv.allocation.budget import budget_value
from ripplekv_eval.running.folder_config import (
    CONFIG_FILE,
    CONFIG_FORMAT,
    RESULTS_FILE,
    ConfigMismatchError,
    check_or_write_config,
    extends,
    sha256_json,
)
from ripplekv_eval.running.folder_lock import LOCK_FILE, RunFolderBusyError, folder_lock
from ripplekv_eval.sample import row_configuration

__all__ = [
    "CONFIG_FILE",
    "CONFIG_FORMAT",
    "LOCK_FILE",
    "RESULTS_FILE",
    "ROW_KEYS",
    "ConfigMismatchError",
    "ResultsLog",
    "RowKey",
    "RunFolder",
    "RunFolderBusyError",
    "check_or_write_config",
    "complete_samples",
    "extends",
    "budgets_of",
    "open_results",
    "resume_state",
    "row_key",
    "run_pending",
    "sha256_json",
]

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


def row_key(row: Mapping[str, Any]) -> RowKey:
    """``(sample_id, configuration, budget)`` of a row: what identifies it on resume (the configuration is its
    method under its scorer, :func:`~ripplekv_eval.sample.row_configuration`).

    Args:
        row: a result row.
    """
    return (str(row["sample_id"]), row_configuration(row), float(row["budget"]))


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
    lock: FileLock | None = None

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
    lock = folder_lock(out)  # before the config is checked or the rows file repaired: one writer at a time
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
