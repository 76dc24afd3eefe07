"""Laying the compressed caches of one prompt out as batches (:mod:`ripplekv_eval.fastpath.batched` runs them).

A **padded batch** (:func:`padded_batch`, teacher forcing) left-pads rows, grouped by :func:`plan_batches`; a
**ragged batch** (:func:`ragged_batch`, decoding) keeps each row's length in buffers of its own, whose size
:func:`row_bytes` gives before :func:`decode_row` builds them (for memory-bounded groups). Head-wise masked layers
(AdaKV) are compacted first in both. Tensors are made on the caches' device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ripplekv.inference.generate import Prefill
from ripplekv.models.cache import KVPair, OverlayLayer, cache_from_layers, dynamic_layer
from ripplekv.models.headwise import MaskedLayer, headwise_of
from ripplekv.models.padded import KeyValidity, RaggedLayer

__all__ = [
    "STEP_COST_TOKENS",
    "DecodeRow",
    "NotBatchableError",
    "check_count",
    "check_rows",
    "check_states",
    "compact_heads",
    "decode_row",
    "pad_layers",
    "padded_batch",
    "plan_batches",
    "ragged_batch",
    "ragged_cache_of",
    "row_bytes",
    "row_lengths",
]


def compact_heads(
    keys: torch.Tensor, values: torch.Tensor, keep: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop one layer's masked entries (``keep`` ``(kv_heads, n)`` False) physically, each head left-padded.

    A head-wise masked (AdaKV) row would otherwise cost a full cache; key order does not matter (rotary positions
    are applied). Returns ``(1, kv_heads, m, dim)`` keys and values and ``(kv_heads, m)`` validity, ``m`` the most
    entries any head keeps.
    """
    counts = keep.sum(dim=-1)
    longest = int(counts.max()) if counts.numel() else 0
    kv_heads, dim = keys.shape[1], keys.shape[3]
    out_keys = keys.new_zeros((1, kv_heads, longest, dim))
    out_values = values.new_zeros((1, kv_heads, longest, values.shape[3]))
    valid = torch.zeros((kv_heads, longest), dtype=torch.bool, device=keys.device)
    for head in range(kv_heads):
        index = keep[head].nonzero().squeeze(-1).to(keys.device)
        start = longest - index.numel()
        out_keys[0, head, start:] = keys[0, head].index_select(0, index)
        out_values[0, head, start:] = values[0, head].index_select(0, index)
        valid[head, start:] = True
    return out_keys, out_values, valid


