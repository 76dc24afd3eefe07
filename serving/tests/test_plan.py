"""``plan_step``: every layer reads its own pages (decode rows their packed kept blocks, then the tail), a prompt
compacts in the step that reaches its end into pages no other layer packs into, the pieces before it (chunked prefill)
are kept aside; and ``KVPool`` sees the layers' caches as one tensor of pages."""

from __future__ import annotations

import pytest
import torch

from ripplekv_vllm.budgets import FractionBudgets
from ripplekv_vllm.hole import hole
from ripplekv_vllm.plan import plan_step
from ripplekv_vllm.pool import KVPool
from ripplekv_vllm.stash import PromptStash

BS, WINDOW = 32, 64
FRACTIONS = (0.25, 0.5, 0.125, 0.25)
LAYERS, NUM_BLOCKS = len(FRACTIONS), 5000
LAYOUTS = {"layer-major": (torch.arange(LAYERS) * NUM_BLOCKS, 1), "block-major": (torch.arange(LAYERS), LAYERS)}


def kept_of(fractions: tuple[float, ...] = FRACTIONS):
    """``K_l`` of every layer for a prompt length (each layer its own fraction)."""
    return FractionBudgets.of_layers(fractions, BS, WINDOW).layer_kept_blocks


def table(rows: int, width: int) -> torch.Tensor:
    """Distinct block ids per row: row r holds 1000 r + column."""
    return (torch.arange(width)[None, :] + 1000 * torch.arange(rows)[:, None]).to(torch.int32)


def plan(seq_lens, starts, prompts, blocks, layout="layer-major", fractions=FRACTIONS):
    offsets, stride = LAYOUTS[layout]
    return plan_step(seq_lens, starts, prompts, blocks, kept_of(fractions), offsets, stride, BS)


