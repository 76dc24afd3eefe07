"""KV-cache accounting for ``benchmarks/efficiency.py``: the bytes a compressed cache holds, KV bytes from shapes.

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

INDEX_BYTES = 3 * 8
"""Bytes kvpress's AdaKV stores per masked (head, token) entry: three int64 indices (batch, head, position)."""


@dataclass(frozen=True)
class KVShape:
    """The KV-cache shape of a decoder-only model: everything its cache size depends on besides length and dtype."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim"):
            if (
                isinstance(getattr(self, name), bool)
                or not isinstance(getattr(self, name), int)
                or getattr(self, name) < 1
            ):
                raise ValueError(f"KVShape.{name} must be an integer >= 1, got {getattr(self, name)!r}")

    def cache_bytes(self, tokens: int, element_bytes: int = 2) -> int:
        """Key and value bytes of an uncompressed cache of ``tokens`` tokens (``element_bytes``: 2 for bf16)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * element_bytes * tokens


def computed_kv_table(
    shapes: Iterable[KVShape], lengths: Sequence[int], budgets: Sequence[float], element_bytes: int = 2
) -> list[dict[str, Any]]:
    """KV-cache bytes computed (not measured) per model, context length and kept fraction: every compressed method
    keeps ``layers * int(tokens * budget)`` tokens per head (kvpress's arithmetic); evicting presses hold just those,
    AdaKV the full cache plus :data:`INDEX_BYTES` per masked (head, token) entry."""
    rows = []
    for shape in shapes:
        for tokens in lengths:
            full = shape.cache_bytes(tokens, element_bytes)
            for budget in budgets:
                kept = BudgetSpec(budget).average(tokens)
                rows.append(
                    {
                        "model": shape.name,
                        "tokens": int(tokens),
                        "budget": float(budget),
                        "kept_tokens": kept,
                        "full_bytes": full,
                        "evicting_bytes": shape.cache_bytes(kept, element_bytes),
                        "adakv_bytes": full,
                        "adakv_index_bytes": shape.layers * shape.kv_heads * (tokens - kept) * INDEX_BYTES,
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
    """What a compressed prompt cache costs, measured: its key/value bytes, its attention state (AdaKV's masked-key
    indices), the full cache's bytes, and the tokens per layer attention may still use."""

    prompt_tokens: int
    layers: int
    held_bytes: int
    state_bytes: int
    full_bytes: int
    kept_tokens: tuple[int, ...]

    @property
    def held_fraction(self) -> float:
        """Held key/value bytes over the full cache's (1.0 for kvpress's AdaKV, which frees nothing)."""
        return self.held_bytes / self.full_bytes

    @property
    def kept_fraction(self) -> float:
        """Tokens attention may use over the full cache's: the effective budget."""
        return sum(self.kept_tokens) / (self.layers * self.prompt_tokens)


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
    return None if device is None or torch.device(device).type != "cuda" else torch.device(device)


def synchronize(device: torch.device | str | None) -> None:
    """Wait until a CUDA ``device`` has run every queued kernel (before starting and stopping a timer)."""
    cuda = _cuda(device)
    if cuda is not None:
        torch.cuda.synchronize(cuda)


def reset_peak_allocated(device: torch.device | str | None) -> int | None:
    """Start a new peak-memory interval on a CUDA device; the bytes allocated now (None off CUDA)."""
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