def pad_layers(
    layers: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stack one layer of single-row caches ``(keys, values, valid or None)``, left-padded with zeros to the longest.

    Returns ``(rows, kv_heads, longest, dim)`` keys and values and ``(rows, kv_heads, longest)`` validity.
    """
    if not layers:
        raise ValueError("no rows to pad")
    first = layers[0][0]
    _, kv_heads, _, dim = first.shape
    longest = max(keys.shape[2] for keys, _, _ in layers)
    keys_out = first.new_zeros((len(layers), kv_heads, longest, dim))
    values_out = layers[0][1].new_zeros((len(layers), kv_heads, longest, layers[0][1].shape[-1]))
    valid_out = torch.zeros((len(layers), kv_heads, longest), dtype=torch.bool, device=first.device)
    for row, (keys, values, valid) in enumerate(layers):
        if keys.dim() != 4 or keys.shape[0] != 1 or keys.shape[1] != kv_heads or keys.shape[3] != dim:
            raise ValueError(f"row {row}: keys of shape {tuple(keys.shape)} do not match (1, {kv_heads}, n, {dim})")
        if values.shape[:3] != keys.shape[:3]:
            raise ValueError(f"row {row}: values {tuple(values.shape)} do not match keys {tuple(keys.shape)}")
        start = longest - keys.shape[2]
        keys_out[row, :, start:] = keys[0]
        values_out[row, :, start:] = values[0]
        if valid is None:
            valid_out[row, :, start:] = True
        else:
            if valid.shape != (kv_heads, keys.shape[2]):
                raise ValueError(f"row {row}: validity {tuple(valid.shape)} does not match ({kv_heads}, n)")
            valid_out[row, :, start:] = valid.to(first.device)
    return keys_out, values_out, valid_out


class NotBatchableError(ValueError):
    """Caches that cannot run as one padded batch (decode them one at a time)."""


def check_count(name: str, value: object, minimum: int) -> int:
    """``value``, unless it is not an ``int >= minimum`` (a bool is not).

    Raises:
        ValueError: naming ``name``, ``minimum`` and ``value``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _layer_kv(layer: DynamicLayer) -> KVPair:
    """A batchable layer's keys and values (an :class:`OverlayLayer`'s base and appended tokens together)."""
    return layer.whole() if isinstance(layer, OverlayLayer) else (layer.keys, layer.values)


def _row_validity(state: Prefill) -> dict[int, torch.Tensor]:
    """Per layer with head-wise masked keys, the ``(kv_heads, n)`` entries the cache's row may see."""
    valid: dict[int, torch.Tensor] = {}
    for index, layer in enumerate(state.cache.layers):
        mask = headwise_of(layer)
        if mask is not None:
            valid[index] = mask.keep(layer.get_seq_length(), layer.keys.device)
    return valid


def check_states(states: Sequence[Prefill]) -> None:
    """Raise unless ``states`` can share batches: one prompt's caches, full-attention layers, batch size 1.

    Raises:
        ValueError: for no states.
        NotBatchableError: naming the first row (and layer) that cannot join row 0's batch (a sliding-window layer,
            a batch size other than 1, another position or number of layers).
    """
    if not states:
        raise ValueError("no caches to batch")
    first = states[0]
    for row, state in enumerate(states):
        if state.prompt_tokens != first.prompt_tokens:
            raise NotBatchableError(
                f"row {row} continues at position {state.prompt_tokens}, row 0 at {first.prompt_tokens}: "
                "a batch decodes every row at the same positions"
            )
        if len(state.cache.layers) != len(first.cache.layers):
            layers = len(state.cache.layers)
            raise NotBatchableError(f"row {row} has {layers} layers, row 0 has {len(first.cache.layers)}")
        for index, layer in enumerate(state.cache.layers):
            if type(layer) not in (DynamicLayer, MaskedLayer, OverlayLayer):
                raise NotBatchableError(
                    f"row {row}, layer {index}: a {type(layer).__name__} cannot be padded into a batch "
                    "(only full-attention DynamicLayer caches can)"
                )
            if layer.keys.shape[0] != 1:
                raise NotBatchableError(f"row {row}: a cache of batch size {layer.keys.shape[0]}, expected 1")


def padded_batch(states: Sequence[Prefill]) -> tuple[DynamicCache, KeyValidity]:
    """One left-padded batch cache over ``states``' caches (left unchanged), and which entries each row sees.

    Head-wise masked layers are compacted first (:func:`compact_heads`): a row costs what it
    keeps. ``states`` are prefilled caches of one prompt, as :func:`check_states` requires.
    """
    check_states(states)
    validity = [_row_validity(state) for state in states]
    layers, masks = [], []
    for index in range(len(states[0].cache.layers)):
        rows = []
        for row, state in enumerate(states):
            keys, values = _layer_kv(state.cache.layers[index])
            keep = validity[row].get(index)
            rows.append((keys, values, None) if keep is None else compact_heads(keys, values, keep))
        keys, values, valid = pad_layers(rows)
        layers.append(dynamic_layer(keys, values))
        masks.append(valid)
    return cache_from_layers(layers), KeyValidity(tuple(masks))


def ragged_batch(states: Sequence[Prefill], room: int) -> DynamicCache:
    """A batch cache whose rows keep their own lengths (no padding), with ``room`` tokens to append per row.

    Only ripplekv's attention functions (via :func:`~ripplekv.inference.generate.cache_forward`) read it: attention
    runs row by row over each row's own entries.
    """
    check_states(states)
    return ragged_cache_of([decode_row(state, room) for state in states])


@dataclass(frozen=True)
class DecodeRow:
    """One cache laid out for a batched decode (built by :func:`decode_row`).

    It shares no tensor with its cache, which can be released while the row waits. A decode writes into the buffers'
    room and starts at ``lengths``, so a row can be decoded again.

    Args:
        buffers: per layer ``(keys, values)`` of shape ``(1, kv_heads, length + room, head_dim)``.
        lengths: per layer, the cached entries at the start of the buffers.
        valid: per layer, None or the ``(kv_heads, length)`` entries the row may see (compacted head-wise masks).
        next_logits: ``(vocab,)`` logits of the first answer token.
        prompt_tokens: the position of the first answer token.
        room: tokens the buffers can take after ``lengths``.
    """

    buffers: tuple[KVPair, ...]
    lengths: tuple[int, ...]
    valid: tuple[torch.Tensor | None, ...]
    next_logits: torch.Tensor
    prompt_tokens: int
    room: int

    def nbytes(self) -> int:
        """Bytes of the row's buffers and validity masks."""
        tensors = [t for pair in self.buffers for t in pair] + [v for v in self.valid if v is not None]
        return sum(t.numel() * t.element_size() for t in tensors)


def row_bytes(state: Prefill, room: int) -> int:
    """What :func:`decode_row` of ``state`` will hold (:meth:`DecodeRow.nbytes`), without building it."""
    check_states([state])
    check_count("room", room, 0)
    validity = _row_validity(state)
    total = 0
    for index, (layer, length) in enumerate(zip(state.cache.layers, row_lengths(state))):
        kv_heads = layer.keys.shape[1]
        per_token = kv_heads * (layer.keys.shape[3] + layer.values.shape[3]) * layer.keys.element_size()
        total += per_token * (length + room) + (kv_heads * length if index in validity else 0)
    return total


def decode_row(state: Prefill, room: int) -> DecodeRow:
    """``state``'s cache (left unchanged) laid out with ``room`` answer tokens, head-wise masked layers compacted.

    Raises:
        NotBatchableError: for a cache that cannot join a batch (see :func:`check_states`).
    """
    check_states([state])
    check_count("room", room, 0)
    validity = _row_validity(state)
    buffers, lengths, valid = [], [], []
    for index, layer in enumerate(state.cache.layers):
        keys, values = _layer_kv(layer)
        keep = validity.get(index)
        mask = None
        if keep is not None:
            keys, values, mask = compact_heads(keys, values, keep)
        n = keys.shape[2]
        key_buffer = keys.new_empty((1, keys.shape[1], n + room, keys.shape[3]))
        value_buffer = values.new_empty((1, values.shape[1], n + room, values.shape[3]))
        key_buffer[:, :, :n] = keys
        value_buffer[:, :, :n] = values
        del keys, values  # an OverlayLayer's whole layer is a temporary: one layer at a time
        buffers.append((key_buffer, value_buffer))
        lengths.append(n)
        valid.append(mask)
    return DecodeRow(tuple(buffers), tuple(lengths), tuple(valid), state.next_logits, state.prompt_tokens, room)


def check_rows(rows: Sequence[DecodeRow], room: int) -> None:
    """Raise unless ``rows`` can decode ``room`` tokens as one batch.

    Raises:
        ValueError: for no rows or a row without enough room.
        TypeError: for a row that is not a :class:`DecodeRow`.
        NotBatchableError: for rows at other positions or with other numbers of layers than row 0.
    """
    if not rows:
        raise ValueError("no rows to decode")
    first = rows[0]
    for index, row in enumerate(rows):
        if not isinstance(row, DecodeRow):
            raise TypeError(f"row {index} is a {type(row).__name__}, not a DecodeRow")
        if row.prompt_tokens != first.prompt_tokens:
            raise NotBatchableError(
                f"row {index} continues at position {row.prompt_tokens}, row 0 at {first.prompt_tokens}: "
                "a batch decodes every row at the same positions"
            )
        if len(row.buffers) != len(first.buffers):
            raise NotBatchableError(f"row {index} has {len(row.buffers)} layers, row 0 has {len(first.buffers)}")
        if row.room < room:
            raise ValueError(f"row {index} has room for {row.room} tokens, {room} may be decoded")


def ragged_cache_of(rows: Sequence[DecodeRow]) -> DynamicCache:
    """One :class:`~ripplekv.models.padded.RaggedLayer` per layer over the rows' buffers (not copied)."""
    layers = []
    for index in range(len(rows[0].buffers)):
        first_keys, first_values = rows[0].buffers[index]
        length = rows[0].lengths[index]
        like = dynamic_layer(first_keys[:, :, :length], first_values[:, :, :length])  # dtype and device; never attended
        buffers = [row.buffers[index] for row in rows]
        lengths = [row.lengths[index] for row in rows]
        layers.append(RaggedLayer._of(buffers, lengths, [row.valid[index] for row in rows], like))
    return cache_from_layers(layers)


STEP_COST_TOKENS = 8192
"""The fixed cost of one decoding step (weights, kernel launches), in cached tokens per row.

A batch's step costs about ``STEP_COST_TOKENS + rows x padded tokens`` (averaged over layers); from the step costs
in docs/results.md ("Decoding every configuration of a prompt as one batch").
"""


def row_lengths(state: Prefill) -> list[int]:
    """Entries per layer the cache occupies as a batch row (head-wise masked layers compacted)."""
    lengths = [layer.get_seq_length() for layer in state.cache.layers]
    for layer, keep in _row_validity(state).items():
        lengths[layer] = int(keep.sum(dim=-1).max())
    return lengths


def plan_batches(states: Sequence[Prefill], max_rows: int | None = None) -> list[list[int]]:
    """Split rows into batches so that padding does not cost more than the decoding steps it saves.

    Rows are taken from the smallest cache to the largest; a row joins the current batch when the batch's estimated
    step cost with it (:data:`STEP_COST_TOKENS` plus rows times padded length) is at most the cost of the two apart
    and the batch holds fewer than ``max_rows`` (None: no limit). Caches of one prompt at 10-30% budgets share one
    batch; the full cache of a long prompt decodes apart.

    Returns:
        Lists of indices into ``states``, every index exactly once.
    """
    if max_rows is not None:
        check_count("max_rows", max_rows, 1)
    check_states(states)
    layers = len(states[0].cache.layers) if states else 1
    lengths = [row_lengths(state) for state in states]

    def cost(rows: int, widest: Sequence[int]) -> float:
        return STEP_COST_TOKENS + rows * sum(widest) / layers

    order = sorted(range(len(states)), key=lambda i: (sum(lengths[i]), i))
    batches: list[list[int]] = []
    longest: list[int] = []
    for index in order:
        if batches and (max_rows is None or len(batches[-1]) < max_rows):
            widest = [max(a, b) for a, b in zip(longest, lengths[index])]
            apart = cost(len(batches[-1]), longest) + cost(1, lengths[index])
            if cost(len(batches[-1]) + 1, widest) <= apart:
                batches[-1].append(index)
                longest = widest
                continue
        batches.append([index])
        longest = list(lengths[index])
    return batches
