"""The plugin in vLLM's engine on a tiny random-weight Llama (4 layers, 4 query heads over 2 KV heads, CPU).

The model is built in a temporary directory (seeded weights, float32, the SmolLM2 tokenizer's files), so these tests
exercise a GQA ratio of 2:1 (SmolLM2-135M's is 3:1) and run in well under a minute of engine time. They pin the same
relations as ``test_engine.py``: every keep fraction 1.0 is stock vLLM token for token, the first decode step frees
exactly each tier's :func:`~ripplekv_vllm.hole.hole`, and decoding then attends to exactly the kept tokens.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch
from engine_support import (
    close,
    drive,
    non_null,
    ripple_llm,
    runner_of,
    stock_generate,
    tier_of,
    transformers_reference,
)

from ripplekv_vllm.backend import observe_kept
from ripplekv_vllm.hole import hole

TOKENS = 6
BS, WINDOW = 32, 64
LAYERS, KV_HEADS = 4, 2
FRACTIONS = [0.25, 0.25, 0.5, 0.5]  # 2 tiers of 2 layers
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@pytest.fixture(scope="module")
def tiny_dir(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A seeded random-weight Llama saved in float32 with the SmolLM2 tokenizer's files beside it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    source = Path(model_dir)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=KV_HEADS,
        head_dim=32,  # the smallest head size the CPU attention kernel accepts
        max_position_embeddings=2048,
        initializer_range=0.1,  # peaked enough logits that greedy tokens are not near-ties
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, out / name)
    return str(out)


@pytest.fixture(scope="module")
def prompts() -> dict[str, list[int]]:
    """Random token ids of lengths that are not multiples of the block size (their tail blocks are partial)."""
    rng = random.Random(0)
    return {name: [rng.randrange(3, 49152) for _ in range(n)] for name, n in (("a", 500), ("b", 333))}


def test_full_budget_is_stock_vllm(tiny_dir: str, prompts: dict[str, list[int]]) -> None:
    names = ["a", "b"]
    stock = stock_generate(tiny_dir, [prompts[n] for n in names], TOKENS)
    llm = ripple_llm(tiny_dir, {"keep_fractions": [1.0] * LAYERS})
    try:
        assert tier_of(runner_of(llm)) == [(1.0, list(range(LAYERS)))]
        run = drive(llm, {n: prompts[n] for n in names}, TOKENS)
    finally:
        close(llm)
    for name, expected in zip(names, stock):
        generation = run.requests[name]
        assert len(generation.tokens) == TOKENS
        assert generation.tokens == expected["tokens"], name
        assert generation.logprobs == pytest.approx(expected["logprobs"], abs=1e-5), name
        # nothing is freed: after the first decode step the request holds every block of its prompt
        assert non_null(generation.blocks[1]) == [-(-(len(prompts[name]) + 1) // BS)], name


@pytest.fixture(scope="module")
def tier_run(tiny_dir: str, prompts: dict[str, list[int]]):
    """One engine with 2 tiers serving ``a`` and ``b`` together, recording ``a``'s kept positions per layer."""
    llm = ripple_llm(tiny_dir, {"keep_fractions": FRACTIONS, "window": WINDOW})
    kept: dict[tuple[str, int], torch.Tensor] = {}
    observe_kept(lambda layer, row, indices: kept.__setitem__((layer, row), indices.clone()))
    try:
        tiers = tier_of(runner_of(llm))
        run = drive(llm, prompts, TOKENS)
        alone = drive(llm, {"a": prompts["a"]}, TOKENS)
    finally:
        observe_kept(None)
        close(llm)
    return {"tiers": tiers, "run": run, "alone": alone, "kept": kept}


def test_tiers_are_the_keep_fractions(tier_run) -> None:
    assert tier_run["tiers"] == [(0.25, [0, 1]), (0.5, [2, 3])]


def test_first_decode_step_frees_exactly_the_holes(tier_run, prompts: dict[str, list[int]]) -> None:
    run = tier_run["run"]
    freed = 0
    for name, ids in prompts.items():
        n = len(ids)
        assert n % BS  # the first decode token lands in the prompt's partial tail block: no new block at step 1
        bounds = [hole(n, fraction, BS, WINDOW) for fraction, _ in tier_run["tiers"]]
        assert all(k < t for k, t in bounds) and len({k for k, _ in bounds}) == 2  # each tier frees its own hole
        blocks = run.requests[name].blocks
        assert non_null(blocks[0]) == [-(-n // BS)] * 2, name  # after the prefill: the whole prompt
        assert non_null(blocks[1]) == [k // BS + 1 for k, _ in bounds], name  # [0, k) and the tail block
        for group, (k, t) in zip(blocks[1], bounds):
            assert all(b is None for b in group[k // BS : t // BS]), name
            assert None not in group[: k // BS] and group[t // BS] is not None, name
        freed += sum((t - k) // BS for k, t in bounds)
    assert run.free_blocks[1] - run.free_blocks[0] == freed


def test_decoding_attends_exactly_the_kept_tokens(tier_run, tiny_dir: str, prompts: dict[str, list[int]]) -> None:
    n = len(prompts["a"])
    kept, full = {}, {}
    for fraction, layers in tier_run["tiers"]:
        k, t = hole(n, fraction, BS, WINDOW)
        for layer in layers:
            indices = tier_run["kept"][(f"model.layers.{layer}.self_attn.attn", 0)]
            assert indices.shape == (k, KV_HEADS)
            kept[layer], full[layer] = indices, t
    tokens, logprobs = transformers_reference(tiny_dir, prompts["a"], kept, full, TOKENS)
    generation = tier_run["alone"].requests["a"]
    assert generation.tokens == tokens
    assert generation.logprobs == pytest.approx(logprobs, abs=1e-4)
    # served with b, a decodes as it does alone
    assert tier_run["run"].requests["a"].tokens == tokens
