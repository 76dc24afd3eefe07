"""Per-step row plan of the RippleKV vLLM plugin: which rows compact their prompt, which read around the hole.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) evicts a
block-aligned hole ``[k, T)`` of each prompt (:func:`ripplekv_vllm.hole.hole`). The worker's block table only
grows (vLLM never tells it which blocks the scheduler replaced by the null block, and those blocks go to other
requests), so the worker derives the hole from the prompt length ``N`` alone, for every batch row:

* a row whose computed tokens ``c = seq_len - query_len`` reach ``N`` (decoding, its prompt compacted): it reads
  through a *virtual* block table with the hole's columns removed and a sequence ``T - k`` tokens shorter, so the
  attention kernel never touches a freed (perhaps reused) block;
* a row that prefills its whole prompt in this step (``c == 0``, ``seq_len >= N``): a :class:`Compaction` of its
  first ``N`` tokens after the attention. A request resumed after a recompute preemption prefills its prompt and
  its ``G`` generated tokens in one step (``seq_len = N + G``): its compaction also carries the generated tokens,
  which the backend attends again over the compacted prompt (:func:`virtual_row`), so that they compute exactly
  what they computed before the preemption;
* a row that prefills part of its prompt: refused (:class:`ChunkedPrefillError`), the plugin needs whole prompts.

Rows of a tier that evicts nothing (``k == T``) are left as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ripplekv_vllm.hole import hole

__all__ = ["BatchPlan", "ChunkedPrefillError", "Compaction", "plan_batch", "virtual_row"]


class ChunkedPrefillError(RuntimeError):
    """A prompt reached the RippleKV backend in pieces (chunked prefill), which the plugin cannot compact."""


@dataclass(frozen=True)
class Compaction:
    """One row's prompt to compact after this step's attention.

    Attributes:
        row: the batch row.
        start: the row's first token in the step's flattened query/key/value tensors.
        num_prompt_tokens: the prompt length ``N``.
        kept: ``k``, the tokens of ``[0, T)`` kept in the first ``k / bs`` blocks.
        full: ``T = N // bs * bs``.
        generated: ``G``, the generated tokens after the prompt in this step (a request resumed after a
            preemption; 0 for a first prefill).
    """

    row: int
    start: int
    num_prompt_tokens: int
    kept: int
    full: int
    generated: int = 0


@dataclass(frozen=True)
class BatchPlan:
    """The metadata one tier's attention reads, and its compactions.

    Attributes:
        seq_lens: per-row sequence lengths, shortened by ``T - k`` for remapped rows.
        block_table: per-row block ids, the hole's columns removed for remapped rows.
        compactions: the rows that compact their prompt after the attention.
        remapped_rows: the rows read through the virtual table.
    """

    seq_lens: torch.Tensor
    block_table: torch.Tensor
    compactions: tuple[Compaction, ...]
    remapped_rows: tuple[int, ...]

    @property
    def max_seq_len(self) -> int:
        """The longest (virtual) sequence of the batch (0 for an empty batch)."""
        return int(self.seq_lens.max()) if self.seq_lens.numel() else 0


def plan_batch(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    prompt_lens: torch.Tensor,
    block_table: torch.Tensor,
    keep_fraction: float,
    block_size: int,
    window: int,
) -> BatchPlan:
    """The plan of one step's ``num_reqs`` rows for one tier (see the module docstring).

    The inputs are never modified: rows that change are written into clones.

    Args:
        seq_lens: per-row sequence lengths after this step, ``[num_reqs]``.
        query_start_loc: the rows' offsets into the step's tokens, ``[num_reqs + 1]``.
        prompt_lens: per-row prompt lengths ``N``, ``[num_reqs]``.
        block_table: the worker's per-row block ids, ``[num_reqs, max_blocks]``.
        keep_fraction: the tier's kept fraction.
        block_size: tokens per block.
        window: SnapKV's observation window.

    Raises:
        ChunkedPrefillError: a row prefills part of its prompt.
    """
    num_reqs = int(seq_lens.shape[0])
    new_seq, new_table = seq_lens, block_table
    compactions: list[Compaction] = []
    remapped: list[int] = []
    seq_list, start_list, prompt_list = seq_lens.tolist(), query_start_loc.tolist(), prompt_lens.tolist()
    for row in range(num_reqs):
        prompt = int(prompt_list[row])
        if prompt < 1:
            continue
        kept, full = hole(prompt, keep_fraction, block_size, window)
        if kept >= full:
            continue
        seq = int(seq_list[row])
        computed = seq - (int(start_list[row + 1]) - int(start_list[row]))
        if computed >= prompt:
            if not remapped:
                new_seq, new_table = seq_lens.clone(), block_table.clone()
            new_seq[row], new_table[row] = virtual_row(block_table[row], seq, kept, full, block_size)
            remapped.append(row)
        elif computed == 0 and seq >= prompt:
            compactions.append(Compaction(row, int(start_list[row]), prompt, kept, full, seq - prompt))
        else:
            raise ChunkedPrefillError(
                f"RippleKV needs each prompt prefilled in one step, but a {prompt}-token prompt arrived with "
                f"{computed} tokens already computed and {seq - computed} in this step: start vLLM with "
                "enable_chunked_prefill=False and max_num_batched_tokens >= max_model_len"
            )
    return BatchPlan(new_seq, new_table, tuple(compactions), tuple(remapped))


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
