"""Identity of a loaded model: its architecture (:func:`model_identity`) and weights (:func:`weights_fingerprint`)."""

from __future__ import annotations

import hashlib
import json
import weakref
from typing import Any

import torch
from transformers import PreTrainedModel

__all__ = ["cached_weights_fingerprint", "model_identity", "weights_fingerprint"]

_ARCH_FIELDS = (
    "model_type",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "vocab_size",
)


def model_identity(model: PreTrainedModel) -> dict[str, Any]:
    """Identity of a model's architecture, used to check that a profile belongs to a model.

    Returns ``name_or_path``, the architecture fields ``model_type``, ``num_hidden_layers``,
    ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``hidden_size``, ``vocab_size``, and
    ``config_hash``: the sha256 of the canonical JSON of the architecture fields only (not of paths or
    dtype), so two models with the same architecture hash equally wherever they were loaded from.
    """
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"model_identity needs a transformers model with a config, got {type(model).__name__}")
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden_size = getattr(text_config, "hidden_size", None)
    num_heads = getattr(text_config, "num_attention_heads", None)
    num_layers = getattr(text_config, "num_hidden_layers", None)
    if not isinstance(hidden_size, int) or not isinstance(num_heads, int) or not isinstance(num_layers, int):
        raise ValueError(
            f"model config ({getattr(config, 'model_type', '?')}) lacks integer hidden_size / "
            "num_attention_heads / num_hidden_layers"
        )
    num_kv_heads = getattr(text_config, "num_key_value_heads", None) or num_heads
    head_dim = getattr(text_config, "head_dim", None) or hidden_size // num_heads
    arch: dict[str, Any] = {
        "model_type": str(getattr(text_config, "model_type", "") or getattr(config, "model_type", "")),
        "num_hidden_layers": int(num_layers),
        "num_attention_heads": int(num_heads),
        "num_key_value_heads": int(num_kv_heads),
        "head_dim": int(head_dim),
        "hidden_size": int(hidden_size),
        "vocab_size": int(getattr(text_config, "vocab_size", 0) or 0),
    }
    canonical = json.dumps({key: arch[key] for key in _ARCH_FIELDS}, sort_keys=True, separators=(",", ":"))
    name = getattr(config, "name_or_path", None) or getattr(config, "_name_or_path", "") or ""
    return {
        "name_or_path": str(name),
        **arch,
        "config_hash": hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
    }


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A digest of a model's weights: ``sha256:`` and the sha256 of every parameter's name, dtype, shape and bytes.

    :func:`model_identity` says which architecture a model has; this says which weights (and in which dtype)
    it holds, so results measured on one set of weights are not mixed with another's (e.g. a profiling
    checkpoint resumed with a fine-tuned copy of the same architecture). Parameters are hashed in
    ``named_parameters()`` order (tied weights once); buffers are derived from the config and left out.
    Hashes the raw bytes (no conversion; its cost is in docs/results.md, "Profiling cost"); parameters on an
    accelerator are copied to the CPU one at a time.

    Args:
        model: any torch module (a transformers model in practice).

    Returns:
        ``"sha256:<64 hex digits>"``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"weights_fingerprint needs a torch module, got {type(model).__name__}")
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        tensor = parameter.detach().contiguous()
        header = f"{name}|{str(tensor.dtype).removeprefix('torch.')}|{','.join(map(str, tensor.shape))}\n"
        digest.update(header.encode("utf-8"))
        if tensor.numel():
            digest.update(tensor.cpu().reshape(-1).view(torch.uint8).numpy())
    return "sha256:" + digest.hexdigest()


_FINGERPRINTS: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()


def cached_weights_fingerprint(model: torch.nn.Module) -> str:
    """:func:`weights_fingerprint` of ``model``, computed once per model object.

    Checking a profile against its model happens at every prefill with a press; hashing the weights each time
    would cost a full read of them. The digest is kept for as long as the model object lives (a weak
    reference), so weights changed in place afterwards (training) are not seen: call :func:`weights_fingerprint`
    for a fresh digest.

    Args:
        model: any torch module.
    """
    found = _FINGERPRINTS.get(model)
    if found is None:
        found = _FINGERPRINTS[model] = weights_fingerprint(model)
    return found
