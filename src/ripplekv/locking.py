"""One writer per output (an evaluation folder, a profile's checkpoint): a second run stops at once instead of
cutting the first's half-written line or appending rows twice. ``filelock``'s OS lock goes with the process, so a
killed run leaves the output free. A file written whole (:func:`atomic_write`) is never seen half-written."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from filelock import FileLock, Timeout


class WriterBusyError(ValueError):
    """Another run is writing the same output."""


def writer_lock(path: Path, what: str) -> FileLock:
    """The held lock on the lock file ``path`` (created) until its ``release()``; WriterBusyError, naming the output
    ``what``, when another run (in any process) holds it."""
    lock = FileLock(path, timeout=0, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        raise WriterBusyError(
            f"{what} is being written by another run: wait for it to finish, or write elsewhere"
        ) from None
    return lock


@contextmanager
def atomic_write(path: Path, binary: bool = False) -> Iterator[IO[Any]]:
    """A new file to write ``path``'s content into (its folder created): a hidden temporary beside it
    (``.<name>.<pid>-<hex>.tmp``), flushed, synced and renamed onto ``path`` when the block ends, removed when it
    raises, so ``path`` holds the old content or the new, never part of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    try:
        with tmp.open("xb" if binary else "x") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
