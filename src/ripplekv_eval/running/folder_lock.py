"""One writer per run folder: :func:`folder_lock`, a :func:`~ripplekv.locking.writer_lock` on ``OUT/.lock``.

See :mod:`ripplekv_eval.running.results`: :func:`~ripplekv_eval.running.results.open_results` takes it
before it checks the folder's config or repairs its rows file.
"""

from __future__ import annotations

from pathlib import Path

from filelock import FileLock

from ripplekv.locking import WriterBusyError, writer_lock

__all__ = ["LOCK_FILE", "RunFolderBusyError", "folder_lock"]

LOCK_FILE = ".lock"
"""The lock file of a run folder, held by its one writer."""

RunFolderBusyError = WriterBusyError
"""Another run is writing into the output folder (the lock's error, under the name the run loop documents)."""


def folder_lock(folder: Path) -> FileLock:
    """The held writer lock of a run folder (``folder/.lock``).

    Args:
        folder: the run folder (it exists).

    Raises:
        RunFolderBusyError: another run holds it.
    """
    return writer_lock(Path(folder) / LOCK_FILE, str(folder))
