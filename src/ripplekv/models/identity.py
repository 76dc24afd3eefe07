"""Identity of a loaded model: its architecture (:func:`model_identity`) and weights (:func:`weights_fingerprint`)."""

from __future__ import annotations

import hashlib
import json
import weakref
from typing import Any

import torch
from transformers import PreTrainedModel


def model_identity(model: PreTrainedModel) -> dict[str, Any]:
    """``name_or_path``, the architecture fields and ``config_hash``, the sha256 of those fields only (not paths or
    dtype), so one architecture hashes equally wherever it was loaded from."""
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
    canonical = json.dumps(arch, sort_keys=True, separators=(",", ":"))
    name = getattr(config, "name_or_path", None) or getattr(config, "_name_or_path", "") or ""
    return {
        "name_or_path": str(name),
        **arch,
        "config_hash": hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
    }


def weights_fingerprint(model: torch.nn.Module) -> str:
    """``"sha256:<hex>"`` over every parameter's name, dtype, shape and raw bytes, in ``named_parameters()`` order:
    which weights (and dtype) a model holds, so one fine-tune's results are not mixed with another's."""
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
    """:func:`weights_fingerprint` of ``model``, computed once per model object (profiles are checked at every
    prefill); weights changed in place afterwards are not seen."""
    found = _FINGERPRINTS.get(model)
    if found is None:
        found = _FINGERPRINTS[model] = weights_fingerprint(model)
    return found
