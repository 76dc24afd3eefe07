"""Model loading (local directories, hub ids, GGUF files, aliases) and model identity."""

from ripplekv.models.identity import model_identity
from ripplekv.models.loading import ensure_converted, load_model
from ripplekv.models.sources import DEFAULT_MODEL, SMOLLM2_PIP_COMMAND, cache_root

__all__ = ["DEFAULT_MODEL", "SMOLLM2_PIP_COMMAND", "cache_root", "ensure_converted", "load_model", "model_identity"]
