"""ExpectedAttention's query statistics accumulated chunk by chunk, so a record never keeps the prompt's hidden states.

kvpress's ExpectedAttention (Devoto et al., 2025) scores keys from the mean and covariance of a layer's pre-RoPE
queries over every prompt position after ``n_sink``; keeping every hidden state for it costs 32 GiB at 128K tokens
on Llama-3.1-8B in bf16. :class:`QueryMoments` merges each chunk's moments instead (Chan, Golub and LeVeque, 1979):
float32 per chunk around its own mean, merged in float64, so scores agree with kvpress's one pass to the rounding of
the queries' dtype (not bit for bit; tested).
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
        n_sink: leading prompt positions left out (ExpectedAttention's attention sinks, whose queries are outliers).
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
        """Merge the queries of the prompt positions ``[start, start + n)`` that ``hidden_states`` holds."""
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

    Only ``get_query_statistics`` changes: the moments replace the ``hidden_states`` it is given, and the averaged RoPE
    is applied at ``prompt_tokens``, as kvpress does after a one-pass prefill. ``moments.n_sink`` must be the press's.
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
        """The moments' mean and covariance (None without ``use_covariance``), RoPE-averaged at the prompt's end."""
        if self.moments is None:
            raise ValueError("MomentsExpectedAttentionPress needs the layer's QueryMoments")
        mu, cov = self.moments.statistics()
        return self.apply_avg_rope(module, mu, cov if self.use_covariance else None, self.prompt_tokens)
