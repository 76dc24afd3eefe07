"""Decode (or teacher-force) every compressed cache of one prompt as one batch.

An evaluation derives one compressed cache per (method, budget) from the same prefill. Decoding them one at a
time costs one forward pass per token per configuration, and on a CPU a decoding step of a small model is mostly
fixed cost (reading the weights; the step costs are in docs/results.md). Here the caches run as one batch, laid out
by :mod:`ripplekv_eval.fastpath.batch_layout` (whose names are importable from here too):

* **decoding** (:func:`batched_greedy_decode`): every row keeps its own length (a ragged batch, one
  :class:`~ripplekv.models.padded.RaggedLayer` per layer). The embeddings, projections and MLPs of a step run
  batched over all rows (the weights are read once per step), and attention runs row by row over exactly that
  row's own entries, so no row pays for another's length;
* **teacher forcing** (:func:`batched_teacher_forced_logprobs`): one pass of the forced tokens per padded batch,
  rows grouped by a step-cost model (:func:`~ripplekv_eval.fastpath.batch_layout.plan_batches`) so padding stays cheap;
* every row runs at the same positions (the caches come from one prompt); a row that generates a stop token or
  reaches ``max_new_tokens`` leaves the batch, which shrinks to the rows still decoding.

Padding every row to the longest cache was tried for decoding first and was slower than one row at a time at 4K
tokens (attention and cache updates are memory-bound and cost what the padded size holds); see docs/results.md.

The result is the same greedy tokens as :func:`~ripplekv.inference.generate.greedy_decode` on each cache alone,
up to float rounding: a batched matrix product and a longer (masked) reduction may round differently, which can
flip a greedy choice only where the two best logits are within rounding of each other (none did in the benchmark).
``benchmarks/batched_decode.py`` counts such rows and prints the logit margin at which each one diverged.

Caches that cannot be batched raise :class:`NotBatchableError` (see :mod:`ripplekv_eval.fastpath.batch_layout`), and so
does a model that does not run ripplekv's attention functions
(:func:`~ripplekv.models.attention.uses_varlen_attention`), which alone read the ragged cache of a batched
decoding step: FlashAttention, kept as loaded, attends over per-layer caches correctly one cache at a time, but
would attend each row over nothing but its new token here. Batched teacher forcing falls back to one cache at a
time under such a model itself.

Devices: every tensor is made on the device of the caches and logits it is combined with. Each decoding step reads
the greedy picks on the host once (to stop rows at their stop tokens); nothing else synchronises per step.

Memory: :func:`batched_greedy_decode_rows` decodes rows a caller laid out itself
(:func:`~ripplekv_eval.fastpath.batch_layout.decode_row`, sized beforehand by
:func:`~ripplekv_eval.fastpath.batch_layout.row_bytes`) in groups bounded by memory; :func:`batched_greedy_decode`
builds the rows of one ``max_rows`` batch at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from ripplekv.inference.generate import Prefill, cache_forward
from ripplekv.models.attention import unsupported_implementation_message, uses_varlen_attention
from ripplekv.models.cache import cache_from_layers
from ripplekv_eval.fastpath.batch_layout import (
    STEP_COST_TOKENS,
    DecodeRow,
    NotBatchableError,
    check_count,
    check_rows,
    check_states,
    decode_row,
    padded_batch,
    plan_batches,
    ragged_batch,
    ragged_cache_of,
    row_bytes,
)
from ripplekv_eval.fastpath.fidelity import teacher_forced_logprobs

__all__ = [
    "batched_greedy_decode",
    "batched_greedy_decode_rows",
    "batched_teacher_forced_logprobs",
    "can_batch",
    # re-exported, imported from here across the package: the layout of the batches (batch_layout)
    "STEP_COST_TOKENS",
    "DecodeRow",
    "NotBatchableError",
    "decode_row",
    "padded_batch",
    "plan_batches",
    "ragged_batch",
    "row_bytes",
]


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
    :mod:`ripplekv_eval.running.rows` does.

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
    check_count("max_new_tokens", max_new_tokens, 1)
    check_count("min_new_tokens", min_new_tokens, 0)
    check_states(states)
    check_count("max_rows", max_rows, 1) if max_rows is not None else None
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
    check_count("max_new_tokens", max_new_tokens, 1)
    check_count("min_new_tokens", min_new_tokens, 0)
    check_rows(rows, max_new_tokens)
    return _decode_batch(model, rows, max_new_tokens, stop_ids, min_new_tokens)


def can_batch(model: PreTrainedModel) -> bool:
    """Whether ``model`` can decode a ragged batch of caches: it runs ripplekv's attention functions, which alone read
    a batched step's ragged cache (FlashAttention, kept as loaded, would attend each row over its new token only).
    Check it before laying caches out as decode rows: a row cannot fall back to decoding alone.

    Args:
        model: the model.
    """
    return uses_varlen_attention(model)


def _decode_batch(
    model: PreTrainedModel, rows: Sequence[DecodeRow], max_new_tokens: int, stop_ids: set[int], min_new_tokens: int
) -> list[list[int]]:
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
    check_states(states)
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
            ids_rows = torch.tensor([ids[:-1]], device=device).expand(len(group), -1)
            logits = cache_forward(model, ids_rows, cache, positions, key_validity=validity)
            rest = logits.to("cpu", torch.float64)
        for index, logprobs in zip(batch, torch.log_softmax(torch.cat([first, rest], dim=1), dim=-1).unbind(0)):
            results[index] = logprobs
    return results  # type: ignore[return-value]
