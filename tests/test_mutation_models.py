"""Relations that kill mutants of issue 26's model modules (padded batches, the shared prefix, the chunked prefill)
left alive by its third mutation round.

Each test names the seeded bug it was watched failing under.
"""

from __future__ import annotations

import re
from dataclasses import FrozenInstanceError
from typing import Any

import pytest
import torch

import ripplekv.models.shared_prefix as shared_prefix_module
from ripplekv.models.chunked_prefill import DEFAULT_PREFILL_CHUNK, chunk_bounds
from ripplekv.models.shared_prefix import SharedPrefix, shared_prefix_attention
from ripplekv_eval.fastpath.padded import KeyValidity


def _validity() -> KeyValidity:
    return KeyValidity((torch.tensor([[[False, True, True]], [[True, False, True]]]),))


def test_key_validity_is_a_frozen_value() -> None:
    """Seeded bug caught: ``frozen=False`` (its layers reassignable after the masks were checked)."""
    validity = _validity()
    with pytest.raises(FrozenInstanceError):
        validity.layers = ()  # type: ignore[misc]


def test_key_validity_names_a_layer_past_the_last() -> None:
    """The layer one past the last is refused with the layer count, like any other out of range. Seeded bug caught:
    ``layer <= len(layers)`` in the check (an IndexError instead)."""
    validity = _validity()
    assert validity.mask(0, query_len=1, key_len=4, heads=2).shape == (2, 2, 1, 4)
    for layer in (1, 2, -1):
        with pytest.raises(ValueError, match=re.escape(f"no key validity for layer {layer} (1 layers)")):
            validity.mask(layer, query_len=1, key_len=4, heads=2)


def test_the_fused_cpu_kernel_attends_the_prefix_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU the prefix part runs in torch's fused kernel where torch has it (no rows x prefix score matrix), and
    the result is the explicit softmax's. Seeded bug caught: ``device.type != "cpu"`` (the kernel never used on
    CPU)."""
    kernel = shared_prefix_module._FLASH_CPU
    if kernel is None:
        pytest.skip("this torch has no fused CPU attention kernel")
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return kernel(*args, **kwargs)

    generator = torch.Generator().manual_seed(3)
    query = torch.randn(2, 4, 3, 8, generator=generator)
    key, value = (torch.randn(2, 2, 3, 8, generator=generator) for _ in range(2))
    prefix = SharedPrefix(*(torch.randn(1, 2, 7, 8, generator=generator) for _ in range(2)), None)
    monkeypatch.setattr(shared_prefix_module, "_FLASH_CPU", counted)
    fused = shared_prefix_attention(query, key, value, prefix, scaling=0.3)
    assert calls
    monkeypatch.setattr(shared_prefix_module, "_FLASH_CPU", None)
    torch.testing.assert_close(fused, shared_prefix_attention(query, key, value, prefix, scaling=0.3))


def test_the_default_chunk_is_8192_tokens() -> None:
    """The documented default: a prompt of 8,192 tokens is one pass, one of 8,193 two. Seeded bug caught: 8193."""
    assert chunk_bounds(8192, DEFAULT_PREFILL_CHUNK) == ((0, 8192),)
    assert chunk_bounds(8193, DEFAULT_PREFILL_CHUNK) == ((0, 8192), (8192, 8193))
