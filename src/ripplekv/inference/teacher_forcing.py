"""Teacher forcing over a cache and the KL of two teacher-forced distributions: the fidelity of a compressed cache to
the full cache that ``ripplekv profile`` chooses RippleKV's setting by and the evaluation harness reports
(``ripplekv_eval.fastpath.fidelity`` builds its scores on these).

Log-probabilities are float64 on the CPU, normalised in blocks of rows (:func:`row_blocks`); the KL is taken term by
term, ``p_ref (log p_ref - log p_cand)``, with no clamping.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from ripplekv.inference.generate import Prefill, cache_forward
from ripplekv.models.cache import fork_cache

ROW_BLOCK = 2
"""Rows of ``(positions, vocab)`` float64 tensors computed at once."""


def row_blocks(rows: int) -> list[tuple[int, int]]:
    """``(start, end)`` blocks of :data:`ROW_BLOCK` rows covering ``rows`` (>= 1) rows, none of a single row.

    A lone last row joins the block before it: a one-row CPU reduction may be split across threads (another summation
    order), where a block of several rows reduces each row whole, as the whole tensor does.
    """
    if rows <= ROW_BLOCK:
        return [(0, rows)]
    blocks = [(start, min(start + ROW_BLOCK, rows)) for start in range(0, rows, ROW_BLOCK)]
    if blocks[-1][1] - blocks[-1][0] == 1:
        blocks[-2:] = [(blocks[-2][0], rows)]
    return blocks


def logprob_rows(next_logits: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
    """``log_softmax`` in float64, on the CPU, of ``next_logits`` (``(vocab,)``) then the rows of ``logits``.

    The values of ``torch.log_softmax(torch.cat([next_logits[None], logits]).to("cpu", torch.float64), -1)``,
    normalised in place by :func:`row_blocks`: at most the ``(1 + n, vocab)`` result and ``logits`` are held at once.
    """
    vocab = next_logits.shape[-1]
    rows = 1 + (0 if logits is None else int(logits.shape[0]))
    out = torch.empty((rows, vocab), dtype=torch.float64, device="cpu")
    out[0].copy_(next_logits.reshape(vocab))
    if logits is not None:
        out[1:].copy_(logits)
    for start, end in row_blocks(rows):
        out[start:end] = torch.log_softmax(out[start:end], dim=-1)
    return out


def check_tokens(tokens: Sequence[int], vocab: int) -> list[int]:
    """``tokens`` as a list of ints; ValueError when empty or outside the vocabulary."""
    ids = [int(t) for t in tokens]
    if not ids:
        raise ValueError("tokens is empty: teacher forcing needs at least one token")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"token ids {bad[:5]} are outside the vocabulary of {vocab}")
    return ids


@torch.no_grad()
def teacher_forced_logprobs(
    model: PreTrainedModel,
    state: Prefill,
    tokens: Sequence[int],
    fork: Callable[[DynamicCache], DynamicCache] = fork_cache,
) -> torch.Tensor:
    """``(len(tokens), vocab)`` float64 CPU log-probabilities along ``tokens`` forced after the prompt of ``state``.

    Row 0 is ``state.next_logits``, the others one forward pass of ``tokens[:-1]`` over ``fork(state.cache)`` (the
    cache left unchanged; :func:`~ripplekv.models.cache.lean_fork` never copies it, same values).
    """
    vocab = state.next_logits.shape[-1]
    ids = check_tokens(tokens, vocab)
    if len(ids) > 1:
        device = state.next_logits.device
        positions = torch.arange(state.prompt_tokens, state.prompt_tokens + len(ids) - 1, device=device)
        logits = cache_forward(model, torch.tensor([ids[:-1]], device=device), fork(state.cache), positions)
        if logits.shape[1] != len(ids) - 1:
            raise ValueError(f"the model returned logits for {logits.shape[1]} of {len(ids) - 1} positions")
        return logprob_rows(state.next_logits, logits[0])
    return logprob_rows(state.next_logits, None)


def check_logprobs(name: str, logprobs: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
    """``logprobs`` in float64 once checked to be a ``(len(tokens), vocab)`` floating-point tensor."""
    if not isinstance(logprobs, torch.Tensor) or logprobs.dim() != 2:
        raise ValueError(f"{name} must be a (positions, vocab) tensor of log-probabilities")
    if not logprobs.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {logprobs.dtype}")
    if logprobs.shape[0] != len(tokens):
        raise ValueError(f"{name} has {logprobs.shape[0]} rows for {len(tokens)} tokens")
    return logprobs.to(torch.float64)


def mean_kl(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """The mean over positions of ``KL(reference_i || candidate_i)`` in nats, both ``(positions, vocab)`` float64
    log-probabilities of one shape (:func:`teacher_forced_logprobs`); terms with ``p_ref(v) = 0`` contribute 0."""
    if reference.shape != candidate.shape:
        raise ValueError(f"reference {tuple(reference.shape)} and candidate {tuple(candidate.shape)} differ in shape")
    sums = torch.empty(reference.shape[0], dtype=torch.float64, device=reference.device)
    zero = torch.zeros((), dtype=torch.float64, device=reference.device)
    for start, end in row_blocks(reference.shape[0]):  # the whole tensor's values, one block's temporaries
        block, other = reference[start:end], candidate[start:end]
        p = block.exp()
        sums[start:end] = torch.where(p > 0, p * (block - other), zero).sum(dim=-1)
    return float(sums.mean())
