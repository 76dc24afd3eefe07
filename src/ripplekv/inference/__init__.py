"""Inference over compressed caches: prefill with a press, greedy decoding (:mod:`~ripplekv.inference.generate`),
teacher forcing (:mod:`~ripplekv.inference.teacher_forcing`), a profile's r and gamma
(:mod:`~ripplekv.inference.setting`).

The names below resolve on first use (PEP 562): importing this package imports none of its modules.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it
_EXPORTS = {
    name: "ripplekv.inference.generate"
    for name in (
        "PROTOCOLS",
        "GenerationResult",
        "Prefill",
        "cache_forward",
        "extend",
        "generate_answer",
        "greedy_decode",
        "kept_tokens",
        "prefill",
    )
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ripplekv.inference' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
