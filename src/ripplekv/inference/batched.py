"""Decode (or teacher-force) every compressed cache of one prompt as one batch.

An evaluation derives one compressed cache per (method, budget) from the same prefill. Decoding them one at a
time costs one forward pass per token per configuration, and on a CPU a decoding step of a small model is mostly
fixed cost (reading the weights; the step costs are in docs/results.md). Here the caches run as one batch:

* **decoding** (:func:`batched_greedy_decode`): every row keeps its own length (:func:`ragged_batch`, one
  :class:`~ripplekv.models.padded.RaggedLayer` per layer). The embeddings, projections and MLPs of a step run
  batched over all rows (the weights are read once per step), and attention runs row by row over exactly that
  row's own entries, so no row pays for another's length. Head-wise masked caches (AdaKV's ``masked_key_indices``,
  taken from the cache's attention state) are compacted first: each head keeps only its own entries, and a per-row
  mask covers the heads' different counts;
* **teacher forcing** (:func:`batched_teacher_forced_logprobs`): each layer's keys and values are stacked into
  ``(rows, kv_heads, longest, dim)`` tensors, shorter rows padded on the left (:func:`padded_batch`), and a
  :class:`~ripplekv.models.padded.KeyValidity` records which entries each row may attend to; rows are grouped by
  a step-cost model (:func:`plan_batches`) so padding stays cheap;
* every row runs at the same positions (the caches come from one prompt); a row that generates a stop token or
  reaches ``max_new_tokens`` leaves the batch, which shrinks to the rows still decoding.

Padding every row to the longest cache was tried for decoding first and was slower than one row at a time at 4K
tokens (attention and cache updates are memory-bound and cost what the padded size holds); see docs/results.md.

The result is the same greedy tokens as :func:`~ripplekv.inference.generate.greedy_decode` on each cache alone,
up to float rounding: a batched matrix product and a longer (masked) reduction may round differently, which can
flip a greedy choice only where the two best logits are within rounding of each other (none did in the benchmark).
``benchmarks/batched_decode.py`` counts such rows and prints the logit margin at which each one diverged.

Caches that cannot be batched raise :class:`NotBatchableError`: a sliding-window layer (its cache crops itself),
attention state other than head-wise key masks (module attributes cannot differ per row), or a model that does not
run ripplekv's attention functions (:func:`~ripplekv.models.attention.uses_varlen_attention`), which alone read the
``ragged_cache`` of a batched decoding step: FlashAttention, kept as loaded, attends over per-layer caches correctly
one cache at a time, but would attend each row over nothing but its new token here. Batched teacher forcing falls
back to one cache at a time under such a model itself.

Devices: every tensor is made on the device of the caches and logits it is combined with. Each decoding step reads
the greedy picks on the host once (to stop rows at their stop tokens); nothing else synchronises per step.

Memory: a ragged batch holds each row's entries (head-wise masked layers compacted) plus room for the answer in
buffers of its own, a copy of the caches it was built from. :func:`decode_row` lays one cache out that way on its
own and :func:`row_bytes` says what that costs before building it, so a caller can hold decode rows instead of
their caches and decode them in groups bounded by memory (:func:`batched_greedy_decode_rows`), releasing each
cache as soon as its row is built. :func:`batched_greedy_decode` builds the rows of one ``max_rows`` batch at a
time. Caches whose layers are :class:`~ripplekv.inference.shared.OverlayLayer` forks (a question run over a
derived cache by :func:`~ripplekv.inference.shared.lean_extend`) are read layer by layer, never copied whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from ripplekv.inference.fidelity import teacher_forced_logprobs
from ripplekv.inference.generate import Prefill
from ripplekv.inference.module_state import ABSENT, MASKED_KEYS
from ripplekv.inference.shared import OverlayLayer
from ripplekv.models.attention import unsupported_implementation_message, uses_varlen_attention
from ripplekv.models.cache import KVPair, cache_from_layers, cache_from_tensors
from ripplekv.models.padded import KeyValidity, RaggedLayer, compact_heads, pad_layers

__all__ = [
    "DecodeRow",
    "NotBatchableError",
    "batched_greedy_decode",
    "batched_greedy_decode_rows",
    "batched_teacher_forced_logprobs",
    "can_batch",
    "decode_row",
    "padded_batch",
    "plan_batches",
    "row_bytes",
]


class NotBatchableError(ValueError):
    """Caches that cannot run as one padded batch (decode them one at a time)."""


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _layer_kv(layer: DynamicLayer) -> KVPair:
    """A batchable layer's keys and values (an :class:`OverlayLayer`'s base and appended tokens together)."""
    return layer.whole() if isinstance(layer, OverlayLayer) else (layer.keys, layer.values)


def _row_validity(state: Prefill, row: int) -> dict[int, torch.Tensor]:
    """Per layer with head-wise masked keys, the ``(kv_heads, n)`` entries row ``row`` may see."""
    valid: dict[int, torch.Tensor] = {}
    for module_state in state.attention_state:
        for name, value in module_state.attributes.items():
            if name != MASKED_KEYS:
                raise NotBatchableError(
                    f"row {row}: the cache's attention state sets {name!r} on layer {module_state.layer}, which "
                    "cannot differ per batch row; decode it alone"
                )
            if value is None or value is ABSENT:
                continue
            layer = state.cache.layers[module_state.layer]
            kv_heads, length = layer.keys.shape[1], layer.get_seq_length()
            batch, head, position = value
            if batch.numel() and int(batch.max()) > 0:
                raise NotBatchableError(f"row {row}: head-wise masked keys of a batch larger than one")
            keep = torch.ones(kv_heads, length, dtype=torch.bool, device=layer.keys.device)
            keep[head.to(keep.device), position.to(keep.device)] = False
            valid[module_state.layer] = keep
    return valid


def _check_states(states: Sequence[Prefill]) -> None:
    """Raise unless ``states`` can share batches: one prompt's caches, full-attention layers, batch size 1."""
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
            if type(layer) not in (DynamicLayer, OverlayLayer):
                raise NotBatchableError(
                    f"row {row}, layer {index}: a {type(layer).__name__} cannot be padded into a batch "
                    "(only full-attention DynamicLayer caches can)"
                )
            if layer.keys.shape[0] != 1:
                raise NotBatchableError(f"row {row}: a cache of batch size {layer.keys.shape[0]}, expected 1")