def page(layout: str, layer: int, block: int) -> int:
    offsets, stride = LAYOUTS[layout]
    return int(offsets[layer]) + block * stride


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_decode_rows_read_their_packed_pages_and_prefill_rows_compact(layout: str) -> None:
    prompts = torch.tensor([1102, 700, 60])
    # row 0 decodes its 5th token, row 1 prefills its whole prompt, row 2 decodes a prompt within the window
    seq_lens = torch.tensor([1102 + 5, 700, 60 + 1], dtype=torch.int32)
    starts = torch.tensor([0, 1, 701, 702])
    blocks = table(3, 40)
    before = (seq_lens.clone(), blocks.clone())
    step = plan(seq_lens, starts, prompts, blocks, layout)
    assert torch.equal(seq_lens, before[0]) and torch.equal(blocks, before[1])  # inputs untouched
    assert step.remapped_rows == (0,)

    kept = [hole(1102, f, BS, WINDOW)[0] // BS for f in FRACTIONS]
    full, used = 1102 // BS, -(-1107 // BS)
    packed = {}
    for layer, k in enumerate(kept):
        assert int(step.seq_lens[layer, 0]) == 1107 - (full - k) * BS
        read = step.tables[layer, 0, : used - (full - k)].tolist()
        tail = [page(layout, layer, int(b)) for b in blocks[0, full:used]]
        assert read[k:] == tail  # the prompt's tail block and the answer, in place
        packed[layer] = read[:k]
    pages = [p for layer in packed.values() for p in layer]
    owned = {page(layout, layer, int(b)) for layer in range(LAYERS) for b in blocks[0, : -(-sum(kept) // LAYERS)]}
    assert len(set(pages)) == sum(kept) and set(pages) <= owned  # distinct pages of the block ids the row keeps
    for layer in range(LAYERS):  # the other rows read in place
        for row, length in ((1, 700), (2, 61)):
            assert int(step.seq_lens[layer, row]) == length
            width = -(-length // BS)
            assert step.tables[layer, row, :width].tolist() == [
                page(layout, layer, int(b)) for b in blocks[row, :width]
            ]

    (job,) = step.compactions
    assert (job.row, job.start, job.num_prompt_tokens, job.full, job.generated) == (1, 1, 700, 700 // BS * BS, 0)
    assert job.kept == tuple(hole(700, f, BS, WINDOW)[0] for f in FRACTIONS)
    # the compaction writes where the row will read once it decodes
    decode = plan(
        torch.tensor([701], dtype=torch.int32), torch.tensor([0, 1]), torch.tensor([700]), table(2, 40)[1:], layout
    )
    for layer, k in enumerate(job.kept):
        assert torch.equal(job.pages[layer, : k // BS], decode.tables[layer, 0, : k // BS].long())


def test_a_budget_that_keeps_everything_changes_nothing() -> None:
    seq_lens, starts, prompts = (
        torch.tensor([1107, 700], dtype=torch.int32),
        torch.tensor([0, 1, 701]),
        torch.tensor([1102, 700]),
    )
    blocks = table(2, 40)
    step = plan(seq_lens, starts, prompts, blocks, fractions=(1.0,) * LAYERS)
    assert step.compactions == () and step.remapped_rows == ()
    assert torch.equal(step.seq_lens, seq_lens[None].expand(LAYERS, -1))
    for layer in range(LAYERS):
        assert step.tables[layer].tolist() == [
            [page("layer-major", layer, int(b)) for b in row] for row in blocks[:, :35]
        ]


def test_a_resumed_request_compacts_its_prompt_and_carries_its_generated_tokens() -> None:
    # re-prefill after preemption: prompt plus 7 generated tokens in one step
    step = plan(torch.tensor([707], dtype=torch.int32), torch.tensor([0, 707]), torch.tensor([700]), table(1, 30))
    (job,) = step.compactions
    assert (job.num_prompt_tokens, job.full, job.generated) == (700, 700 // BS * BS, 7)
    assert step.remapped_rows == ()  # its generated tokens attend again over the compacted prompt (the backend)


def test_chunked_prefill_keeps_pieces_aside_and_compacts_at_the_prompts_end() -> None:
    prompts = torch.tensor([700, 700, 700])
    # row 0: its first 300 tokens; row 1: tokens 300-599; row 2: tokens 600-699 and 5 generated ones (a resume)
    seq_lens = torch.tensor([300, 600, 705], dtype=torch.int32)
    starts = torch.tensor([0, 300, 600, 705])
    step = plan(seq_lens, starts, prompts, table(3, 30))
    assert [(c.row, c.start, c.computed, c.tokens) for c in step.chunks] == [(0, 0, 0, 300), (1, 300, 300, 300)]
    (job,) = step.compactions
    assert (job.row, job.start, job.computed, job.generated) == (2, 600, 600, 5)
    assert step.remapped_rows == () and torch.equal(step.seq_lens, seq_lens[None].expand(LAYERS, -1))


def test_a_budget_that_keeps_everything_keeps_no_piece_aside() -> None:
    step = plan(
        torch.tensor([300], dtype=torch.int32),
        torch.tensor([0, 300]),
        torch.tensor([700]),
        table(1, 30),
        fractions=(1.0,) * LAYERS,
    )
    assert step.chunks == () and step.compactions == ()


@pytest.mark.parametrize("interleaved", [False, True])
def test_the_pool_is_every_layers_pages_of_one_buffer(interleaved: bool) -> None:
    blocks, heads, width = 6, 2, 8
    buffer = torch.arange(LAYERS * blocks * heads * BS * width, dtype=torch.float32)
    if interleaved:  # block-major: block b of every layer, then block b + 1
        grid = buffer.view(blocks, LAYERS, heads, BS, width)
        caches = [grid[:, layer] for layer in range(LAYERS)]
    else:
        caches = list(buffer.view(LAYERS, blocks, heads, BS, width))
    pool = KVPool.of_layers(caches)
    assert pool.tensor.shape == (LAYERS * blocks, heads, BS, width)
    for layer in range(LAYERS):
        ids = torch.tensor([0, 3, 5])
        assert torch.equal(pool.tensor[pool.pages(layer, ids)], caches[layer][ids])
    with pytest.raises(ValueError, match="not whole pages of one buffer"):
        KVPool.of_layers([caches[0], caches[1].clone()])


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
