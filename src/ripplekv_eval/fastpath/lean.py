"""Lean passes over a derived cache: extend, teacher-force and decode without copying the prefill record.

A derived cache (:mod:`ripplekv_eval.fastpath.derive`) may hold the record's tensors by reference. These passes run
over :class:`~ripplekv.models.cache.OverlayLayer` forks (:func:`~ripplekv.models.cache.lean_fork`), which keep the
appended tokens apart instead of a concatenated copy of every layer (one more full cache for the pass's duration).
Attention sees the very tensors the copying passes give it, so results are unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from ripplekv.inference.generate import Prefill, cache_forward, greedy_decode
from ripplekv.models.cache import lean_fork
from ripplekv_eval.fastpath.fidelity import logprob_rows

__all__ = ["lean_extend", "lean_greedy_decode", "lean_teacher_forced_logprobs"]


def _positions(state: Prefill, count: int) -> torch.Tensor:
    start = state.prompt_tokens
    return torch.arange(start, start + count, device=state.next_logits.device)


@torch.no_grad()
def lean_extend(model: PreTrainedModel, state: Prefill, input_ids: torch.Tensor) -> Prefill:
    """:func:`~ripplekv.inference.generate.extend` over a :func:`lean_fork` (same logits; ``state`` unchanged).

    The result's cache holds ``state``'s tensors by reference and the new ``(1, n)`` tokens apart; the lean passes
    and :func:`~ripplekv_eval.fastpath.batched.decode_row` take it.
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"expected new tokens of shape (1, n), n >= 1, got {tuple(input_ids.shape)}")
    positions = _positions(state, input_ids.shape[1])
    cache = lean_fork(state.cache)
    start = time.perf_counter()
    logits = cache_forward(model, input_ids.to(positions.device), cache, positions, logits_to_keep=1)
    seconds = state.seconds + time.perf_counter() - start
    return Prefill(cache, logits[0, -1], int(positions[-1]) + 1, seconds)


@torch.no_grad()
def lean_teacher_forced_logprobs(model: PreTrainedModel, state: Prefill, tokens: Sequence[int]) -> torch.Tensor:
    """:func:`~ripplekv_eval.fastpath.fidelity.teacher_forced_logprobs` over a :func:`lean_fork` (same result)."""
    vocab = state.next_logits.shape[-1]
    ids = [int(t) for t in tokens]
    if not ids or any(not 0 <= t < vocab for t in ids):
        raise ValueError(f"tokens must be a non-empty sequence of ids in [0, {vocab})")
    if len(ids) == 1:
        return logprob_rows(state.next_logits, None)
    positions = _positions(state, len(ids) - 1)
    logits = cache_forward(model, torch.tensor([ids[:-1]], device=positions.device), lean_fork(state.cache), positions)
    return logprob_rows(state.next_logits, logits[0])


@torch.no_grad()
def lean_greedy_decode(
    model: PreTrainedModel, state: Prefill, max_new_tokens: int, stop_ids: set[int], min_new_tokens: int = 0
) -> list[int]:
    """:func:`~ripplekv.inference.generate.greedy_decode` over a :func:`lean_fork` (same tokens)."""
    return greedy_decode(model, state, max_new_tokens, stop_ids, min_new_tokens, fork=lean_fork)
