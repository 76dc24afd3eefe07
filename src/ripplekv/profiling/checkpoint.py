"""Per-sample checkpoints of a profiling run: a JSON-lines file of the run's key (model, weights, calibration,
settings), then one line per finished sample. A file of another key is overwritten with a warning naming the fields
that differ; a :func:`~ripplekv.locking.writer_lock` stops a second run on the same file."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ripplekv.locking import writer_lock

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampleScores:
    """Per-layer KL (nats) and local scores of one calibration sample, averaged over positions and draws."""

    kl: tuple[float, ...]
    local: tuple[float, ...]
    context_tokens: int
    continuation_tokens: int


def _read(path: Path, key: Mapping[str, Any]) -> dict[int, SampleScores]:
    lines = path.read_text().splitlines()
    try:
        header = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        header = None
    if header != key:
        if isinstance(header, dict):
            diff = sorted(k for k in set(header) | set(key) if header.get(k) != key.get(k))
            logger.warning("checkpoint %s was made by another run (%s differ): starting over", path, ", ".join(diff))
        elif lines:
            logger.warning("checkpoint %s has no readable header: starting over", path)
        return {}
    done: dict[int, SampleScores] = {}
    for line in lines[1:]:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break  # a line cut by an interruption: that sample is redone
        done[row["sample"]] = SampleScores(
            tuple(row["kl"]), tuple(row["local"]), row["context_tokens"], row["continuation_tokens"]
        )
    return done


class Checkpoint:
    """Per-sample results in a JSON-lines file whose first line is the run's ``key`` (WriterBusyError when another
    run holds it)."""

    def __init__(self, path: Path, key: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.key = dict(key)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = writer_lock(self.path.with_name(f".{self.path.name}.lock"), str(self.path))
        try:
            self.done: dict[int, SampleScores] = _read(self.path, self.key) if self.path.exists() else {}
            if not self.done:
                self.path.write_text(json.dumps(self.key) + "\n")
        except BaseException:
            self.lock.release()
            raise

    def close(self) -> None:
        """Release the checkpoint's lock (its file stays for a later run to resume from)."""
        self.lock.release()

    def add(self, index: int, scores: SampleScores) -> None:
        """Append one finished sample (flushed and synced, so an interruption loses at most this line)."""
        self.done[index] = scores
        with self.path.open("a") as f:
            f.write(json.dumps({"sample": index, **asdict(scores)}) + "\n")
            f.flush()
            os.fsync(f.fileno())
