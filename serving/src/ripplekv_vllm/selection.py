"""SnapKV token selection of the RippleKV vLLM plugin: per KV head, which prompt tokens a tier keeps.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) ranks a
layer's prompt tokens with SnapKV's scorer (Li et al., 2024) and keeps the layer's budget of them. The scores are
kvpress 0.5.5's ``SnapKVPress.score``, operation for operation, so the plugin keeps what the library keeps:

1. the last ``w`` queries attend to all ``N`` keys (scaled dot product, causal inside the window, softmax in
   float32), and only the first ``N - w`` keys are scored;
2. the attention is averaged over the window's queries, smoothed by ``avg_pool1d(kernel, stride 1, padding
   kernel // 2)`` (padding counted, as ``F.avg_pool1d``'s default), then averaged over the query heads of each KV
   head (grouped-query attention);
3. the window itself is always kept.

:func:`kept_indices` then picks, per KV head, the ``k`` tokens of ``[0, T)`` the plugin compacts into the first
``k / bs`` blocks: every window position below ``T`` and the highest-scored of ``[0, N - w)``. With the tail
``[T, N)`` (kept in place) that is SnapKV's selection at the budget ``k + N - T`` whenever the tail lies inside the
window (``N - T <= w``, always true for ``window >= block_size``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["kept_indices", "snapkv_scores"]


def snapkv_scores(query: torch.Tensor, key: torch.Tensor, window: int, kernel_size: int) -> torch.Tensor:
    """SnapKV scores ``[H, N - w]`` of the first ``N - w`` prompt tokens, for each KV head (kvpress's formula).

    The logits are divided by ``sqrt(D)`` as kvpress divides them, whatever scale the model's attention uses.

    Args:
        query: the prompt's last ``w`` post-RoPE queries, ``[w, HQ, D]``.
        key: the prompt's ``N`` post-RoPE keys, ``[N, H, D]`` (``HQ`` a multiple of ``H``).
        window: ``w``, the observation window (``1 <= w < N``).
        kernel_size: the pooling kernel (odd).
    """
    num_tokens, kv_heads, head_dim = key.shape
    if not 1 <= window < num_tokens or query.shape[0] != window:
        raise ValueError(f"a window of {window} queries ({query.shape[0]} given) needs more than {num_tokens} keys")
    groups = query.shape[1] // kv_heads
    q = query.float().transpose(0, 1)  # [HQ, w, D]
    k = key.float().repeat_interleave(groups, dim=1).transpose(0, 1)  # [HQ, N, D]
    logits = torch.matmul(q, k.transpose(1, 2)) / math.sqrt(head_dim)  # [HQ, w, N]
    rows = torch.arange(window)[:, None] + (num_tokens - window)
    future = torch.arange(num_tokens)[None, :] > rows  # query i of the window sees keys <= N - w + i
    attention = logits.masked_fill(future, float("-inf")).softmax(dim=-1)[..., : num_tokens - window]
    pooled = F.avg_pool1d(attention.mean(dim=1), kernel_size=kernel_size, padding=kernel_size // 2, stride=1)
    return pooled.view(kv_heads, groups, num_tokens - window).mean(dim=1)


def kept_indices(scores: torch.Tensor, num_tokens: int, kept: int, full: int) -> torch.Tensor:
    """Sorted positions ``[k, H]`` of ``[0, T)`` kept per KV head: the window below ``T`` and the top scores.

    Args:
        scores: :func:`snapkv_scores` of the first ``N - w`` tokens, ``[H, N - w]``.
        num_tokens: the prompt length ``N``.
        kept: ``k``, the tokens to keep from ``[0, T)`` (at least the window's positions below ``T``).
        full: ``T``, the end of the prompt's full blocks.
    """
    kv_heads, scored = scores.shape
    candidates = scores[:, : min(scored, full)]
    if full > scored:  # window positions below T: always kept
        forced = torch.full((kv_heads, full - scored), float("inf"), dtype=scores.dtype)
        candidates = torch.cat([candidates, forced], dim=1)
    if not full - scored <= kept <= full:
        raise ValueError(f"cannot keep {kept} of {full} tokens when {max(full - scored, 0)} are forced")
    return candidates.topk(kept, dim=-1).indices.sort(dim=-1).values.T.contiguous()
