"""Attention of many batch rows over one shared cached prefix, without copying the prefix per row.

The prefix part (one call per KV head, with its log-sum-exp) and each row's own causal new tokens are merged into
one softmax through their log-sum-exps. A row's value delta (noise) costs one extra product by linearity:
``softmax(QK^T) (V + D) = softmax(QK^T) V + softmax(QK^T) D``. Passed as ``shared_prefix=SharedPrefix(...)``
over a :class:`~ripplekv.models.cache.PassThroughLayer` cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MAX_SCORE_BYTES = 256 * 2**20  # rows are processed in chunks whose prefix scores stay under this size


@dataclass(frozen=True)
class SharedPrefix:
    """The ``(1, kv_heads, prefix, dim)`` cached keys and values of one layer, shared by every row of the batch.

    ``value_delta`` ``(rows, kv_heads, prefix, dim)``: the last ``rows`` rows see ``values + value_delta[row]``.
    """

    keys: torch.Tensor
    values: torch.Tensor
    value_delta: torch.Tensor | None = None


def shared_prefix_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    prefix: SharedPrefix,
    scaling: float | None = None,
) -> torch.Tensor:
    """Attention of ``query`` ``(batch, heads, new, dim)`` over ``prefix`` then each row's own new tokens (causal).

    Returns ``(batch, new, heads, dim)``, the layout transformers' attention functions return.
    """
    batch, heads, new, dim = query.shape
    kv_heads, length = prefix.keys.shape[1], prefix.keys.shape[2]
    groups = heads // kv_heads
    scale = scaling if scaling is not None else 1.0 / math.sqrt(dim)
    delta_rows = 0 if prefix.value_delta is None else prefix.value_delta.shape[0]
    row_bytes = kv_heads * groups * new * length * 4
    chunk = max(1, MAX_SCORE_BYTES // max(row_bytes, 1))
    outputs = []
    for start in range(0, batch, chunk):
        stop = min(batch, start + chunk)
        delta = None
        if delta_rows and stop > batch - delta_rows:
            first = max(start, batch - delta_rows)
            delta = (first - start, prefix.value_delta[first - (batch - delta_rows) : stop - (batch - delta_rows)])
        outputs.append(_attend(query[start:stop], key[start:stop], value[start:stop], prefix, scale, groups, delta))
    return torch.cat(outputs, dim=0) if len(outputs) > 1 else outputs[0]


def _prefix_part(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` (kv_heads, rows, dim) over one prefix: (output, log-sum-exp of the scores)."""
    if q.device.type == "cpu" and _FLASH_CPU is not None:
        # torch's fused CPU kernel returns the log-sum-exp as well: no (rows x prefix) score matrix in memory
        out, lse = _FLASH_CPU(q[None], keys[None], values[None], 0.0, False, attn_mask=None, scale=scale)
        return out[0], lse[0]
    scores = torch.bmm(q, keys.transpose(1, 2)).mul_(scale)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.bmm(scores.sub_(lse[..., None]).exp_(), values), lse


_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    prefix: SharedPrefix,
    scale: float,
    groups: int,
    delta: tuple[int, torch.Tensor] | None,
) -> torch.Tensor:
    batch, heads, new, dim = query.shape
    kv_heads = prefix.keys.shape[1]
    # (kv_heads, batch, groups, new, dim): the rows of one KV head are contiguous, so one call per KV head
    # attends every row of the batch to that head's prefix.
    q = query.float().view(batch, kv_heads, groups, new, dim).permute(1, 0, 2, 3, 4).contiguous()
    keys, values = prefix.keys[0].float(), prefix.values[0].float()
    out, lse = _prefix_part(q.view(kv_heads, batch * groups * new, dim), keys, values, scale)
    out, lse = out.view(kv_heads, batch, groups, new, dim), lse.view(kv_heads, batch, groups, new)
    if delta is not None:
        first, value_delta = delta  # rows first.. of this chunk see values + value_delta: same weights, so add
        rows = batch - first  # softmax(QK^T) @ value_delta of those rows
        for r in range(rows):
            extra, _ = _prefix_part(
                q[:, first + r].reshape(kv_heads, groups * new, dim), keys, value_delta[r].float(), scale
            )
            out[:, first + r] += extra.view(kv_heads, groups, new, dim)

    # each row's own new tokens, causal
    k_new = key.float().permute(1, 0, 2, 3).unsqueeze(2)  # (kv_heads, batch, 1, new, dim)
    v_new = value.float().permute(1, 0, 2, 3).unsqueeze(2)
    own = (q @ k_new.transpose(-1, -2)).mul_(scale)  # (kv_heads, batch, groups, new, new)
    causal = torch.ones(new, new, dtype=torch.bool, device=query.device).tril()
    own.masked_fill_(~causal, float("-inf"))
    own_lse = torch.logsumexp(own, dim=-1)
    own_out = own.sub_(own_lse[..., None]).exp_() @ v_new

    # one softmax over prefix and own tokens: weight each part by its share of the total mass
    total = torch.logaddexp(lse, own_lse)
    out = out * (lse - total).exp_()[..., None] + own_out * (own_lse - total).exp_()[..., None]
    # (kv_heads, batch, groups, new, dim) -> (batch, new, heads, dim), head = kv_head * groups + group
    return out.permute(1, 3, 0, 2, 4).reshape(batch, new, heads, dim).to(query.dtype)
