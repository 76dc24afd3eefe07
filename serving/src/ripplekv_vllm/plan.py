"""Per-step row plan of the RippleKV vLLM plugin: which rows compact their prompt, which read around the hole.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) evicts a
block-aligned hole ``[k, T)`` of each prompt (:func:`ripplekv_vllm.hole.hole`). The worker's block table only
grows (vLLM never tells it which blocks the scheduler replaced by the null block, and those blocks go to other
requests), so the worker derives the hole from the prompt length ``N`` alone, for every batch row:

* a row whose computed tokens ``c = seq_len - query_len`` reach ``N`` (decoding, its prompt compacted): it reads
  through a *virtual* block table with the hole's columns removed and a sequence ``T - k`` tokens shorter, so the
  attention kernel never touches a freed (perhaps reused) block;
* a row whose step reaches the end of its prompt (``c < N <= seq_len``): a :class:`Compaction` of its first ``N``
  tokens after the attention. Under chunked prefill the prompt's earlier pieces (``c > 0``) were kept aside as they
  were prefilled (:class:`Chunk`, :mod:`ripplekv_vllm.stash`), so the compaction scores and moves the whole prompt,
  exactly as in one step. A request resumed after a recompute preemption prefills its prompt and its ``G``
  generated tokens again (``seq_len = N + G`` when in one step): the compaction also carries the generated tokens of
  its step, which the backend attends again over the compacted prompt (:func:`virtual_row`), so that they compute
  exactly what they computed before the preemption; later ones read around the hole as decode rows do;
* a row that prefills a piece of its prompt short of its end (chunked prefill, ``seq_len < N``): a :class:`Chunk`,
  whose keys, values and last queries the backend keeps aside until the piece that completes the prompt.

Rows whose group evicts nothing of their prompt (``k == T``) are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["BatchPlan", "Chunk", "Compaction", "plan_batch", "virtual_row"]


@dataclass(frozen=True)
class Compaction:
    """One row's prompt to compact after this step's attention.

    Attributes:
        row: the batch row.
        start: the row's first token in the step's flattened query/key/value tensors.
        num_prompt_tokens: the prompt length ``N``.
        kept: ``k``, the tokens of ``[0, T)`` kept in the first ``k / bs`` blocks.
        full: ``T = N // bs * bs``.
        generated: the generated tokens after the prompt in this step (a request resumed after a preemption; 0 for
            a first prefill).
        computed: the prompt tokens prefilled in earlier steps (chunked prefill; kept aside until this step), so the
            step's first token is prompt position ``computed``.
    """

    row: int
    start: int
    num_prompt_tokens: int
    kept: int
    full: int
    generated: int = 0
    computed: int = 0


@dataclass(frozen=True)
class Chunk:
    """A piece of a prompt prefilled in this step short of the prompt's end (chunked prefill), kept aside.

    Attributes:
        row: the batch row.
        start: the piece's first token in the step's flattened tensors.
        computed: the prompt tokens prefilled before it (its first token's prompt position).
        tokens: its length.
    """

    row: int
    start: int
    computed: int
    tokens: int


@dataclass(frozen=True)
class BatchPlan:
    """The metadata one group's attention reads, and its compactions.

    Attributes:
        seq_lens: per-row sequence lengths, shortened by ``T - k`` for remapped rows.
        block_table: per-row block ids, the hole's columns removed for remapped rows (columns past a remapped row's
            sequence are unspecified: the kernel never reads them).
        compactions: the rows that compact their prompt after the attention.
        remapped_rows: the rows read through the virtual table.
        chunks: the rows prefilling a piece of their prompt short of its end.
    """

    seq_lens: torch.Tensor
    block_table: torch.Tensor
    compactions: tuple[Compaction, ...]
    remapped_rows: tuple[int, ...]
    chunks: tuple[Chunk, ...] = ()

    @property
    def max_seq_len(self) -> int:
        """The longest (virtual) sequence of the batch (0 for an empty batch)."""
        return int(self.seq_lens.max()) if self.seq_lens.numel() else 0


def plan_batch(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    prompt_lens: torch.Tensor,
    block_table: torch.Tensor,
    hole_of: Callable[[int], tuple[int, int]],
    block_size: int,
) -> BatchPlan:
    """The plan of one step's ``num_reqs`` rows for one group (see the module docstring).

    The rows are classified in plain Python (a step holds few rows; small torch operations cost more than the loop),
    and the decode rows' virtual block tables are built in one gather over the whole batch. The inputs are never
    modified.

    Args:
        seq_lens: per-row sequence lengths after this step, ``[num_reqs]``.
        query_start_loc: the rows' offsets into the step's tokens, ``[num_reqs + 1]``.
        prompt_lens: per-row prompt lengths ``N``, ``[num_reqs]``.
        block_table: the worker's per-row block ids, ``[num_reqs, max_blocks]``.
        hole_of: ``(k, T)`` of a prompt length (the group's hole).
        block_size: tokens per block.
    """
    num_reqs = int(seq_lens.shape[0])
    prompts = prompt_lens[:num_reqs].tolist()
    seqs = seq_lens[:num_reqs].tolist()
    starts = query_start_loc[: num_reqs + 1].tolist()
    compactions: list[Compaction] = []
    chunks: list[Chunk] = []
    remapped: list[int] = []
    gaps, kept_blocks = [0] * num_reqs, [0] * num_reqs
    for row, (prompt, seq) in enumerate(zip(prompts, seqs)):
        if prompt < 1:
            continue
        kept, full = hole_of(prompt)
        if kept >= full:
            continue
        queried = starts[row + 1] - starts[row]
        computed = seq - queried
        if computed >= prompt:
            remapped.append(row)
            gaps[row], kept_blocks[row] = (full - kept) // block_size, kept // block_size
        elif seq >= prompt:
            compactions.append(Compaction(row, starts[row], prompt, kept, full, seq - prompt, computed))
        else:
            chunks.append(Chunk(row, starts[row], computed, queried))
    if not remapped:
        return BatchPlan(seq_lens, block_table, tuple(compactions), (), tuple(chunks))
    gap = torch.tensor(gaps, dtype=torch.int64)
    columns = torch.arange(block_table.shape[1], dtype=torch.int64)
    source = columns[None, :] + (columns[None, :] >= torch.tensor(kept_blocks)[:, None]) * gap[:, None]
    table = block_table.clone()
    table[:num_reqs] = block_table[:num_reqs].gather(1, source.clamp_(max=block_table.shape[1] - 1))
    new_seq = seq_lens.clone()
    new_seq[:num_reqs] -= (gap * block_size).to(seq_lens.dtype)
    return BatchPlan(new_seq, table, tuple(compactions), tuple(remapped), tuple(chunks))


def virtual_row(row: torch.Tensor, seq_len: int, kept: int, full: int, block_size: int) -> tuple[int, torch.Tensor]:
    """A compacted request's sequence length and block table with the hole ``[k, T)`` removed.

    The blocks from ``T`` on move down to ``k``, and the sequence is ``T - k`` tokens shorter, so the attention
    kernel reads ``[0, k)``, then the tail ``[T, N)`` and what follows, and never a freed block.

    Args:
        row: the request's block ids, ``[max_blocks]`` (not modified).
        seq_len: the request's true sequence length.
        kept: ``k``.
        full: ``T``.
        block_size: tokens per block.
    """
    blocks, gap = -(-seq_len // block_size), (full - kept) // block_size
    out = row.clone()
    out[kept // block_size : blocks - gap] = row[full // block_size : blocks]
    return seq_len - (full - kept), out
