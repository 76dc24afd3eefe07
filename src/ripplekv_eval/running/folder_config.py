"""A run folder's ``config.json``: what ran, written once and compared on every resume (or extended).

Re-exported by :mod:`ripplekv_eval.running.results`, the folder's rows and run loop.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ripplekv.profiling.profile import write_json_atomic

__all__ = [
    "CONFIG_FILE",
    "CONFIG_FORMAT",
    "RESULTS_FILE",
    "ConfigMismatchError",
    "check_or_write_config",
    "extends",
    "sha256_json",
]

CONFIG_FILE = "config.json"
RESULTS_FILE = "results.jsonl"
CONFIG_FORMAT = "ripplekv-eval/1"


class ConfigMismatchError(ValueError):
    """The output folder holds a run of another configuration."""


def sha256_json(data: Any) -> str:
    """SHA-256 of ``data`` as canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _versions() -> dict[str, str]:
    import kvpress
    import torch
    import transformers

    from ripplekv.version import __version__

    return {
        "ripplekv": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "kvpress": getattr(kvpress, "__version__", "unknown"),
    }


def extends(previous: Mapping[str, Any], resolved: Mapping[str, Any], extendable: Mapping[str, Any]) -> bool:
    """Whether ``resolved`` is ``previous`` with more values in some of the ``extendable`` list keys.

    Every other key must be equal; an extendable key's saved values must all be among the new ones. ``extendable``
    maps each key to its value when absent (``{"scorers": ["snapkv"], ...}``).
    """
    fixed = (previous.keys() | resolved.keys()) - extendable.keys()
    if any(previous.get(k) != resolved.get(k) for k in fixed):
        return False
    for key, default in extendable.items():
        old, new = previous.get(key, default), resolved.get(key, default)
        if not isinstance(old, list) or not isinstance(new, list) or any(value not in new for value in old):
            return False
    return True


def check_or_write_config(
    out: Path,
    resolved: dict[str, Any],
    sources: dict[str, Any],
    rows_file: str = RESULTS_FILE,
    extendable: Mapping[str, Any] | None = None,
) -> None:
    """Write ``out/config.json``, or check that the one there holds the same resolved configuration.

    Args:
        resolved: compared key by key on resume.
        sources: where the model, data and profile came from (recorded, not compared).
        rows_file: the folder's rows file (a folder holding one but no config is refused).
        extendable: list keys a resumed run may extend (see :func:`extends`): a configuration that only adds values
            to them (a method, budget or scorer over the same samples, model and settings) resumes and keeps every
            row; ``config.json`` is rewritten to it, the previous one kept under ``extended_from``. Only for runs
            whose row identity covers those keys (``eval``'s rows: sample, method under scorer, budget).

    Raises:
        ConfigMismatchError: the folder holds another configuration (the message names the keys that differ), an
            unreadable config, or results without a config.
    """
    path = out / CONFIG_FILE
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigMismatchError(f"{path} is not valid JSON ({err}): cannot resume into {out}") from None
        if not isinstance(saved, dict) or saved.get("format") != CONFIG_FORMAT:
            raise ConfigMismatchError(f"{path} is not a ripplekv eval config: cannot resume into {out}")
        previous = saved.get("config", {})
        if previous != resolved and extendable and extends(previous, resolved, extendable):
            history = [*saved.get("extended_from", []), {"config": previous, "created": saved.get("created")}]
            saved.update(config=resolved, sources=sources, versions=_versions(), extended_from=history)
            saved["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            write_json_atomic(path, saved)
            return
        if previous != resolved:
            keys = sorted(k for k in previous.keys() | resolved.keys() if previous.get(k) != resolved.get(k))
            details = "; ".join(
                f"{k}: saved {json.dumps(previous.get(k))[:80]} vs now {json.dumps(resolved.get(k))[:80]}" for k in keys
            )
            raise ConfigMismatchError(
                f"refusing to resume into {out}: its {CONFIG_FILE} holds another configuration ({details}). "
                "Use another --out folder, or delete this one to start over."
            )
        return
    if (out / rows_file).exists():
        raise ConfigMismatchError(f"{out} holds {rows_file} but no {CONFIG_FILE}: cannot tell what it ran")
    write_json_atomic(
        path,
        {
            "format": CONFIG_FORMAT,
            "config": resolved,
            "sources": sources,
            "versions": _versions(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        },
    )
