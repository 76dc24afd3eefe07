"""Model loading (local directories, hub ids, GGUF files, aliases), model identity, caches and attention.

The names below resolve on first use (PEP 562): importing this package imports none of its modules.
"""

from __future__ import annotations

from ripplekv.lazy import lazy_exports

# public name -> the module that defines it
_EXPORTS = {
    "DEFAULT_MODEL": "ripplekv.models.sources",
    "SMOLLM2_PIP_COMMAND": "ripplekv.models.sources",
    "cache_root": "ripplekv.models.sources",
    "ensure_converted": "ripplekv.models.loading",
    "load_model": "ripplekv.models.loading",
    "model_identity": "ripplekv.models.identity",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
