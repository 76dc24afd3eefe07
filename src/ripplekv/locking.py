"""One writer per output: an exclusive, non-blocking ``flock`` on a lock file next to what a run writes.

A second run writing the same output (an evaluation folder, a profile's checkpoint) would cut the first's
half-written last line off as an interruption, start the checkpoint over, or append its rows twice.
:class:`WriterLock` makes it stop at once instead, naming the process that holds the output. The lock is the
kernel's (``flock``): it goes with the file's last descriptor, so a killed process leaves the output free. Where
``fcntl`` is missing (Windows) nothing is locked. A leaf module: it imports nothing of the package.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["WriterBusyError", "WriterLock"]


class WriterBusyError(ValueError):
    """Another run is writing the same output."""


class WriterLock:
    """An exclusive, non-blocking ``flock`` on ``path``, held until :meth:`release` (or the process ends).

    Args:
        path: the lock file (created; it records the holder's pid).
        what: the output it guards, for the error message.

    Raises:
        WriterBusyError: another open lock (another process, or another run in this one) holds it.
    """

    def __init__(self, path: Path, what: str) -> None:
        self.path = Path(path)
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
            raise WriterBusyError(
                f"{what} is being written by another run (pid {holder}): wait for it to finish, or write elsewhere"
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
