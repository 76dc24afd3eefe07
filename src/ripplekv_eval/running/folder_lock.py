"""One writer per run folder: :class:`FolderLock`, a :class:`~ripplekv.locking.WriterLock` on ``OUT/.lock``.

See :mod:`ripplekv_eval.running.results`: :func:`~ripplekv_eval.running.results.open_results` takes it
before it checks the folder's config or repairs its rows file.
"""

from __future__ import annotations

from pathlib import Path

from ripplekv.locking import WriterBusyError, WriterLock

__all__ = ["LOCK_FILE", "FolderLock", "RunFolderBusyError"]

LOCK_FILE = ".lock"
"""The file of a run folder whose ``flock`` its one writer holds (it records that writer's pid)."""

RunFolderBusyError = WriterBusyError
"""Another run is writing into the output folder (the lock's error, under the name the run loop documents)."""


class FolderLock(WriterLock):
    """The writer lock of a run folder (``folder/.lock``).

    Args:
        folder: the run folder (it exists).

    Raises:
        RunFolderBusyError: another run holds it.
    """

    def __init__(self, folder: Path) -> None:
        super().__init__(Path(folder) / LOCK_FILE, str(folder))