def padded_batch(states: Sequence[Prefill]) -> tuple[DynamicCache, KeyValidity]:
    """One padded batch cache over the caches of ``states`` (left padding), and which entries each row sees.

    Head-wise masked layers (AdaKV) are compacted first (:func:`~ripplekv.models.padded.compact_heads`): a row costs
    what it keeps, not the full cache.

    Args:
        states: prefilled (compressed) caches of the same prompt: batch size 1 each, the same number of layers
            and the same ``prompt_tokens`` (the rows decode at the same positions). They are not changed.
    """
    _check_states(states)
    validity = [_row_validity(state, row) for row, state in enumerate(states)]
    layers, masks = [], []
    for index in range(len(states[0].cache.layers)):
        rows = []
        for row, state in enumerate(states):
            keys, values = _layer_kv(state.cache.layers[index])
            keep = validity[row].get(index)
            rows.append((keys, values, None) if keep is None else compact_heads(keys, values, keep))
        keys, values, valid = pad_layers(rows)
        layers.append(_dynamic(keys, values))
        masks.append(valid)
    return cache_from_layers(layers), KeyValidity(tuple(masks))


def ragged_batch(states: Sequence[Prefill], room: int) -> DynamicCache:
    """A batch cache whose rows keep their own lengths (:class:`~ripplekv.models.padded.RaggedLayer`), no padding.

    Head-wise masked layers (AdaKV) are compacted (:func:`~ripplekv.models.padded.compact_heads`). Passes over it
    must carry it as ``ragged_cache`` too: the attention then runs row by row over each row's own entries.

    Args:
        states: prefilled (compressed) caches of one prompt; left unchanged.
        room: tokens that will be appended to every row.
    """
    _check_states(states)
    return _ragged_cache([decode_row(state, room) for state in states])


