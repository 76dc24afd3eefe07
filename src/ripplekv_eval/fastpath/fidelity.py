"""Fidelity of a compressed cache to the full cache: teacher-forced next-token distributions compared.

The full cache's greedy answer is teacher-forced over the full and a compressed cache; per position, the mean
``KL(reference || candidate)`` in nats and top-1 agreement (also the mean NLL of a gold answer). All float64, no
clamping, in blocks of rows (:func:`row_blocks`). Teacher forcing and the KL live in the library
(:mod:`ripplekv.inference.teacher_forcing`, which ``ripplekv profile`` chooses RippleKV's setting with); their names
are importable from here as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ripplekv.inference.teacher_forcing import (
    ROW_BLOCK,
    check_logprobs,
    check_tokens,
    logprob_rows,
    mean_kl,
    row_blocks,
    teacher_forced_logprobs,
)

__all__ = [
    "ROW_BLOCK",
    "Fidelity",
    "check_tokens",
    "fidelity",
    "logprob_rows",
    "mean_nll",
    "row_blocks",
    "teacher_forced_logprobs",
]


@dataclass(frozen=True)
class Fidelity:
    """How closely a candidate cache's next-token distributions follow the reference's along an answer."""

    kl: float  # mean over positions of KL(reference_i || candidate_i), nats
    top1: float  # fraction of positions where the candidate's argmax is the answer's token
    positions: int

    def __post_init__(self) -> None:
        if self.positions < 1:
            raise ValueError(f"positions must be >= 1, got {self.positions}")
        if not 0.0 <= self.top1 <= 1.0:
            raise ValueError(f"top1 must be in [0, 1], got {self.top1}")


def fidelity(reference: torch.Tensor, candidate: torch.Tensor, tokens: Sequence[int]) -> Fidelity:
    """Mean KL divergence and top-1 agreement of ``candidate`` against ``reference`` along ``tokens``.

    Both are ``(positions, vocab)`` log-probabilities (:func:`teacher_forced_logprobs`) over the reference (full) and
    candidate (compressed) cache; ``tokens[i]`` is the token at row ``i``, usually the reference's greedy answer.
    Terms with ``p_ref(v) = 0`` contribute 0 to the KL.
    """
    ref = check_logprobs("reference", reference, tokens)
    cand = check_logprobs("candidate", candidate, tokens)
    ids = check_tokens(tokens, ref.shape[-1])
    kl = mean_kl(ref, cand)
    target = torch.tensor(ids, device=cand.device)
    top1 = float((cand.argmax(dim=-1) == target).to(torch.float64).mean())
    return Fidelity(kl=kl, top1=top1, positions=len(ids))


def mean_nll(logprobs: torch.Tensor, tokens: Sequence[int]) -> float:
    """Mean negative log-likelihood of teacher-forced ``tokens``: ``mean_i -logprobs[i, tokens[i]]``."""
    rows = check_logprobs("logprobs", logprobs, tokens)
    ids = check_tokens(tokens, rows.shape[-1])
    index = torch.tensor(ids, device=rows.device).unsqueeze(1)
    return float(-rows.gather(1, index).mean())
