"""The plugin in vLLM's engine on tiny random-weight models (a Llama of 4 layers, 4 query heads over 2 KV heads, CPU).

The models are built in a temporary directory (seeded weights, float32, the SmolLM2 tokenizer's files), so these
tests exercise a GQA ratio of 2:1 (SmolLM2-135M's is 3:1) and run in a few minutes of engine time. They pin the same
relations as ``test_engine.py``: every keep fraction 1.0 is stock vLLM token for token, the first decode step frees
exactly each tier's :func:`~ripplekv_vllm.hole.hole`, and decoding then attends to exactly the kept tokens; and
those of serving under load: a request preempted (recomputed) answers exactly as it does alone, a block the
scheduler hands out while a request still reads it is caught before the step runs, and an engine without
``additional_config["ripplekv"]`` in the same process is stock vLLM (the refusals: ``test_refusals_reach_caller.py``).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_support import (
    ENGINE_ARGS,
    close,
    core_of,
    drive,
    fractions_of,
    non_null,
    ripple_llm,
    runner_of,
    save_tiny,
    spec_of,
    stock_generate,
    transformers_reference,
)

from ripplekv_vllm.backend import observe_kept
from ripplekv_vllm.hole import hole
from ripplekv_vllm.ledger import HoleMismatchError

TOKENS = 6
BS, WINDOW = 32, 64
LAYERS, KV_HEADS = 4, 2
FRACTIONS = [0.25, 0.25, 0.5, 0.5]  # 2 tiers of 2 layers


@pytest.fixture(scope="module")
def tiny_dir(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A seeded random-weight Llama saved in float32 with the SmolLM2 tokenizer's files beside it."""
    from transformers import LlamaConfig, LlamaForCausalLM

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
    return save_tiny(model_dir, tmp_path_factory.mktemp("tiny-llama"), LlamaForCausalLM(config))


@pytest.fixture(scope="module")
def prompts() -> dict[str, list[int]]:
    """Random token ids of lengths that are not multiples of the block size (their tail blocks are partial)."""
    rng = random.Random(0)
    return {name: [rng.randrange(3, 49152) for _ in range(n)] for name, n in (("a", 500), ("b", 333))}


@pytest.fixture(scope="module")
def stock(tiny_dir: str, prompts: dict[str, list[int]]) -> list[dict[str, list]]:
    """Stock vLLM's answers to ``a`` and ``b`` (a child process without the plugin)."""
    return stock_generate(tiny_dir, [prompts["a"], prompts["b"]], TOKENS)


def test_full_budget_is_stock_vllm(tiny_dir: str, prompts: dict[str, list[int]], stock) -> None:
    names = ["a", "b"]
    llm = ripple_llm(tiny_dir, {"keep_fractions": [1.0] * LAYERS})
    try:
        assert fractions_of(runner_of(llm)) == [(1.0, list(range(LAYERS)))]
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
        tiers = fractions_of(runner_of(llm))
        run = drive(llm, prompts, TOKENS)
        alone = drive(llm, {"a": prompts["a"]}, TOKENS)
    finally:
        observe_kept(None)
        close(llm)
    return {"tiers": tiers, "run": run, "alone": alone, "kept": kept}


def test_tiers_are_the_keep_fractions(tier_run) -> None:
    assert tier_run["tiers"] == [(0.25, [0, 1]), (0.5, [2, 3])]


