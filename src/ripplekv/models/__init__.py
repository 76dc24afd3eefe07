"""Model loading (local directories, hub ids, GGUF files, aliases) and model identity."""

from ripplekv.models.loading import (
    CHATML_TEMPLATE,
    DEFAULT_MODEL,
    MODEL_ALIASES,
    SMOLLM2_PACKAGE,
    SMOLLM2_PIP_COMMAND,
    cache_root,
    convert_gguf,
    ensure_converted,
    gguf_cache_key,
    load_model,
    model_identity,
    resolve_device,
    resolve_dtype,
    resolve_model_source,
    smollm2_gguf_path,
)

__all__ = [
    "CHATML_TEMPLATE",
    "DEFAULT_MODEL",
    "MODEL_ALIASES",
    "SMOLLM2_PACKAGE",
    "SMOLLM2_PIP_COMMAND",
    "cache_root",
    "convert_gguf",
    "ensure_converted",
    "gguf_cache_key",
    "load_model",
    "model_identity",
    "resolve_device",
    "resolve_dtype",
    "resolve_model_source",
    "smollm2_gguf_path",
]
