"""Efficiency accounting: the bytes a compressed cache really holds, and KV bytes computed from model configurations.

The **held** bytes are the key and value tensors kept in memory: evicting presses (SnapKV, PyramidKV, RippleKV)
hold only their kept tokens, kvpress's AdaKV holds all (held fraction 1.0) plus index tensors of the masked
entries. The **effective** kept fraction is the (head, token) entries attention may still use; at one budget every
method keeps the same total. ``benchmarks/efficiency.py`` reports both. On CUDA, :func:`synchronize` belongs around
every wall-clock timing, and the peak readers use the allocator (the RSS says nothing of device memory).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from ripplekv.allocation.budget import BudgetSpec
from ripplekv.inference.generate import Prefill, full_cache_bytes, kept_tokens
from ripplekv.models.cache import cache_bytes
from ripplekv.models.headwise import headwise_of
from ripplekv.validation import is_integer

__all__ = [
    "INDEX_BYTES",
    "CacheFootprint",
    "KVShape",
    "cache_footprint",
    "computed_kv_table",
    "peak_allocated",
    "reset_peak_allocated",
    "state_bytes",
    "synchronize",
]

INDEX_BYTES = 3 * 8
"""Bytes kvpress's AdaKV stores per masked (head, token) entry: three int64 indices (batch, head, position)."""


@dataclass(frozen=True)
class KVShape:
    """The KV-cache shape of a decoder-only model: everything its cache size depends on besides length and dtype.

    Attributes:
        layers: ``num_hidden_layers``.
        kv_heads: ``num_key_value_heads``.
        head_dim: ``head_dim``, else ``hidden_size / num_attention_heads``.
    """

    name: str
    layers: int
    kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"KVShape.name must be a non-empty string, got {self.name!r}")
        for field_name in ("layers", "kv_heads", "head_dim"):
            value = getattr(self, field_name)
            if not is_integer(value) or value < 1:
                raise ValueError(f"KVShape.{field_name} must be an integer >= 1, got {value!r}")

    @classmethod
    def from_config(cls, config: Any, name: str | None = None) -> KVShape:
        """The shape of a transformers config (its text config for multimodal models); ``name`` defaults to
        ``config.name_or_path`` or the model type.
        """
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        label = name or getattr(config, "name_or_path", "") or getattr(config, "model_type", "model")
        return cls(label, int(text.num_hidden_layers), int(kv_heads), int(head_dim))

    def bytes_per_token(self, element_bytes: int = 2) -> int:
        """Key and value bytes of one token in every layer (``element_bytes``: 2 for bf16, 4 for float32)."""
        if not is_integer(element_bytes) or element_bytes < 1:
            raise ValueError(f"element_bytes must be an integer >= 1, got {element_bytes!r}")
        return 2 * self.layers * self.kv_heads * self.head_dim * int(element_bytes)

    def cache_bytes(self, tokens: int, element_bytes: int = 2) -> int:
        """Bytes of an uncompressed cache of ``tokens`` tokens (``>= 0``)."""
        if not is_integer(tokens) or tokens < 0:
            raise ValueError(f"tokens must be an integer >= 0, got {tokens!r}")
        return int(tokens) * self.bytes_per_token(element_bytes)


def computed_kv_table(
    shapes: Iterable[KVShape], lengths: Sequence[int], budgets: Sequence[float], element_bytes: int = 2
) -> list[dict[str, Any]]:
    """KV-cache bytes computed (not measured) for each model, context length and budget (kept fraction).

    Every compressed method keeps ``layers * int(tokens * budget)`` tokens per head (kvpress's arithmetic); evicting
    presses hold just those, kvpress's AdaKV the full cache plus :data:`INDEX_BYTES` per masked (head, token) entry.

    Returns:
        One dict per (model, length, budget): ``model``, ``tokens``, ``budget``, ``kept_tokens`` (per layer and head),
        ``full_bytes``, ``evicting_bytes``, ``adakv_bytes``, ``adakv_index_bytes``, ``kept_fraction``.
    """
    rows = []
    for shape in shapes:
        for tokens in lengths:
            full = shape.cache_bytes(tokens, element_bytes)
            for budget in budgets:
                kept = BudgetSpec(budget).average(tokens)
                masked_entries = shape.layers * shape.kv_heads * (tokens - kept)
                rows.append(
                    {
                        "model": shape.name,
                        "tokens": int(tokens),
                        "budget": float(budget),
                        "kept_tokens": kept,
                        "full_bytes": full,
                        "evicting_bytes": shape.cache_bytes(kept, element_bytes),
                        "adakv_bytes": full,
                        "adakv_index_bytes": masked_entries * INDEX_BYTES,
                        "kept_fraction": kept / tokens,
                    }
                )
    return rows


