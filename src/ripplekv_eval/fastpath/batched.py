"""Decode (or teacher-force) every compressed cache of one prompt as one batch.

A small model's CPU decoding step is mostly fixed cost, so the caches derived from one prefill run together:
decoding as a ragged batch (:func:`decode_row`: each row keeps its own length; attention runs row by row, padding
was slower, docs/results.md), teacher forcing as left-padded batches (:func:`padded_batch`, grouped by
:func:`plan_batches`). Head-wise masked layers (AdaKV) are compacted first. Tokens equal
:func:`~ripplekv.inference.generate.greedy_decode` per cache up to float rounding at near-ties.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from ripplekv.inference.generate import Prefill, cache_forward
from ripplekv.models.attention import unsupported_implementation_message, uses_varlen_attention
from ripplekv.models.cache import KVPair, OverlayLayer, cache_from_layers, dynamic_layer
from ripplekv.models.headwise import MaskedLayer, headwise_of
from ripplekv.validation import check_int
from ripplekv_eval.fastpath.fidelity import check_tokens, teacher_forced_logprobs
from ripplekv_eval.fastpath.padded import KeyValidity, RaggedLayer, with_room


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


def _check_aligned(positions: Sequence[int], layers: Sequence[int]) -> None:
    """NotBatchableError for the first row at another position, or with another number of layers, than row 0."""
    for row, (position, count) in enumerate(zip(positions, layers)):
        if position != positions[0]:
            raise NotBatchableError(
                f"row {row} continues at position {position}, row 0 at {positions[0]}: "
                "a batch decodes every row at the same positions"
            )
        if count != layers[0]:
            raise NotBatchableError(f"row {row} has {count} layers, row 0 has {layers[0]}")


def check_states(states: Sequence[Prefill]) -> None:
    """Raise (ValueError for none, else NotBatchableError naming the row) unless ``states`` can share batches: one
    prompt's caches, full-attention layers, batch size 1."""
    if not states:
        raise ValueError("no caches to batch")
    _check_aligned([state.prompt_tokens for state in states], [len(state.cache.layers) for state in states])
    for row, state in enumerate(states):
        for index, layer in enumerate(state.cache.layers):
            if type(layer) not in (DynamicLayer, MaskedLayer, OverlayLayer):
                raise NotBatchableError(
                    f"row {row}, layer {index}: a {type(layer).__name__} cannot be padded into a batch "
                    "(only full-attention DynamicLayer caches can)"
                )
            if layer.keys.shape[0] != 1:
                raise NotBatchableError(f"row {row}: a cache of batch size {layer.keys.shape[0]}, expected 1")


def padded_batch(states: Sequence[Prefill]) -> tuple[DynamicCache, KeyValidity]:
    """One left-padded batch cache over ``states``' caches (left unchanged), and which entries each row sees."""
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


@dataclass(frozen=True)
class DecodeRow:
    """One cache laid out for a batched decode (:func:`decode_row`), sharing no tensor with it (the cache can go).

    A decode writes into the buffers' room after ``lengths``, so a row can be decoded again.
    """

    buffers: tuple[KVPair, ...]  # per layer (1, kv_heads, length + room, head_dim) keys and values
    lengths: tuple[int, ...]  # per layer, the cached entries at the start of the buffers
    valid: tuple[torch.Tensor | None, ...]  # per layer, None or the (kv_heads, length) entries the row may see
    next_logits: torch.Tensor  # (vocab,) logits of the first answer token, at position prompt_tokens
    prompt_tokens: int
    room: int

    def nbytes(self) -> int:
        """Bytes of the row's buffers and validity masks."""
        tensors = [t for pair in self.buffers for t in pair] + [v for v in self.valid if v is not None]
        return sum(t.numel() * t.element_size() for t in tensors)


