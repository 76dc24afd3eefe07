"""Model loading (local directories, hub ids, GGUF files, aliases), model identity, caches and attention.

The names below resolve on first use (PEP 562): importing this package imports none of its modules.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it
_EXPORTS = {
    "DEFAULT_MODEL": "ripplekv.models.sources",
    "SMOLLM2_PIP_COMMAND": "ripplekv.models.sources",
    "cache_root": "ripplekv.models.sources",
    "ensure_converted": "ripplekv.models.loading",
    "load_model": "ripplekv.models.loading",
    "model_identity": "ripplekv.models.identity",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ripplekv.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