def state_bytes(cache: DynamicCache) -> int:
    """Bytes of the head-wise masks a cache's layers hold (AdaKV's masked-key indices), each storage once."""
    seen: dict[tuple[int, int], int] = {}
    for layer in cache.layers:
        mask = headwise_of(layer)
        for tensor in () if mask is None else mask.indices:
            storage = tensor.untyped_storage()
            seen[(storage.data_ptr(), storage.nbytes())] = storage.nbytes()
    return sum(seen.values())


@dataclass(frozen=True)
class CacheFootprint:
    """What a compressed prompt cache costs, measured.

    Attributes:
        held_bytes: bytes of the key and value tensors the cache holds.
        state_bytes: bytes of the attention state kept with it (AdaKV's masked-key indices; 0 for evicting presses).
        full_bytes: bytes the uncompressed cache of the prompt takes.
        kept_tokens: tokens per layer attention may still use (masked entries not counted).
    """

    prompt_tokens: int
    layers: int
    held_bytes: int
    state_bytes: int
    full_bytes: int
    kept_tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "layers", "full_bytes"):
            if not is_integer(getattr(self, name)) or getattr(self, name) < 1:
                raise ValueError(f"CacheFootprint.{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if len(self.kept_tokens) != self.layers:
            raise ValueError(f"{len(self.kept_tokens)} kept-token counts for {self.layers} layers")

    @property
    def held_fraction(self) -> float:
        """Held key/value bytes over the full cache's (1.0 for kvpress's AdaKV, which frees nothing)."""
        return self.held_bytes / self.full_bytes

    @property
    def kept_fraction(self) -> float:
        """Tokens attention may use over the full cache's: the effective budget."""
        return sum(self.kept_tokens) / (self.layers * self.prompt_tokens)

    @property
    def total_fraction(self) -> float:
        """Held bytes plus attention-state bytes over the full cache's."""
        return (self.held_bytes + self.state_bytes) / self.full_bytes


def cache_footprint(model: PreTrainedModel, state: Prefill) -> CacheFootprint:
    """Measure the cache of a prefilled (compressed) prompt, before any token is decoded."""
    kept = tuple(kept_tokens(state))
    return CacheFootprint(
        prompt_tokens=state.prompt_tokens,
        layers=len(kept),
        held_bytes=cache_bytes(state.cache),
        state_bytes=state_bytes(state.cache),
        full_bytes=full_cache_bytes(model, state.prompt_tokens),
        kept_tokens=kept,
    )


def _cuda(device: torch.device | str | None) -> torch.device | None:
    if device is None:
        return None
    device = torch.device(device)
    return device if device.type == "cuda" else None


def synchronize(device: torch.device | str | None) -> None:
    """Wait until a CUDA ``device`` has run every queued kernel (nothing elsewhere): kernels run asynchronously, so
    call this before starting and before stopping a timer.
    """
    cuda = _cuda(device)
    if cuda is not None:
        torch.cuda.synchronize(cuda)


def reset_peak_allocated(device: torch.device | str | None) -> int | None:
    """Start a new peak-memory interval on a CUDA device; the bytes allocated now (None off CUDA).

    :func:`peak_allocated` then reads the peak of what ran in between (reserved but unallocated memory not counted).
    """
    cuda = _cuda(device)
    if cuda is None:
        return None
    synchronize(cuda)
    torch.cuda.reset_peak_memory_stats(cuda)
    return int(torch.cuda.memory_allocated(cuda))


def peak_allocated(device: torch.device | str | None) -> int | None:
    """Peak bytes allocated on a CUDA device since :func:`reset_peak_allocated` (None off CUDA)."""
    cuda = _cuda(device)
    if cuda is None:
        return None
    synchronize(cuda)
    return int(torch.cuda.max_memory_allocated(cuda))
