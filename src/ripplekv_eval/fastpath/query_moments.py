"""ExpectedAttention's query statistics accumulated chunk by chunk, so a record never keeps the prompt's hidden states.

kvpress's :class:`~kvpress.ExpectedAttentionPress` (Devoto et al., "Expected Attention: KV cache compression by
estimating attention from future queries distribution", 2025; kvpress ``presses/expected_attention_press.py``)
scores a layer's keys from the mean ``mu`` and the covariance ``cov`` of its pre-RoPE queries over every prompt
position after the ``n_sink`` first, in one pass over the layer's whole input::

    q = get_prerope_query_states(module, hidden_states[:, n_sink:])      # (batch, heads, n, head_dim)
    mu = q.mean(positions);  cov = (q - mu)^T (q - mu) / n               # per head
    mu, cov = apply_avg_rope(module, mu, cov, prompt_tokens)             # averaged over the next positions

Reading every position is what made a prefill record keep every layer's hidden states for it (``n_tokens *
n_layers * hidden_size`` elements: 32 GiB at 128K tokens on Llama-3.1-8B in bf16, twice its KV cache). A record
computes the scores instead while the prefill runs (:func:`~ripplekv_eval.fastpath.record.record_prefill`'s
``prescore``): in one pass by kvpress's own ``score`` on the layer's input (bit for bit what deriving from every
hidden state gives); in a chunked prefill from :class:`QueryMoments`, which merges each chunk's count, mean and
centred second moment (Chan, Golub and LeVeque's pairwise update, "Updating formulae and a pairwise algorithm for
computing sample variances", 1979): each chunk's moments in float32 (float64 for a float64 model) around its own
mean, merged in float64, so no sum of squares around zero loses the variance to cancellation and nothing of the
chunk is kept. Scores then come from :class:`MomentsExpectedAttentionPress`, kvpress's press with the statistics
read from the moments and every later step (the averaged RoPE, the expected attention, the value norms, the
sinks) kvpress's own.

Numerics: the moments are exact to float64 rounding of float32 chunk sums, at least as exact as kvpress's one
pass in the model's dtype (in bf16 its mean and covariance are bf16 reductions); ``mu`` and ``cov`` are then
rounded to the queries' dtype, which kvpress computes them in. Chunked and one-pass scores therefore agree to the
rounding of that dtype, not bit for bit (tested).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from kvpress import ExpectedAttentionPress
from kvpress.utils import get_prerope_query_states
from torch import nn

__all__ = ["MomentsExpectedAttentionPress", "QueryMoments"]


@dataclass
class QueryMoments:
    """Count, mean and centred second moment of one layer's pre-RoPE queries, merged chunk by chunk.

    Args:
        n_sink: leading prompt positions left out (ExpectedAttention's ``n_sink``: attention sinks, whose queries
            are outliers).
    """

    n_sink: int
    count: int = 0
    mean: torch.Tensor | None = field(default=None, repr=False)  # (batch, heads, head_dim), float64
    m2: torch.Tensor | None = field(default=None, repr=False)  # (batch, heads, head_dim, head_dim), float64
    dtype: torch.dtype | None = None  # the queries' dtype, which kvpress computes the statistics in

    def __post_init__(self) -> None:
        if isinstance(self.n_sink, bool) or not isinstance(self.n_sink, int) or self.n_sink < 0:
            raise ValueError(f"n_sink must be an integer >= 0, got {self.n_sink!r}")

    @torch.no_grad()
    def update(self, module: nn.Module, hidden_states: torch.Tensor, start: int) -> None:
        """Merge the queries of the prompt positions ``[start, start + n)`` that ``hidden_states`` holds.

        Args:
            module: the attention module (its query projection).
            hidden_states: the layer's input at those positions, ``(batch, n, hidden)``.
            start: the prompt position of ``hidden_states[:, 0]``.
        """
        skip = max(0, self.n_sink - start)
        if skip >= hidden_states.shape[1]:
            return
        queries = get_prerope_query_states(module, hidden_states[:, skip:])
        self.dtype = queries.dtype
        queries = queries.to(torch.promote_types(queries.dtype, torch.float32))  # bf16 / fp16 chunks in float32
        n = queries.shape[2]
        chunk_mean = queries.mean(dim=2)
        centred = queries - chunk_mean.unsqueeze(2)
        chunk_m2 = torch.einsum("bhsi,bhsj->bhij", centred, centred).double()
        chunk_mean = chunk_mean.double()
        if self.mean is None or self.m2 is None:
            self.count, self.mean, self.m2 = n, chunk_mean, chunk_m2
            return
        total = self.count + n
        delta = chunk_mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + chunk_m2 + torch.einsum("bhi,bhj->bhij", delta, delta) * (self.count * n / total)
        self.count = total

    def statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mu, cov)`` as kvpress's ``get_query_statistics`` computes them before RoPE, in the queries' dtype.

        Raises:
            ValueError: when no position after the sinks was merged.
        """
        if self.mean is None or self.m2 is None or self.dtype is None:
            raise ValueError(f"no query after the first {self.n_sink} prompt positions was merged")
        return self.mean.to(self.dtype), (self.m2 / self.count).to(self.dtype)


@dataclass
class MomentsExpectedAttentionPress(ExpectedAttentionPress):
    """kvpress's ExpectedAttention with its query statistics read from :class:`QueryMoments` of the whole prompt.

    ``score`` is kvpress's; only ``get_query_statistics`` changes: the mean and covariance come from ``moments``
    (merged over the prompt's chunks, so the ``hidden_states`` it is given are not read) and the averaged RoPE is
    applied at the prompt's length, as kvpress does after a one-pass prefill.

    Args:
        moments: the layer's query moments over the prompt (their ``n_sink`` must be the press's).
        prompt_tokens: the prompt's length (the first future position of the averaged RoPE).
        (the other fields: :class:`~kvpress.ExpectedAttentionPress`'s.)
    """

    moments: QueryMoments | None = None
    prompt_tokens: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.moments is None:
            raise ValueError("MomentsExpectedAttentionPress needs the layer's QueryMoments")
        if self.moments.n_sink != self.n_sink:
            raise ValueError(f"the moments leave out {self.moments.n_sink} sink positions, the press {self.n_sink}")
        if isinstance(self.prompt_tokens, bool) or not isinstance(self.prompt_tokens, int) or self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be an integer >= 1, got {self.prompt_tokens!r}")

    def get_query_statistics(
        self, module: nn.Module, hidden_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The moments' mean and covariance (None without ``use_covariance``), RoPE-averaged at the prompt's end.

        Args:
            module: the attention module (its rotary embedding).
            hidden_states: not read (the statistics are the whole prompt's).
        """
        if self.moments is None:
            raise ValueError("MomentsExpectedAttentionPress needs the layer's QueryMoments")
        mu, cov = self.moments.statistics()
        return self.apply_avg_rope(module, mu, cov if self.use_covariance else None, self.prompt_tokens)
