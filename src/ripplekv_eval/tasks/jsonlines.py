"""Reading JSON-lines data files with errors that name the file and line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def iter_json_lines(path: Path) -> Iterator[tuple[str, int, Any]]:
    """``(where, line_number, value)`` for every non-blank line of ``path``; ``where`` is ``"path:line"``.

    Raises:
        ValueError: on a line that is not valid JSON (the message names the file, line and column).
    """
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_number}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: invalid JSON ({error.msg} at column {error.colno})") from error
            yield where, line_number, raw


def string_list(value: Any, field: str, where: str) -> tuple[str, ...]:
    """``value`` as a tuple of strings; ValueError naming ``field`` and ``where`` unless it is a list of strings."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{where}: field {field!r} must be a list of strings, got {value!r:.80}")
    return tuple(value)