def row_bytes(state: Prefill, room: int) -> int:
    """What :func:`decode_row` of ``state`` will hold (:meth:`DecodeRow.nbytes`), without building it."""
    check_states([state])
    check_int("room", room, 0)
    validity = _row_validity(state)
    total = 0
    for index, (layer, length) in enumerate(zip(state.cache.layers, row_lengths(state))):
        kv_heads = layer.keys.shape[1]
        per_token = kv_heads * (layer.keys.shape[3] + layer.values.shape[3]) * layer.keys.element_size()
        total += per_token * (length + room) + (kv_heads * length if index in validity else 0)
    return total


def decode_row(state: Prefill, room: int) -> DecodeRow:
    """``state``'s cache (left unchanged) laid out with ``room`` answer tokens, head-wise masked layers compacted."""
    check_states([state])
    check_int("room", room, 0)
    validity = _row_validity(state)
    buffers, lengths, valid = [], [], []
    for index, layer in enumerate(state.cache.layers):
        keys, values = _layer_kv(layer)
        keep = validity.get(index)
        mask = None
        if keep is not None:
            keys, values, mask = compact_heads(keys, values, keep)
        buffers.append(with_room(keys, values, room))
        lengths.append(keys.shape[2])
        del keys, values  # an OverlayLayer's whole layer is a temporary: one layer at a time
        valid.append(mask)
    return DecodeRow(tuple(buffers), tuple(lengths), tuple(valid), state.next_logits, state.prompt_tokens, room)


def check_rows(rows: Sequence[DecodeRow], room: int) -> None:
    """Raise unless ``rows`` (:class:`DecodeRow`) can decode ``room`` tokens as one batch."""
    if not rows:
        raise ValueError("no rows to decode")
    for index, row in enumerate(rows):
        if not isinstance(row, DecodeRow):
            raise TypeError(f"row {index} is a {type(row).__name__}, not a DecodeRow")
    _check_aligned([row.prompt_tokens for row in rows], [len(row.buffers) for row in rows])
    for index, row in enumerate(rows):
        if row.room < room:
            raise ValueError(f"row {index} has room for {row.room} tokens, {room} may be decoded")


def ragged_cache_of(rows: Sequence[DecodeRow]) -> DynamicCache:
    """One :class:`~ripplekv_eval.fastpath.padded.RaggedLayer` per layer over the rows' buffers (not copied)."""
    layers = []
    for index in range(len(rows[0].buffers)):
        first_keys, first_values = rows[0].buffers[index]
        length = rows[0].lengths[index]
        like = dynamic_layer(first_keys[:, :, :length], first_values[:, :, :length])  # dtype and device; never attended
        buffers = [row.buffers[index] for row in rows]
        lengths = [row.lengths[index] for row in rows]
        layers.append(RaggedLayer._of(buffers, lengths, [row.valid[index] for row in rows], like))
    return cache_from_layers(layers)


# A step's fixed cost (weights, kernel launches) in cached tokens per row: a batch's step costs about
# STEP_COST_TOKENS + rows x padded tokens (docs/results.md, "Decoding every configuration of a prompt as one batch").
STEP_COST_TOKENS = 8192


def row_lengths(state: Prefill) -> list[int]:
    """Entries per layer the cache occupies as a batch row (head-wise masked layers compacted)."""
    lengths = [layer.get_seq_length() for layer in state.cache.layers]
    for layer, keep in _row_validity(state).items():
        lengths[layer] = int(keep.sum(dim=-1).max())
    return lengths


def plan_batches(states: Sequence[Prefill], max_rows: int | None = None) -> list[list[int]]:
    """Split rows into batches so that padding does not cost more than the decoding steps it saves.

    Rows are taken from the smallest cache to the largest; a row joins the current batch when the batch's step cost
    with it is at most the cost of the two apart and the batch holds fewer than ``max_rows`` (None: no limit).
    Returns lists of indices into ``states``, every index once.
    """
    if max_rows is not None:
        check_int("max_rows", max_rows, 1)
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


