"""``plan_batch``: decode rows read around the hole, a prompt compacts in the step that reaches its end, the pieces
before it (chunked prefill) are kept aside."""

from __future__ import annotations

import pytest
import torch

from ripplekv_vllm.hole import hole
from ripplekv_vllm.plan import plan_batch, virtual_row
from ripplekv_vllm.stash import PromptStash

BS, WINDOW = 32, 64


def quarter(n: int) -> tuple[int, int]:
    """The hole of a group keeping a quarter of each prompt."""
    return hole(n, 0.25, BS, WINDOW)


def everything(n: int) -> tuple[int, int]:
    """The hole of a group keeping every token (none)."""
    return hole(n, 1.0, BS, WINDOW)


def table(rows: int, width: int) -> torch.Tensor:
    """Distinct block ids per row: row r holds 1000 r + column."""
    return torch.arange(width)[None, :] + 1000 * torch.arange(rows)[:, None]


def test_decode_rows_skip_the_hole_and_prefill_rows_compact() -> None:
    prompts = torch.tensor([1102, 700, 60])
    # row 0 decodes its 5th token, row 1 prefills its whole prompt, row 2 decodes a prompt within the window
    seq_lens = torch.tensor([1102 + 5, 700, 60 + 1])
    starts = torch.tensor([0, 1, 701, 702])
    blocks = table(3, 40)
    before = (seq_lens.clone(), blocks.clone())
    plan = plan_batch(seq_lens, starts, prompts, blocks, quarter, BS)
    assert torch.equal(seq_lens, before[0]) and torch.equal(blocks, before[1])  # inputs untouched

    kept, full = hole(1102, 0.25, BS, WINDOW)  # (256, 1088)
    gap = (full - kept) // BS
    assert plan.seq_lens[0] == 1107 - (full - kept)
    used = -(-1107 // BS)
    expected = torch.cat([blocks[0, : kept // BS], blocks[0, full // BS : used]])
    assert torch.equal(plan.block_table[0, : used - gap], expected)
    assert plan.remapped_rows == (0,)
    assert torch.equal(plan.block_table[2], blocks[2]) and plan.seq_lens[2] == 61

    k1, t1 = hole(700, 0.25, BS, WINDOW)
    compactions = [(c.row, c.start, c.num_prompt_tokens, c.kept, c.full, c.generated) for c in plan.compactions]
    assert compactions == [(1, 1, 700, k1, t1, 0)]
    assert torch.equal(plan.block_table[1], blocks[1]) and plan.seq_lens[1] == 700
    assert plan.max_seq_len == int(plan.seq_lens.max())


def test_a_group_that_keeps_everything_changes_nothing() -> None:
    seq_lens, starts, prompts = torch.tensor([1107, 700]), torch.tensor([0, 1, 701]), torch.tensor([1102, 700])
    blocks = table(2, 40)
    plan = plan_batch(seq_lens, starts, prompts, blocks, everything, BS)
    assert plan.compactions == () and plan.remapped_rows == ()
    assert torch.equal(plan.seq_lens, seq_lens) and torch.equal(plan.block_table, blocks)


def test_a_resumed_request_compacts_its_prompt_and_carries_its_generated_tokens() -> None:
    # re-prefill after preemption: prompt plus 7 generated tokens in one step
    plan = plan_batch(torch.tensor([707]), torch.tensor([0, 707]), torch.tensor([700]), table(1, 30), quarter, BS)
    (job,) = plan.compactions
    assert (job.num_prompt_tokens, job.kept, job.full, job.generated) == (700, *hole(700, 0.25, BS, WINDOW), 7)
    # the generated tokens then read prompt and themselves around the hole, as a decode row does
    seq, row = virtual_row(table(1, 30)[0], 707, job.kept, job.full, BS)
    decode = plan_batch(torch.tensor([707]), torch.tensor([0, 1]), torch.tensor([700]), table(1, 30), quarter, BS)
    used = -(-seq // BS)  # the columns the kernel reads; those past the sequence are unspecified
    assert seq == int(decode.seq_lens[0]) and torch.equal(row[:used], decode.block_table[0, :used])


def test_chunked_prefill_keeps_pieces_aside_and_compacts_at_the_prompts_end() -> None:
    prompts = torch.tensor([700, 700, 700])
    # row 0: its first 300 tokens; row 1: tokens 300-599; row 2: tokens 600-699 and 5 generated ones (a resume)
    seq_lens = torch.tensor([300, 600, 705])
    starts = torch.tensor([0, 300, 600, 705])
    plan = plan_batch(seq_lens, starts, prompts, table(3, 30), quarter, BS)
    assert [(c.row, c.start, c.computed, c.tokens) for c in plan.chunks] == [(0, 0, 0, 300), (1, 300, 300, 300)]
    (job,) = plan.compactions
    assert (job.row, job.start, job.computed, job.generated) == (2, 600, 600, 5)
    assert plan.remapped_rows == () and torch.equal(plan.seq_lens, seq_lens)


def test_a_group_that_keeps_everything_keeps_no_piece_aside() -> None:
    plan = plan_batch(torch.tensor([300]), torch.tensor([0, 300]), torch.tensor([700]), table(1, 30), everything, BS)
    assert plan.chunks == () and plan.compactions == ()


def test_the_stash_gives_back_a_prompt_in_order_and_refuses_a_gap() -> None:
    stash = PromptStash()
    keys, queries = torch.arange(10.0)[:, None, None], torch.arange(10.0)[:, None, None] + 100
    stash.add("a", "l0", 0, keys[:4], -keys[:4], queries[:4], window=3)
    stash.add("a", "l0", 4, keys[4:7], -keys[4:7], queries[4:7], window=3)
    with pytest.raises(RuntimeError, match="must arrive in order"):
        stash.add("a", "l0", 9, keys[9:], -keys[9:], queries[9:], window=3)
    kept = stash.take("a", "l0", 7)
    assert torch.equal(torch.cat(kept.keys), keys[:7]) and torch.equal(torch.cat(kept.values), -keys[:7])
    assert kept.queries is not None and torch.equal(kept.queries, queries[4:7])  # the last window seen
    assert stash.requests == frozenset()
    stash.add("b", "l0", 0, keys[:2], keys[:2], queries[:2], window=3)
    stash.add("b", "l0", 0, keys[:1], keys[:1], queries[:1], window=3)  # prefilled again from its start
    with pytest.raises(RuntimeError, match="after 2 positions prefilled before, but 1 are kept"):
        stash.take("b", "l0", 2)
    stash.add("c", "l0", 0, keys[:2], keys[:2], queries[:2], window=3)
    stash.drop(["c"])
    assert stash.requests == frozenset() and stash.nbytes == 0
