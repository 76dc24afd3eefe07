"""One writer per output (an evaluation folder, a profile's checkpoint): a second run stops at once instead of
cutting the first's half-written line or appending rows twice. ``filelock``'s OS lock goes with the process, so a
killed run leaves the output free."""

from __future__ import annotations

from pathlib import Path

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
