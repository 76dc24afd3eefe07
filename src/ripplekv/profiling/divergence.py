"""The two profiling signals, computed exactly: KL divergence of next-token distributions, relative change.

A layer's KL under noise is often 1e-5 to 1e-3 nats, so both are computed in float64, KL term by term from both
sides' ``log_softmax``: identical logits give exactly 0. The float32 shortcut ``sum p log p - (sum p z -
logsumexp z)`` relies on ``sum p = 1``, off by ~1e-5 over SmolLM2's 49,152-token vocabulary with ``logsumexp z``
~27: ~2e-4 nats per position, as large as the signal. Nothing is clamped here (clamping per position would bias the
average; callers clamp averages).
"""

from __future__ import annotations

import torch


def _check_pair(reference: torch.Tensor, other: torch.Tensor, what: str) -> None:
    if reference.dim() != 3 or other.dim() != 3:
        raise ValueError(f"{what} must be (rows, positions, size) tensors, got {reference.dim()}D and {other.dim()}D")
    if reference.shape[1:] != other.shape[1:] or reference.shape[0] not in (1, other.shape[0]):
        raise ValueError(
            f"{what}: reference {tuple(reference.shape)} does not match {tuple(other.shape)} "
            "(the reference has 1 row or as many rows, and the same positions and size)"
        )


class ReferenceDistribution:
    """Next-token distributions ``(rows, positions, vocab)`` to compare others with, as float64 log-probabilities
    computed once; a single row is compared with every row."""

    def __init__(self, logits: torch.Tensor) -> None:
        if logits.dim() != 3:
            raise ValueError(f"reference logits must be (rows, positions, vocab), got {logits.dim()}D")
        self.logp = torch.log_softmax(logits.to(torch.float64), dim=-1)
        self.p = self.logp.exp()

    def kl(self, logits: torch.Tensor) -> torch.Tensor:
        """``(rows,)``: ``KL(P_ref || softmax(logits))`` per row, averaged over positions, in float64; not clamped."""
        _check_pair(self.logp, logits, "kl_divergence")
        diff = self.logp - torch.log_softmax(logits.to(torch.float64), dim=-1)
        per_position = (self.p * diff).sum(-1)
        if torch.isnan(per_position).any():  # -inf logits (masked tokens) on both sides: 0 * log 0 = 0
            zero = torch.zeros((), dtype=torch.float64, device=diff.device)
            per_position = torch.where(self.p > 0, self.p * diff, zero).sum(-1)
        return per_position.mean(-1)


def kl_divergence(reference_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``(rows,)``: ``KL(softmax(reference_logits) || softmax(logits))`` per row, averaged over positions, in
    float64; a one-row reference is broadcast."""
    _check_pair(reference_logits, logits, "kl_divergence")
    return ReferenceDistribution(reference_logits).kl(logits)


def relative_change(reference: torch.Tensor, perturbed: torch.Tensor) -> torch.Tensor:
    """``(rows,)``: ``||perturbed - reference|| / ||reference||`` over the last dimension, averaged over positions.

    The paper's ``local`` ablation signal. A zero reference divides by the smallest normal float64.
    """
    _check_pair(reference, perturbed, "relative_change")
    reference = reference.to(torch.float64)
    delta = (perturbed.to(torch.float64) - reference).norm(dim=-1)
    return (delta / reference.norm(dim=-1).clamp_min(torch.finfo(torch.float64).tiny)).mean(-1)
