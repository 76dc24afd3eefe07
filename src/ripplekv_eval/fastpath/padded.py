"""Several compressed caches of one prompt as one batch: padded (:class:`KeyValidity`) or ragged (:class:`RaggedLayer`).

:mod:`ripplekv_eval.fastpath.batched` lays them out: a padded layer is stacked into ``(rows, kv_heads, longest,
dim)``, left-padded; masked entries get exactly zero weight, so each row computes what it computes alone up to float
rounding. Only ripplekv's attention functions read these, through two hooks
(:mod:`ripplekv.models.attention_functions`): ``key_validity``'s :meth:`KeyValidity.additive_mask` and a layer's
:meth:`RaggedLayer.attend` (FlashAttention ignores unknown keywords): callers check
:func:`ripplekv.models.attention.uses_varlen_attention`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer

from ripplekv.models.attention_masks import sliding_window_mask
from ripplekv.models.headwise import MASKED_KEYS

__all__ = ["KeyValidity", "RaggedLayer", "with_room"]


@dataclass(frozen=True)
class KeyValidity:
    """Per layer, ``(rows, kv_heads, cached)``: True where the entry is one of the row's own cached keys (False on
    padding and head-wise masked keys). Tokens appended later are always valid, causal among themselves."""

    layers: tuple[torch.Tensor, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        if not self.layers:
            raise ValueError("KeyValidity needs at least one layer")
        rows = self.layers[0].shape[0]
        for index, layer in enumerate(self.layers):
            if not isinstance(layer, torch.Tensor) or layer.dtype != torch.bool or layer.dim() != 3:
                raise TypeError(f"layer {index}: expected a (rows, kv_heads, cached) boolean tensor")
            if layer.shape[0] != rows:
                raise ValueError(f"layer {index} has {layer.shape[0]} rows, layer 0 has {rows}")

    @property
    def rows(self) -> int:
        return int(self.layers[0].shape[0])

    def select(self, rows: torch.Tensor) -> KeyValidity:
        """The validity of the given rows only (``rows``: a 1-D index tensor), as in ``index_select``."""
        return KeyValidity(tuple(layer.index_select(0, rows.to(layer.device)) for layer in self.layers))

    def mask(self, layer: int, query_len: int, key_len: int, heads: int) -> torch.Tensor:
        """The boolean mask ``(rows, heads, query_len, key_len)`` of one layer; ``key_len`` counts cached, appended
        and new keys, and each KV head's validity is repeated for its group of ``heads``."""
        if not 0 <= layer < len(self.layers):
            raise ValueError(f"no key validity for layer {layer} ({len(self.layers)} layers)")
        cached = self.layers[layer]
        rows, kv_heads, length = cached.shape
        if heads % kv_heads:
            raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} KV heads")
        appended = key_len - length
        if appended < query_len:
            raise ValueError(
                f"layer {layer} holds {key_len} keys for {query_len} queries over {length} cached entries: "
                "the cache does not match its key validity"
            )
        prefix = cached.repeat_interleave(heads // kv_heads, dim=1).unsqueeze(2).expand(rows, heads, query_len, length)
        queries = torch.arange(query_len, device=cached.device).unsqueeze(1)
        columns = torch.arange(appended, device=cached.device).unsqueeze(0)
        causal = (columns <= queries + (appended - query_len)).expand(rows, heads, query_len, appended)
        return torch.cat([prefix, causal], dim=-1)

    def additive_mask(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """The additive mask of a pass over the padded batch, on the cache's device (replaces layer 0's)."""
        if getattr(module, MASKED_KEYS, None) is not None:
            raise ValueError(f"a padded batch carries head-wise masks in its key validity, not in {MASKED_KEYS}")
        if self.rows != query.shape[0]:
            raise ValueError(f"key validity for {self.rows} rows, the pass has {query.shape[0]}")
        allowed = self.mask(module.layer_idx, query.shape[2], key.shape[2], query.shape[1])
        # Additive even for sdpa: torch's CPU kernel converts a boolean mask to this on every call (slower).
        return torch.zeros(allowed.shape, dtype=query.dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(query.dtype).min
        )


def with_room(keys: torch.Tensor, values: torch.Tensor, room: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of ``(1, kv_heads, n, dim)`` ``keys`` and ``values`` in buffers with ``room`` more entries after them."""
    n = keys.shape[2]
    key_buffer = keys.new_empty((1, keys.shape[1], n + room, keys.shape[3]))
    value_buffer = values.new_empty((1, values.shape[1], n + room, values.shape[3]))
    key_buffer[:, :, :n] = keys
    value_buffer[:, :, :n] = values
    return key_buffer, value_buffer


class RaggedLayer(DynamicLayer):
    """One layer of a batch of caches that keep their own lengths: one buffer per row, no padding.

    Projections and MLPs run batched; attention runs row by row over :meth:`row`. ``rows``: one
    ``(keys, values, valid or None)`` per row, each ``(1, kv_heads, n, dim)``; ``room``: tokens that can be appended
    to every row.
    """

    def __init__(self, rows: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]], room: int) -> None:
        super().__init__()
        if not rows:
            raise ValueError("a ragged layer needs at least one row")
        self.buffers = [with_room(keys, values, room) for keys, values, _ in rows]
        self.lengths = [keys.shape[2] for keys, _, _ in rows]
        self.valid = [  # moved once, not per pass
            None if valid is None else valid.to(buffer[0].device) for (_, _, valid), buffer in zip(rows, self.buffers)
        ]
        self.lazy_initialization(rows[0][0], rows[0][1])
        self.keys, self.values = rows[0][0], rows[0][1]  # dtype and device for transformers; never attended

    @classmethod
    def _of(cls, buffers: list, lengths: list[int], valid: list, like: DynamicLayer) -> RaggedLayer:
        layer = cls.__new__(cls)
        DynamicLayer.__init__(layer)
        layer.buffers, layer.lengths, layer.valid = buffers, lengths, valid
        layer.lazy_initialization(like.keys, like.values)
        layer.keys, layer.values = like.keys, like.values
        return layer

    def select(self, rows: Sequence[int]) -> RaggedLayer:
        """The layer of the given rows only (the buffers are shared, not copied)."""
        return RaggedLayer._of(
            [self.buffers[r] for r in rows], [self.lengths[r] for r in rows], [self.valid[r] for r in rows], self
        )

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs: dict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if key_states.shape[0] != len(self.buffers):
            raise ValueError(f"a pass of {key_states.shape[0]} rows over a ragged layer of {len(self.buffers)}")
        new = key_states.shape[2]
        for row, (key_buffer, value_buffer) in enumerate(self.buffers):
            start = self.lengths[row]
            if start + new > key_buffer.shape[2]:
                raise ValueError(f"row {row} has room for {key_buffer.shape[2] - start} more tokens, {new} needed")
            key_buffer[:, :, start : start + new] = key_states[row : row + 1]
            value_buffer[:, :, start : start + new] = value_states[row : row + 1]
            self.lengths[row] = start + new
        return key_states, value_states

    def get_seq_length(self) -> int:
        return max(self.lengths)

    def row(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row ``index``'s keys and values, ``(1, kv_heads, n_row, dim)`` views of its buffers."""
        key_buffer, value_buffer = self.buffers[index]
        return key_buffer[:, :, : self.lengths[index]], value_buffer[:, :, : self.lengths[index]]

    def row_mask(self, index: int, query_len: int, heads: int) -> torch.Tensor | None:
        """Row ``index``'s boolean mask ``(1, heads, query_len, n_row)`` on its buffers' device, or None when it
        sees every entry."""
        valid = self.valid[index]
        length = self.lengths[index]
        if valid is None and query_len == 1:
            return None
        key_buffer = self.buffers[index][0]
        device, kv_heads = key_buffer.device, key_buffer.shape[1]
        cached = valid.shape[-1] if valid is not None else length - query_len
        prefix = torch.ones(kv_heads, cached, dtype=torch.bool, device=device) if valid is None else valid
        prefix = prefix.repeat_interleave(heads // kv_heads, dim=0).view(1, heads, 1, cached)
        appended = length - cached
        queries = torch.arange(query_len, device=device).unsqueeze(1)
        columns = torch.arange(appended, device=device).unsqueeze(0)
        causal = (columns <= queries + (appended - query_len)).view(1, 1, query_len, appended)
        return torch.cat(
            [prefix.expand(1, heads, query_len, cached), causal.expand(1, heads, query_len, appended)], dim=-1
        )

    def attend(
        self, module: torch.nn.Module, query: torch.Tensor, scaling: float | None, window: int | None = None
    ) -> torch.Tensor:
        """Each row's queries over that row's own keys and values; a sliding layer's also get its ``window`` mask."""
        if getattr(module, MASKED_KEYS, None) is not None:
            raise ValueError(f"a ragged batch carries head-wise masks in its rows, not in {MASKED_KEYS}")
        heads, query_len = query.shape[1], query.shape[2]
        outputs = []
        for row in range(query.shape[0]):
            keys, values = self.row(row)
            mask = self.row_mask(row, query_len, heads)  # on the row's buffers' device
            band = None if window is None else sliding_window_mask(query_len, keys.shape[2], window, device=keys.device)
            if band is not None:
                mask = band if mask is None else mask & band
            outputs.append(
                torch.nn.functional.scaled_dot_product_attention(
                    query[row : row + 1],
                    keys,
                    values,
                    attn_mask=mask,
                    scale=scaling,
                    is_causal=False,
                    enable_gqa=heads != keys.shape[1],
                )
            )
        return torch.cat(outputs, dim=0).transpose(1, 2).contiguous()