def test_first_decode_step_frees_exactly_the_holes(tier_run, prompts: dict[str, list[int]]) -> None:
    """Every layer is in one KV-cache group whose block ids are pages of every layer: after the prefill a request
    keeps the block ids its layers' kept blocks fill (``ceil(sum_l K_l / L)``), and the tail block."""
    run = tier_run["run"]
    freed = 0
    for name, ids in prompts.items():
        n = len(ids)
        assert n % BS  # the first decode token lands in the prompt's partial tail block: no new block at step 1
        bounds = [hole(n, fraction, BS, WINDOW) for fraction, _ in tier_run["tiers"]]
        assert all(k < t for k, t in bounds) and len({k for k, _ in bounds}) == 2  # each tier keeps its own share
        layer_blocks = [k // BS for (k, _), (_, layers) in zip(bounds, tier_run["tiers"]) for _ in layers]
        kept, full = -(-sum(layer_blocks) // LAYERS), n // BS
        blocks = run.requests[name].blocks
        assert non_null(blocks[0]) == [-(-n // BS)], name  # after the prefill: the whole prompt
        assert non_null(blocks[1]) == [kept + 1], name  # [0, M) and the tail block
        (group,) = blocks[1]
        assert all(b is None for b in group[kept:full]), name
        assert None not in group[:kept] and group[full] is not None, name
        freed += full - kept
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


CHUNK = 96
"""The chunked engine's step budget: the 500- and 333-token prompts arrive in pieces, ``a``'s last one (alone: 20
tokens) shorter than the 64-token window, whose queries then come from the pieces before."""


@pytest.fixture(scope="module")
def chunked_run(tiny_dir: str, prompts: dict[str, list[int]]):
    """``tier_run`` under chunked prefill (96 tokens a step), recording ``a``'s kept positions when alone."""
    llm = ripple_llm(
        tiny_dir,
        {"keep_fractions": FRACTIONS, "window": WINDOW},
        enable_chunked_prefill=True,
        max_num_batched_tokens=CHUNK,
    )
    kept: dict[tuple[str, int], torch.Tensor] = {}
    try:
        run = drive(llm, prompts, TOKENS)
        observe_kept(lambda layer, row, indices: kept.__setitem__((layer, row), indices.clone()))
        alone = drive(llm, {"a": prompts["a"]}, TOKENS)
        stashed = runner_of(llm).stash.requests
    finally:
        observe_kept(None)
        close(llm)
    return {"run": run, "alone": alone, "kept": kept, "stashed": stashed}


def test_chunked_prefill_keeps_and_answers_as_one_step_prefill(tier_run, chunked_run) -> None:
    """Each prompt is compacted in the step that prefills its end, from all its pieces: the same kept positions in
    every layer, the same holes freed and the same answers as when it is prefilled in one step."""
    first = chunked_run["run"].requests["a"].blocks[0]
    assert non_null(first)[0] <= CHUNK // BS < 500 // BS  # the prompt did arrive in pieces
    for (layer, row), indices in chunked_run["kept"].items():
        assert torch.equal(indices, tier_run["kept"][(layer, row)]), layer
    assert len(chunked_run["kept"]) == LAYERS
    for name in ("a", "b"):
        chunked, whole = chunked_run["run"].requests[name], tier_run["run"].requests[name]
        assert chunked.tokens == whole.tokens, name
        assert chunked.logprobs == pytest.approx(whole.logprobs, abs=1e-4), name
        assert non_null(chunked.blocks[-1]) == non_null(whole.blocks[-1]), name
    assert chunked_run["alone"].requests["a"].tokens == tier_run["alone"].requests["a"].tokens
    assert chunked_run["stashed"] == frozenset()  # nothing left aside once the prompts completed


def test_unconfigured_engine_in_the_same_process_is_stock(tier_run, tiny_dir: str, prompts, stock) -> None:
    from vllm import LLM
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.attention.backends.cpu_attn import (
        CPUAttentionBackend,
        CPUAttentionBackendImpl,
        CPUAttentionMetadataBuilder,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    import ripplekv_vllm

    ripplekv_vllm.register()  # as the installed entry point does; a RippleKV engine ran in this process (tier_run)
    llm = LLM(model=tiny_dir, **ENGINE_ARGS)
    try:
        runner = runner_of(llm)
        layers = get_layers_from_vllm_config(runner.vllm_config, Attention)
        assert len(layers) == LAYERS
        assert all(type(layer.impl) is CPUAttentionBackendImpl for layer in layers.values())
        assert all(layer.attn_backend is CPUAttentionBackend for layer in layers.values())
        assert [type(g.kv_cache_spec) for g in runner.kv_cache_config.kv_cache_groups] == [FullAttentionSpec]
        builders = [b for groups in runner.attn_groups for g in groups for b in g.metadata_builders]
        assert builders and all(type(b) is CPUAttentionMetadataBuilder for b in builders)
        run = drive(llm, {"a": prompts["a"], "b": prompts["b"]}, TOKENS)
    finally:
        close(llm)
    for name, expected in zip(["a", "b"], stock):
        assert run.requests[name].tokens == expected["tokens"], name
        assert run.requests[name].logprobs == pytest.approx(expected["logprobs"], abs=1e-6), name


PREEMPT_TOKENS = 200
POOL = 23
"""Blocks of the preemption runs' pool (each block id is a page of every layer)."""


@pytest.fixture(scope="module", params=[False, True], ids=["one-step prefill", "chunked prefill"])
def preempt_run(tiny_dir: str, request: pytest.FixtureRequest):
    """Two 500-token requests arriving at steps 0 and 2 in a 23-block pool (22 usable), 200 tokens each, and each
    alone; prompts prefilled in one step, or in pieces of 96 tokens (a resumed request then prefills prompt and answer
    in pieces).

    After both prompts are compacted (5 block ids and the tail block each) 10 blocks are free and both grow by a
    block every 32 tokens, so the second is preempted (recomputed) once it has generated well over a hundred tokens.
    """
    rng = random.Random(0)
    long = {f"r{i}": [rng.randrange(3, 49152) for _ in range(500)] for i in range(2)}
    chunked = {"enable_chunked_prefill": True, "max_num_batched_tokens": CHUNK} if request.param else {}
    llm = ripple_llm(
        tiny_dir,
        {"keep_fractions": FRACTIONS, "window": WINDOW},
        num_gpu_blocks_override=POOL,
        max_model_len=704,
        **{"max_num_batched_tokens": 704, **chunked},
    )
    try:
        both = drive(llm, long, PREEMPT_TOKENS, arrivals={"r0": 0, "r1": 2})
        alone = {name: drive(llm, {name: ids}, PREEMPT_TOKENS) for name, ids in long.items()}
        stashed = runner_of(llm).stash.requests
    finally:
        close(llm)
    assert stashed == frozenset()
    return both, alone


def test_preempted_request_answers_as_it_does_alone(preempt_run) -> None:
    both, alone = preempt_run
    assert sum(both.preemptions.values()) >= 1, both.preemptions  # the pool forced a recompute preemption
    assert not any(run.preemptions[name] for name, run in alone.items())
    for name, run in alone.items():
        served, reference = both.requests[name], run.requests[name]
        assert len(served.tokens) == PREEMPT_TOKENS
        assert served.tokens == reference.tokens, name
        assert served.logprobs == pytest.approx(reference.logprobs, abs=1e-5), name  # measured: equal


def test_teacher_forcing_in_the_engine(tiny_dir: str, tmp_path: Path) -> None:
    """The fidelity probe under load, through a recompute preemption (the pool of ``preempt_run``).

    Recording: row ``t`` of each reference is the distribution of output token ``t`` (its top token is the answer's,
    its log-probability vLLM's own). Forcing each request along its own answer: KL 0 and the same tokens at every
    position. Forcing ``r0`` along ``r1``'s answer: that answer is emitted; the first token, whose prefix is the
    same, has KL 0 and ``r0``'s own top token; after it the prefixes differ and so do the distributions.
    """
    from ripplekv_vllm.fidelity import TeacherForcing, force_args, read_forced, read_reference, record_args

    rng = random.Random(0)
    long = {f"r{i}": [rng.randrange(3, 49152) for _ in range(500)] for i in range(2)}
    arrivals = {"r0": 0, "r1": 2}
    reference, results, other = tmp_path / "full", tmp_path / "forced", tmp_path / "other"
    llm = ripple_llm(
        tiny_dir,
        {"keep_fractions": FRACTIONS, "window": WINDOW},
        num_gpu_blocks_override=POOL,
        max_model_len=704,
        max_num_batched_tokens=704,
        logits_processors=[TeacherForcing],
    )
    try:
        recorded = drive(llm, long, PREEMPT_TOKENS, arrivals, {n: record_args(n, reference) for n in long})
        answers = {name: recorded.requests[name].tokens for name in long}
        own = {n: force_args(n, reference, results, answers[n]) for n in long}
        forced = drive(llm, long, PREEMPT_TOKENS, arrivals, own)
        swapped = drive(
            llm, {"r0": long["r0"]}, PREEMPT_TOKENS, None, {"r0": force_args("r0", reference, other, answers["r1"])}
        )
    finally:
        close(llm)
    assert recorded.preemptions["r1"] >= 1 and forced.preemptions["r1"] >= 1, (recorded.preemptions, forced.preemptions)
    for name in long:
        rows = np.asarray(read_reference(reference, name))
        assert rows.argmax(-1).tolist() == answers[name], name
        picked = rows[np.arange(PREEMPT_TOKENS), answers[name]]
        assert picked.tolist() == pytest.approx(recorded.requests[name].logprobs, abs=1e-5), name
        kl, top1 = read_forced(results, name)
        assert forced.requests[name].tokens == answers[name], name
        assert top1.tolist() == answers[name], name
        assert np.abs(kl).max() < 1e-6, name  # measured: 0 up to float rounding
    assert answers["r0"] != answers["r1"]
    assert swapped.requests["r0"].tokens == answers["r1"]
    kl, top1 = read_forced(other, "r0")
    assert abs(kl[0]) < 1e-6 and top1[0] == answers["r0"][0]
    assert np.median(kl[1:]) > 1e-3


def test_hole_disagreement_is_caught(tiny_dir: str, prompts: dict[str, list[int]]) -> None:
    """The scheduler frees one block of ``a``'s kept prompt (a seeded disagreement) and gives it to ``b``."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    # a pool of a's prompt and 4 more blocks: b (11 blocks) takes the 4, the seeded block and a's freed hole
    llm = ripple_llm(
        tiny_dir,
        {"keep_fractions": FRACTIONS, "window": WINDOW},
        num_gpu_blocks_override=1 + 16 + 4,
        max_model_len=544,
        max_num_batched_tokens=544,
    )
    try:
        engine, core = llm.llm_engine, core_of(llm)
        params = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
        engine.add_request("a", TokensPrompt(prompt_token_ids=prompts["a"]), params)
        engine.step()  # a's prefill
        (internal,) = core.scheduler.requests
        (manager,) = core.scheduler.kv_cache_manager.coordinator.single_type_managers
        kept, _ = spec_of(runner_of(llm)).hole(len(prompts["a"]))
        seeded = manager.req_to_blocks[internal][kept // BS - 1].block_id
        manager._remove_blocks_in_range(internal, kept // BS - 1, kept // BS)  # frees a block a still reads
        engine.add_request("b", TokensPrompt(prompt_token_ids=prompts["b"]), params)
        message = rf"gave block {seeded} to request b-\S+ \(KV-cache group 0\), but request a-\S+ still reads it "
        message += r"\(group 0,"
        with pytest.raises(HoleMismatchError, match=message):
            engine.step()
    finally:
        close(llm)