@torch.no_grad()
def batched_greedy_decode_rows(
    model: PreTrainedModel,
    rows: Sequence[DecodeRow],
    max_new_tokens: int,
    stop_ids: set[int],
    min_new_tokens: int,
) -> list[list[int]]:
    """Greedy tokens after each of ``rows`` (:func:`decode_row`, each with room for ``max_new_tokens``), as one batch.

    Check :func:`~ripplekv.models.attention.uses_varlen_attention` before laying caches out as rows: only ripplekv's
    attention functions read a ragged batch (NotBatchableError otherwise).
    """
    if not uses_varlen_attention(model):
        raise NotBatchableError(unsupported_implementation_message(model, "batched decoding"))
    check_int("max_new_tokens", max_new_tokens, 1)
    check_int("min_new_tokens", min_new_tokens, 0)
    check_rows(rows, max_new_tokens)
    cache = ragged_cache_of(rows)
    logits = torch.stack([row.next_logits for row in rows])
    device, vocab = logits.device, logits.shape[-1]
    banned = torch.tensor(sorted(i for i in stop_ids if 0 <= i < vocab), dtype=torch.long, device=device)
    tokens: list[list[int]] = [[] for _ in rows]
    active = list(range(len(rows)))
    position = rows[0].prompt_tokens
    while True:
        if len(tokens[active[0]]) < min_new_tokens and banned.numel():
            logits = logits.index_fill(-1, banned, float("-inf"))
        picks = logits.argmax(dim=-1).tolist()
        staying = []
        for slot, (row, token) in enumerate(zip(active, picks)):
            tokens[row].append(int(token))
            if token not in stop_ids and len(tokens[row]) < max_new_tokens:
                staying.append(slot)
        if not staying:
            return tokens
        if len(staying) < len(active):
            cache = cache_from_layers([layer.select(staying) for layer in cache.layers])
            active = [active[slot] for slot in staying]
        step = torch.tensor([[tokens[row][-1]] for row in active], device=device)
        pos = torch.tensor([position], device=device)
        logits = cache_forward(model, step, cache, pos)[:, -1]
        position += 1


@torch.no_grad()
def batched_teacher_forced_logprobs(
    model: PreTrainedModel, states: Sequence[Prefill], tokens: Sequence[int], max_rows: int | None = None
) -> list[torch.Tensor]:
    """:func:`~ripplekv_eval.fastpath.fidelity.teacher_forced_logprobs` of the same ``tokens`` over each of ``states``.

    One forward pass of ``tokens[:-1]`` per padded batch (:func:`plan_batches`, at most ``max_rows`` rows); one cache
    at a time on a model without ripplekv's attention functions.
    """
    if not states:
        raise ValueError("no caches to teacher-force")
    if not uses_varlen_attention(model):
        return [teacher_forced_logprobs(model, state, tokens) for state in states]
    check_states(states)
    vocab = states[0].next_logits.shape[-1]
    ids = check_tokens(tokens, vocab)
    results: list[torch.Tensor | None] = [None] * len(states)
    for batch in plan_batches(states, max_rows):
        group = [states[i] for i in batch]
        first = torch.stack([state.next_logits for state in group]).to("cpu", torch.float64).unsqueeze(1)
        if len(ids) == 1:
            rest = first.new_zeros((len(group), 0, vocab))
        else:
            cache, validity = padded_batch(group)
            device = group[0].next_logits.device
            start = group[0].prompt_tokens
            positions = torch.arange(start, start + len(ids) - 1, device=device)
            ids_rows = torch.tensor([ids[:-1]], device=device).expand(len(group), -1)
            logits = cache_forward(model, ids_rows, cache, positions, key_validity=validity)
            rest = logits.to("cpu", torch.float64)
        for index, logprobs in zip(batch, torch.log_softmax(torch.cat([first, rest], dim=1), dim=-1).unbind(0)):
            results[index] = logprobs
    return results  # type: ignore[return-value]
