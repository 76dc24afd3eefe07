"""Per-step plan of the RippleKV vLLM plugin: every layer's block table, and which rows compact their prompt.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) keeps
``K_l`` whole blocks of each prompt's first ``T = N // bs * bs`` tokens in layer ``l``; the prompt's last, partly
filled block ``[T, N)`` stays in every layer. All layers share one KV-cache group whose block ids are pages of every
layer (:mod:`ripplekv_vllm.pool`); a request keeps ``M = ceil(sum_l K_l / L)`` of its prompt's ``T / bs`` block ids
(:meth:`~ripplekv_vllm.budgets.GroupBudgets.pooled_hole`), and its layers' kept blocks are *packed* into their
``M x L`` pages in layer order: layer ``l``'s ``j``-th kept block is pack index ``f = sum_{l' < l} K_l' + j``, the page
of layer ``f % L`` of the request's block id number ``f // L``. The worker's block table only grows (vLLM never tells
it which blocks the scheduler replaced by the null block), so the plan derives everything from the prompt length:

* a row whose computed tokens ``c = seq_len - query_len`` reach ``N`` (decoding, its prompt compacted) reads, in
  layer ``l``, its ``K_l`` packed pages, then its blocks from ``T / bs`` on, with a sequence ``T - K_l bs`` tokens
  shorter, so the attention kernel never touches a freed (perhaps reused) block;
* a row whose step reaches the end of its prompt (``c < N <= seq_len``): a :class:`Compaction`, whose kept tokens
  each layer writes into its packed pages once the step's forward is done (every layer read the prompt in place
  until then). Under chunked prefill the prompt's earlier pieces (``c > 0``) were kept aside as they were
  prefilled (:class:`Chunk`, :mod:`ripplekv_vllm.stash`), so the compaction scores the whole prompt, exactly as in
  one step. A request resumed after a recompute preemption prefills its prompt and its ``G`` generated tokens again
  (``seq_len = N + G`` when in one step): its generated tokens attend again over the compacted prompt, so that they
  compute what they computed before the preemption;
* a row that prefills a piece of its prompt short of its end (chunked prefill, ``seq_len < N``): a :class:`Chunk`,
  whose keys, values and last queries the backend keeps aside until the piece that completes the prompt.

Every other row, and every row whose layers all keep their whole prompt, reads its blocks in place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Chunk", "Compaction", "StepPlan", "plan_step"]


@dataclass(frozen=True)
class Compaction:
    """One row's prompt to compact once the step's forward is done.

    Attributes:
        row: the batch row.
        start: the row's first token in the step's flattened query/key/value tensors.
        num_prompt_tokens: the prompt length ``N``.
        kept: per layer, ``K_l bs``: the tokens of ``[0, T)`` the layer keeps.
        full: ``T = N // bs * bs``.
        pages: per layer, the pages its kept blocks are packed into, ``[L, >= max K_l]`` (row ``l``'s first ``K_l``).
        generated: the generated tokens after the prompt in this step (a request resumed after a preemption; 0 for
            a first prefill).
        computed: the prompt tokens prefilled in earlier steps (chunked prefill; kept aside until this step), so the
            step's first token is prompt position ``computed``.
    """

    row: int
    start: int
    num_prompt_tokens: int
    kept: tuple[int, ...]
    full: int
    pages: torch.Tensor
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
class StepPlan:
    """What every layer's attention reads in one step, and the rows that compact or keep a piece aside.

    Attributes:
        tables: per layer and row, the pages read, ``[L, num_reqs, columns]`` int32 (columns past a row's
            sequence are unspecified: the kernel never reads them).
        seq_lens: per layer and row, the sequence read, ``[L, num_reqs]`` (shortened by ``T - K_l bs`` for
            remapped rows).
        compactions: the rows that compact their prompt after the step's forward.
        remapped_rows: the rows read through their packed pages.
        chunks: the rows prefilling a piece of their prompt short of its end.
    """

    tables: torch.Tensor
    seq_lens: torch.Tensor
    compactions: tuple[Compaction, ...]
    remapped_rows: tuple[int, ...]
    chunks: tuple[Chunk, ...] = ()


def plan_step(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    prompt_lens: torch.Tensor,
    block_table: torch.Tensor,
    layer_kept: Callable[[int], tuple[int, ...]],
    offsets: torch.Tensor,
    stride: int,
    block_size: int,
) -> StepPlan:
    """The plan of one step's ``num_reqs`` rows for every layer (see the module docstring).

    Rows are classified in plain Python (a step holds few rows); every layer's table is built in one vectorised
    pass. The inputs are never modified.

    Args:
        seq_lens: per-row sequence lengths after this step, ``[num_reqs]``.
        query_start_loc: the rows' offsets into the step's tokens, ``[num_reqs + 1]``.
        prompt_lens: per-row prompt lengths ``N``, ``[num_reqs]``.
        block_table: the rows' block ids, ``[num_reqs, max_blocks]``.
        layer_kept: ``K_l`` of every layer for a prompt length (whole blocks of ``[0, T)``).
        offsets: per layer, the pool page of its block 0 (:class:`~ripplekv_vllm.pool.KVPool`), ``[L]`` int64.
        stride: pool pages per block id.
        block_size: tokens per block.
    """
    num_reqs, num_layers = int(seq_lens.shape[0]), int(offsets.shape[0])
    prompts = prompt_lens[:num_reqs].tolist()
    seqs = seq_lens[:num_reqs].tolist()
    starts = query_start_loc[: num_reqs + 1].tolist()
    width = min(max((-(-s // block_size) for s in seqs), default=1), int(block_table.shape[1]))
    table = block_table[:num_reqs, :width].long()
    tables = offsets[:, None, None] + table[None] * stride  # every row in place
    lens = seq_lens[None, :num_reqs].expand(num_layers, num_reqs).clone()
    evicting: list[tuple[int, tuple[int, ...], int]] = []
    jobs: list[tuple[int, int, int, int]] = []  # (row, prompt, generated, computed) of compactions
    chunks: list[Chunk] = []
    remapped: list[int] = []
    for row, (prompt, seq) in enumerate(zip(prompts, seqs)):
        if prompt < 1:
            continue
        kept = layer_kept(prompt)
        if min(kept) >= prompt // block_size:
            continue
        queried = starts[row + 1] - starts[row]
        computed = seq - queried
        if computed >= prompt:
            remapped.append(row)
            evicting.append((row, kept, prompt // block_size))
        elif seq >= prompt:
            jobs.append((row, prompt, seq - prompt, computed))
            evicting.append((row, kept, prompt // block_size))
        else:
            chunks.append(Chunk(row, starts[row], computed, queried))
    pages: dict[int, torch.Tensor] = {}
    kept_of = {row: kept for row, kept, _ in evicting}
    if evicting:
        rows = torch.tensor([r for r, _, _ in evicting])
        kept_blocks = torch.tensor([k for _, k, _ in evicting], dtype=torch.int64).T  # [L, E]
        full_blocks = torch.tensor([t for _, _, t in evicting], dtype=torch.int64)
        columns = torch.arange(width, dtype=torch.int64)
        packs = (kept_blocks.cumsum(0) - kept_blocks)[:, :, None] + columns  # [L, E, width]
        ids = table[rows]  # [E, width]
        owner = ids[None].expand(num_layers, -1, -1).gather(2, (packs // num_layers).clamp_(max=width - 1))
        packed = offsets[packs % num_layers] + owner * stride
        for index, (row, _, _) in enumerate(evicting):
            pages[row] = packed[:, index]
        if remapped:
            decoding = set(remapped)
            chosen = torch.tensor([i for i, (r, _, _) in enumerate(evicting) if r in decoding])
            k, t = kept_blocks[:, chosen, None], full_blocks[chosen][None, :, None]
            tail = (columns - k + t).clamp_(0, width - 1)
            moved = offsets[:, None, None] + ids[chosen][None].expand(num_layers, -1, -1).gather(2, tail) * stride
            read = torch.where(columns < k, packed[:, chosen], moved)
            remapped_index = torch.tensor(remapped)
            tables[:, remapped_index] = read
            lens[:, remapped_index] -= ((t[..., 0] - k[..., 0]) * block_size).to(lens.dtype)
    compactions = tuple(
        Compaction(
            row,
            starts[row],
            prompt,
            tuple(b * block_size for b in kept_of[row]),
            prompt // block_size * block_size,
            pages[row],
            generated,
            computed,
        )
        for row, prompt, generated, computed in jobs
    )
    return StepPlan(tables.to(torch.int32), lens, compactions, tuple(remapped), tuple(chunks))
