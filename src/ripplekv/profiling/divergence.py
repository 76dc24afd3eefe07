"""The two profiling signals, computed exactly: KL divergence of next-token distributions, relative change.

Both are small numbers (a layer's KL under noise is often 1e-5 to 1e-3 nats), measured as the difference of
two large ones, so they are computed in float64 from the outputs they are given, whatever their dtype. The
profiling passes give them float32 logits and attention outputs whatever the model's dtype
(:mod:`ripplekv.profiling.passes`): float64 here cannot undo a rounding already done, and bfloat16 logits
(a multiple of 0.06 at magnitude 16) would carry a KL noise of ~1e-4 nats.

Why not float32: ``KL(P || Q) = sum_v p_v (log p_v - log q_v)``. Written as ``sum p log p - (sum p z -
logsumexp z)`` from raw logits ``z`` (a common shortcut), it relies on ``sum_v p_v = 1``; in float32 over a
49,152-token vocabulary the sum is off by up to ~1e-5 while ``logsumexp z`` is ~27 for SmolLM2, an offset of
~2e-4 nats per position: as large as the signal, and made layer-dependent by any clamp at zero applied per
position. Here both distributions go through ``log_softmax`` in float64 and the difference is taken term by
term, so identical logits give exactly 0 and the rounding error is ~1e-16 relative. No clamp is applied:
the per-position KL is a sum of non-negative-expectation terms whose float64 error is far below any signal
(callers may clamp an *average* at zero; clamping per position would bias it).
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
    """Next-token distributions to compare others with: their float64 log-probabilities, computed once.

    Args:
        logits: ``(rows, positions, vocab)`` reference logits (any float dtype); a single row is compared
            with every row of the logits given to :meth:`kl`.
    """

    def __init__(self, logits: torch.Tensor) -> None:
        if logits.dim() != 3:
            raise ValueError(f"reference logits must be (rows, positions, vocab), got {logits.dim()}D")
        self.logp = torch.log_softmax(logits.to(torch.float64), dim=-1)
        self.p = self.logp.exp()

    def kl(self, logits: torch.Tensor) -> torch.Tensor:
        """``KL(P_ref || softmax(logits))`` per row, averaged over positions, in float64.

        Args:
            logits: ``(rows, positions, vocab)`` logits of the compared distributions.

        Returns:
            ``(rows,)`` float64 tensor: for each row, the mean over positions of ``sum_v p_v (log p_v - log q_v)``
            with both log-probabilities from ``log_softmax`` in float64. Not clamped.
        """
        _check_pair(self.logp, logits, "kl_divergence")
        diff = self.logp - torch.log_softmax(logits.to(torch.float64), dim=-1)
        per_position = (self.p * diff).sum(-1)
        if torch.isnan(per_position).any():  # -inf logits (masked tokens) on both sides: 0 * log 0 = 0
            zero = torch.zeros((), dtype=torch.float64, device=diff.device)
            per_position = torch.where(self.p > 0, self.p * diff, zero).sum(-1)
        return per_position.mean(-1)


def kl_divergence(reference_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``KL(softmax(reference_logits) || softmax(logits))`` per row, averaged over positions, in float64.

    Args:
        reference_logits: ``(1, positions, vocab)`` or ``(rows, positions, vocab)`` logits of the reference
            distributions (any float dtype); one row is broadcast to every row of ``logits``.
        logits: ``(rows, positions, vocab)`` logits of the compared distributions.

    Returns:
        ``(rows,)`` float64 tensor: for each row, the mean over positions of ``sum_v p_v (log p_v - log q_v)``
        with ``log p`` and ``log q`` from ``log_softmax`` in float64. Not clamped (see the module docstring).
    """
    _check_pair(reference_logits, logits, "kl_divergence")
    return ReferenceDistribution(reference_logits).kl(logits)


def relative_change(reference: torch.Tensor, perturbed: torch.Tensor) -> torch.Tensor:
    """``||perturbed - reference|| / ||reference||`` along the last dimension, per row, averaged over positions.

    The paper's ``local`` ablation signal: how much a layer's own attention output moves under the noise.

    Args:
        reference: ``(1, positions, hidden)`` or ``(rows, positions, hidden)`` clean outputs.
        perturbed: ``(rows, positions, hidden)`` perturbed outputs.

    Returns:
        ``(rows,)`` float64 tensor (positions whose reference is exactly zero divide by the smallest normal
        float64 instead of zero).
    """
    _check_pair(reference, perturbed, "relative_change")
    reference = reference.to(torch.float64)
    delta = (perturbed.to(torch.float64) - reference).norm(dim=-1)
    return (delta / reference.norm(dim=-1).clamp_min(torch.finfo(torch.float64).tiny)).mean(-1)
