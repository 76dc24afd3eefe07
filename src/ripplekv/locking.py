"""One writer per output: a non-blocking ``filelock.FileLock`` on a lock file next to what a run writes.

A second run writing the same output (an evaluation folder, a profile's checkpoint) would cut the first's
half-written last line off as an interruption, start the checkpoint over, or append its rows twice.
:func:`writer_lock` makes it stop at once instead. The lock is the operating system's (``flock``, or Windows'
``msvcrt`` locking): it goes with the process, so a killed run leaves the output free. A leaf module: it imports
nothing of the package.
"""

from __future__ import annotations

from pathlib import Path

from filelock import FileLock, Timeout

__all__ = ["WriterBusyError", "writer_lock"]


class WriterBusyError(ValueError):
    """Another run is writing the same output."""


def writer_lock(path: Path, what: str) -> FileLock:
    """The held lock on ``path`` (created), until its ``release()`` (or the process ends).

    Args:
        path: the lock file.
        what: the output it guards, for the error message.

    Raises:
        WriterBusyError: another lock (another process, or another run in this one) holds it.
    """
    lock = FileLock(path, timeout=0, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        raise WriterBusyError(
            f"{what} is being written by another run: wait for it to finish, or write elsewhere"
        ) from None
    return lock
