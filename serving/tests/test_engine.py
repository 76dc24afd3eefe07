"""The plugin in vLLM's engine (SmolLM2-135M, CPU): stock tokens at full budget, freed holes, exact compaction.

Engine runs are short (prompts of 300-1,000 tokens, 12 greedy tokens) so that the module runs in a few minutes.
"""

from __future__ import annotations

import pytest
import torch
from conftest import PROFILE
from engine_support import (
    close,
    drive,
    fractions_of,
    non_null,
    ripple_llm,
    runner_of,
    spec_of,
    stock_generate,
    transformers_reference,
)
from ripplekv.profiling.profile import SensitivityProfile

from ripplekv_vllm.backend import observe_kept
from ripplekv_vllm.budgets import ProfileBudgets, layer_groups

TOKENS = 12
BS, WINDOW = 32, 64
# the library's allocation at each prompt's own length, per layer (the default)
LAYERS = {"profile": str(PROFILE), "budget": 0.2}


@pytest.fixture(scope="module")
def prompts(bamboo_ids) -> dict[str, list[int]]:
    """Prompts whose lengths are not multiples of the block size (their tail blocks are partial)."""
    return {"a": bamboo_ids(0, 1000), "b": bamboo_ids(1, 600), "c": bamboo_ids(2, 300)}


def test_full_budget_is_stock_vllm(model_dir: str, prompts: dict[str, list[int]]) -> None:
    names = ["a", "c"]
    stock = stock_generate(model_dir, [prompts[n] for n in names], TOKENS)
    llm = ripple_llm(model_dir, {"keep_fractions": [1.0] * 30})
    try:
        assert [f for f, _ in fractions_of(runner_of(llm))] == [1.0]
        run = drive(llm, {n: prompts[n] for n in names}, TOKENS)
    finally:
        close(llm)
    for name, expected in zip(names, stock):
        generation = run.requests[name]
        assert generation.tokens == expected["tokens"], name
        assert generation.logprobs == pytest.approx(expected["logprobs"], abs=1e-5), name
        # nothing is freed: after the first decode step the request holds every block of its prompt
        assert non_null(generation.blocks[1]) == [-(-(len(prompts[name]) + 1) // BS)], name


@pytest.fixture(scope="module")
def tier_runs(model_dir: str, prompts: dict[str, list[int]]):
    """One engine with the library's per-layer budgets and a pool so small that ``b`` must reuse ``a``'s freed blocks.

    Runs ``a`` alone (recording its kept positions), ``b`` alone, then both with ``b`` arriving while ``a`` decodes.
    """
    margin = 4  # free blocks beyond a's prefill: b (19 blocks) cannot fit without a's freed hole
    # a pool this small admits sequences of 1,152 tokens at most (36 blocks, each a page of every layer)
    llm = ripple_llm(
        model_dir, LAYERS, num_gpu_blocks_override=1 + -(-len(prompts["a"]) // BS) + margin, max_model_len=1056
    )
    kept: dict[str, torch.Tensor] = {}
    observe_kept(lambda layer, row, indices: kept.__setitem__(layer, indices.clone()))
    try:
        spec = spec_of(runner_of(llm))
        alone_a = drive(llm, {"a": prompts["a"]}, TOKENS)
        observe_kept(None)
        alone_b = drive(llm, {"b": prompts["b"]}, TOKENS)
        both = drive(llm, {"a": prompts["a"], "b": prompts["b"]}, TOKENS, arrivals={"a": 0, "b": 3})
    finally:
        observe_kept(None)
        close(llm)
    return {"spec": spec, "a": alone_a, "b": alone_b, "both": both, "kept": kept}


def test_budgets_are_the_library_allocation(tier_runs, prompts: dict[str, list[int]]) -> None:
    budgets = tier_runs["spec"].budgets
    assert budgets.groups == layer_groups(30)
    scores = SensitivityProfile.load(PROFILE).scores
    expected = ProfileBudgets(layer_groups(30), scores, 0.2, 4.0, 3.0, BS, WINDOW)
    for n in (len(prompt) for prompt in prompts.values()):
        assert budgets.layer_kept_blocks(n) == expected.layer_kept_blocks(n)


def test_first_decode_step_frees_exactly_the_hole(tier_runs, prompts: dict[str, list[int]]) -> None:
    n = len(prompts["a"])
    assert n % BS  # the first decode token lands in the prompt's partial tail block: no new block at step 1
    run = tier_runs["a"]
    layers = tier_runs["spec"].budgets.layer_kept_blocks(n)
    assert len(set(layers)) > 1 and max(layers) < n // BS  # every layer evicts, not all alike
    kept, full = -(-sum(layers) // 30), n // BS
    assert tier_runs["spec"].hole(n) == (kept * BS, full * BS)
    blocks = run.requests["a"].blocks
    assert non_null(blocks[0]) == [-(-n // BS)]  # after the prefill: the whole prompt
    assert non_null(blocks[1]) == [kept + 1]  # [0, M) and the tail block
    (group,) = blocks[1]
    assert all(b is None for b in group[kept:full]) and None not in group[:kept]
    assert run.free_blocks[1] - run.free_blocks[0] == full - kept


def test_decoding_attends_exactly_the_kept_tokens(tier_runs, model_dir: str, prompts: dict[str, list[int]]) -> None:
    n = len(prompts["a"])
    kept, full = {}, {}
    for layer, blocks in enumerate(tier_runs["spec"].budgets.layer_kept_blocks(n)):
        indices = tier_runs["kept"][f"model.layers.{layer}.self_attn.attn"]
        assert indices.shape == (blocks * BS, 3)
        kept[layer], full[layer] = indices, n // BS * BS
    tokens, logprobs = transformers_reference(model_dir, prompts["a"], kept, full, TOKENS)
    generation = tier_runs["a"].requests["a"]
    assert generation.tokens == tokens
    assert generation.logprobs == pytest.approx(logprobs, abs=1e-4)  # measured: 1.3e-5


def test_staggered_requests_match_each_alone(tier_runs) -> None:
    both = tier_runs["both"]
    a, b = both.requests["a"], both.requests["b"]
    arrival = both.arrival_steps["b"]
    # b is prefilled while a decodes, into blocks of a's freed hole (the stale ids a's worker table still holds)
    assert len(a.blocks) > arrival + len(b.blocks) - TOKENS
    hole_of_a = {
        block for group, after in zip(a.blocks[0], a.blocks[1]) for block, now in zip(group, after) if now is None
    }
    prefill_of_b = {block for group in b.blocks[0] for block in group if block is not None}
    assert hole_of_a & prefill_of_b
    assert a.tokens == tier_runs["a"].requests["a"].tokens
    assert b.tokens == tier_runs["b"].requests["b"].tokens
    assert a.logprobs == pytest.approx(tier_runs["a"].requests["a"].logprobs, abs=1e-4)
    assert b.logprobs == pytest.approx(tier_runs["b"].requests["b"].logprobs, abs=1e-4)
