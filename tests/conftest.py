"""Tiny config-built models (random weights, offline, fast) for architecture tests."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

ARCHITECTURES = ("llama", "qwen2", "mistral")
VOCAB = 256


def tiny_model(arch: str = "llama", layers: int = 4, seed: int = 0, attn: str = "sdpa") -> PreTrainedModel:
    """A 2-4 layer model of the given architecture with random weights (GQA: 4 query / 2 KV heads)."""
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
    else:
        raise ValueError(arch)
    return model.eval()


@pytest.fixture(params=ARCHITECTURES)
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


def random_ids(n: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (1, n), generator=generator)
