"""One writer per run folder: an exclusive ``flock`` on ``OUT/.lock`` (see :mod:`ripplekv.evaluation.running.results`).

A second run into a folder another run is writing would repair the first's half-written last row away and append
rows twice; :class:`FolderLock` makes it stop at once instead, naming the process that holds the folder. The lock is
the kernel's (``flock``): it goes with the file's last descriptor, so a killed process leaves the folder free. Where
``fcntl`` is missing (Windows) nothing is locked.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["LOCK_FILE", "FolderLock", "RunFolderBusyError"]


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