@dataclass(frozen=True)
class DecodeRow:
    """One cache laid out for a batched decode: per layer, its entries in buffers with room for the answer.

    Built by :func:`decode_row`; it shares no tensor with the cache it was built from, which can be released while
    the row waits for its batch. A decode writes the answer's entries into the buffers' room (the row can be
    decoded again: each decode starts at ``lengths``).

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
    """What :func:`decode_row` of ``state`` will hold (:meth:`DecodeRow.nbytes`), without building it.

    Args:
        state: a prefilled (compressed) cache (see :func:`padded_batch`).
        room: tokens that will be appended.
    """
    _check_states([state])
    _check_int("room", room, 0)
    validity = _row_validity(state, 0)
    total = 0
    for index, (layer, length) in enumerate(zip(state.cache.layers, _row_lengths(state, 0))):
        kv_heads = layer.keys.shape[1]
        per_token = kv_heads * (layer.keys.shape[3] + layer.values.shape[3]) * layer.keys.element_size()
        total += per_token * (length + room) + (kv_heads * length if index in validity else 0)
    return total


def decode_row(state: Prefill, room: int) -> DecodeRow:
    """``state``'s cache laid out for :func:`batched_greedy_decode_rows`, head-wise masked layers compacted.

    Args:
        state: a prefilled (compressed) cache (see :func:`padded_batch`); left unchanged.
        room: tokens that will be appended (the answer's length).

    Raises:
        NotBatchableError: for a cache that cannot join a batch (see the module docstring).
    """
    _check_states([state])
    _check_int("room", room, 0)
    validity = _row_validity(state, 0)
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


def _check_rows(rows: Sequence[DecodeRow], room: int) -> None:
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


def _ragged_cache(rows: Sequence[DecodeRow]) -> DynamicCache:
    """One :class:`~ripplekv.models.padded.RaggedLayer` per layer over the rows' buffers (not copied)."""
    layers = []
    for index in range(len(rows[0].buffers)):
        first_keys, first_values = rows[0].buffers[index]
        length = rows[0].lengths[index]
        like = _dynamic(first_keys[:, :, :length], first_values[:, :, :length])  # dtype and device; never attended
        buffers = [row.buffers[index] for row in rows]
        lengths = [row.lengths[index] for row in rows]
        layers.append(RaggedLayer._of(buffers, lengths, [row.valid[index] for row in rows], like))
    return cache_from_layers(layers)


def _dynamic(keys: torch.Tensor, values: torch.Tensor) -> DynamicLayer:
    return cache_from_tensors([(keys, values)]).layers[0]


STEP_COST_TOKENS = 8192
"""The fixed cost of one decoding step (reading the weights, launching every kernel), in cached tokens per row.

A batch's step costs about ``STEP_COST_TOKENS + rows x padded tokens`` (averaged over layers): the fixed cost of a
step over the cost of one cached token of one row, from the step costs in docs/results.md ("Decoding every
configuration of a prompt as one batch")."""


def _row_lengths(state: Prefill, row: int) -> list[int]:
    """Entries per layer the row occupies in a batch (head-wise masked layers compacted)."""
    lengths = [layer.get_seq_length() for layer in state.cache.layers]
    for layer, keep in _row_validity(state, row).items():
        lengths[layer] = int(keep.sum(dim=-1).max())
    return lengths


def plan_batches(states: Sequence[Prefill], max_rows: int | None = None) -> list[list[int]]:
    """Split rows into batches so that padding does not cost more than the decoding steps it saves.

    Every row of a batch is padded to the batch's longest row in each layer, and attention and cache updates cost
    in proportion to the padded size, while each step also has a fixed cost (:data:`STEP_COST_TOKENS`). Rows are
    taken from the smallest cache to the largest; a row joins the current batch when the batch's estimated step
    cost with it is at most the cost of the two apart (and the batch holds fewer than ``max_rows`` rows), else it
    starts a new batch. Caches of one prompt at 10-30% budgets, head-wise masked ones compacted, share one batch;
    the full cache of a long prompt decodes apart.

    Args:
        states: the caches.
        max_rows: most rows per batch (None: no limit).

    Returns:
        Lists of indices into ``states``, every index exactly once.
    """
    if max_rows is not None:
        _check_int("max_rows", max_rows, 1)
    _check_states(states)
    layers = len(states[0].cache.layers) if states else 1
    lengths = [_row_lengths(state, row) for row, state in enumerate(states)]

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
def batched_greedy_decode(
    model: PreTrainedModel,
    states: Sequence[Prefill],
    max_new_tokens: int,
    stop_ids: set[int],
    min_new_tokens: int = 0,
    max_rows: int | None = None,
) -> list[list[int]]:
    """Greedy tokens after each of ``states``, decoded as one batch; see the module docstring.

    Row ``i`` of the result is what ``greedy_decode(model, states[i], max_new_tokens, stop_ids, min_new_tokens)``
    returns, up to float rounding at near-ties. The model must run ripplekv's attention functions
    (``ripplekv_sdpa`` / ``ripplekv_eager``, :func:`ripplekv.models.attention.enable_varlen_attention`): under
    another implementation (FlashAttention, which is kept as loaded) this raises :class:`NotBatchableError`, and
    the caller decodes each cache alone with :func:`~ripplekv.inference.generate.greedy_decode` (exact), as
    :mod:`ripplekv.evaluation.running.rows` does.

    Args:
        model: the model the states were prefilled with.
        states: prefilled (compressed) caches of one prompt (see :func:`padded_batch`); left unchanged.
        max_new_tokens: most tokens per row (>= 1).
        stop_ids: token ids that end a row's answer (included in it).
        min_new_tokens: for a row's first ``min_new_tokens`` tokens the stop ids cannot be chosen.
        max_rows: decode at most this many rows per batch (None: no limit); bounds the memory of the padded cache.
            Rows are grouped into batches of similar lengths (:func:`plan_batches`).

    Raises:
        NotBatchableError: the caches or the model's attention implementation cannot decode as one batch.
    """
    if not uses_varlen_attention(model):
        raise NotBatchableError(unsupported_implementation_message(model, "batched decoding"))
    _check_int("max_new_tokens", max_new_tokens, 1)
    _check_int("min_new_tokens", min_new_tokens, 0)
    _check_states(states)
    _check_int("max_rows", max_rows, 1) if max_rows is not None else None
    size = len(states) if max_rows is None else max_rows
    results: list[list[int]] = []
    for start in range(0, len(states), size):
        rows = [decode_row(state, max_new_tokens) for state in states[start : start + size]]
        results.extend(batched_greedy_decode_rows(model, rows, max_new_tokens, stop_ids, min_new_tokens))
    return results


@torch.no_grad()
def batched_greedy_decode_rows(
    model: PreTrainedModel,
    rows: Sequence[DecodeRow],
    max_new_tokens: int,
    stop_ids: set[int],
    min_new_tokens: int = 0,
) -> list[list[int]]:
    """Greedy tokens after each of ``rows`` (built by :func:`decode_row`), decoded as one batch.

    What :func:`batched_greedy_decode` returns for the caches the rows were built from, as one batch.

    Args:
        model: the model the caches were prefilled with (variable-length attention enabled).
        rows: the rows, of one prompt, each with room for ``max_new_tokens``.
        max_new_tokens: most tokens per row (>= 1).
        stop_ids: token ids that end a row's answer (included in it).
        min_new_tokens: for a row's first ``min_new_tokens`` tokens the stop ids cannot be chosen.
    """
    if not can_batch(model):
        raise NotBatchableError(unsupported_implementation_message(model, "batched decoding"))
    _check_int("max_new_tokens", max_new_tokens, 1)
    _check_int("min_new_tokens", min_new_tokens, 0)
    _check_rows(rows, max_new_tokens)
    return _decode_batch(model, rows, max_new_tokens, stop_ids, min_new_tokens)


def can_batch(model: PreTrainedModel) -> bool:
    """Whether ``model`` can decode a ragged batch of caches: it runs ripplekv's attention functions, which alone read
    a batched step's ``ragged_cache`` (FlashAttention, kept as loaded, would attend each row over its new token only).
    Check it before laying caches out as decode rows: a row cannot fall back to decoding alone.

    Args:
        model: the model.
    """
    return uses_varlen_attention(model)


def _decode_batch(
    model: PreTrainedModel, rows: Sequence[DecodeRow], max_new_tokens: int, stop_ids: set[int], min_new_tokens: int
) -> list[list[int]]:
    cache = _ragged_cache(rows)
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
        logits = model(
            step,
            past_key_values=cache,
            use_cache=True,
            cache_position=pos,
            position_ids=pos.expand(len(active), 1),
            ragged_cache=cache,
        ).logits[:, -1]
        position += 1


@torch.no_grad()
def batched_teacher_forced_logprobs(
    model: PreTrainedModel, states: Sequence[Prefill], tokens: Sequence[int], max_rows: int | None = None
) -> list[torch.Tensor]:
    """:func:`~ripplekv.inference.fidelity.teacher_forced_logprobs` of the same ``tokens`` over each of ``states``.

    One forward pass of ``tokens[:-1]`` per batch of rows over their padded caches. A model that does not run
    ripplekv's attention functions (FlashAttention, kept as loaded: only those read the ``key_validity`` of a padded
    batch) teacher-forces one cache at a time instead, the same exact computation.

    Args:
        model: the model the states were prefilled with (variable-length attention enabled).
        states: prefilled (compressed) caches of one prompt (see :func:`padded_batch`); left unchanged.
        tokens: the forced tokens (at least one), the same for every row.
        max_rows: rows per pass (None: all at once); the logits of a pass take ``rows * len(tokens) * vocab``
            floats.

    Returns:
        Per state, ``(len(tokens), vocab)`` float64 log-softmax on the CPU.
    """
    if not states:
        raise ValueError("no caches to teacher-force")
    if not uses_varlen_attention(model):
        return [teacher_forced_logprobs(model, state, tokens) for state in states]
    _check_states(states)
    vocab = states[0].next_logits.shape[-1]
    ids = [int(t) for t in tokens]
    if not ids or any(not 0 <= t < vocab for t in ids):
        raise ValueError(f"tokens must be a non-empty sequence of ids in [0, {vocab})")
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
            logits = model(
                torch.tensor([ids[:-1]], device=device).expand(len(group), -1),
                past_key_values=cache,
                use_cache=True,
                cache_position=positions,
                position_ids=positions.unsqueeze(0).expand(len(group), -1),
                key_validity=validity,
            ).logits
            rest = logits.to("cpu", torch.float64)
        for index, logprobs in zip(batch, torch.log_softmax(torch.cat([first, rest], dim=1), dim=-1).unbind(0)):
            results[index] = logprobs
    return results  # type: ignore[return-value]
