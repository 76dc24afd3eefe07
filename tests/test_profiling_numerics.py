"""Exactness of sensitivity profiling at realistic sizes: long prefixes, chunked rows, bfloat16, float64 KL.

Models are tiny (hidden 64, 4 layers) but the prefixes are longer than 1,024 keys (where attention kernels
split the keys into blocks), the vocabulary is 8,192 tokens (so the log-sum-exp of the logits is large
enough for float32 shortcuts to show) and the row chunks of the shared-prefix attention are forced to cut
through the noisy rows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from ripplekv.models import shared_prefix
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.cache import cache_from_tensors, cache_tensors
from ripplekv.profiling import ProfilingConfig, score_sample
from ripplekv.profiling.divergence import kl_divergence, relative_change
from ripplekv.profiling.noise import noise_generator, norm_adaptive_noise
from ripplekv.profiling.passes import can_share_prefix

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 8192
PREFIX = 1100  # more than 1,024 keys
NEW = 12


def _model(
    arch: str = "llama", fast: bool = True, dtype: torch.dtype = torch.float32, seed: int = 0
) -> PreTrainedModel:
    """A 4-layer model (hidden 64, GQA 4/2 heads, 8,192-token vocabulary, 4,096 positions)."""
    torch.manual_seed(seed)
    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        initializer_range=0.2,
        attn_implementation="sdpa",
        eos_token_id=None,
    )
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
    model = model.eval().to(dtype)
    return enable_varlen_attention(model) if fast else model


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def _full_forward_scores(
    model: PreTrainedModel, ctx: torch.Tensor, cont: torch.Tensor, config: ProfilingConfig, sample: int
) -> tuple[list[float], list[float]]:
    """Per-layer KL and local scores from full forward passes of the stock model over each perturbed cache."""
    layers = model.get_decoder().layers
    prefill = DynamicCache()
    n = ctx.shape[1]
    positions = torch.arange(n, n + cont.shape[1])
    captured: list[torch.Tensor] = []
    with torch.no_grad():
        model(ctx, past_key_values=prefill, use_cache=True)
        clean = cache_tensors(prefill)
        kl, local = [], []
        for layer in range(len(layers)):
            handle = layers[layer].self_attn.register_forward_hook(lambda m, a, out: captured.append(out[0]))
            try:
                ref = model(
                    cont,
                    past_key_values=cache_from_tensors(clean),
                    cache_position=positions,
                    position_ids=positions[None],
                ).logits
                pairs = [(k.expand(config.repeats, -1, -1, -1), v.expand(config.repeats, -1, -1, -1)) for k, v in clean]
                values = pairs[layer][1]
                generator = noise_generator(config.seed, sample, layer)
                pairs[layer] = (pairs[layer][0], values + norm_adaptive_noise(values, config.alpha, generator))
                logits = model(
                    cont.expand(config.repeats, -1),
                    past_key_values=cache_from_tensors(pairs),
                    cache_position=positions,
                    position_ids=positions[None],
                ).logits
            finally:
                handle.remove()
            kl.append(float(kl_divergence(ref, logits).mean()))
            local.append(float(relative_change(captured[-2], captured[-1]).mean()))
    return kl, local


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_both_paths_equal_full_forward_over_each_perturbed_cache(arch: str) -> None:
    """(a) + (d): a prefix over 1,024 keys; fast and generic paths against stock full passes, float64 KL."""
    ctx, cont = _ids(PREFIX, 1), _ids(NEW, 2)
    config = ProfilingConfig(alpha=0.5, repeats=2, seed=7)
    fast_model, slow_model = _model(arch, fast=True), _model(arch, fast=False)
    assert can_share_prefix(fast_model, PREFIX + NEW) and not can_share_prefix(slow_model, PREFIX + NEW)
    expected_kl, expected_local = _full_forward_scores(slow_model, ctx, cont, config, sample=3)
    assert all(k > 1e-4 for k in expected_kl)  # a real signal, far above float32 rounding
    for model in (fast_model, slow_model):
        scores = score_sample(model, ctx, cont, config, sample_index=3)
        for got, want in zip(scores.kl, expected_kl):
            assert math.isclose(got, want, rel_tol=1e-5), (scores.kl, expected_kl)
        for got, want in zip(scores.local, expected_local):
            assert math.isclose(got, want, rel_tol=1e-5), (scores.local, expected_local)


@pytest.mark.parametrize("chunk_rows", [1, 2, 3, 5])
def test_row_chunks_straddling_the_first_noisy_row(monkeypatch: pytest.MonkeyPatch, chunk_rows: int) -> None:
    """(b): the shared-prefix attention cut into row chunks, some holding clean and noisy rows, changes nothing."""
    model = _model("llama")
    ctx, cont = _ids(PREFIX, 3), _ids(NEW, 4)
    config = ProfilingConfig(alpha=0.5, repeats=3, seed=1)
    whole = score_sample(model, ctx, cont, config)

    straddles: list[tuple[int, int]] = []  # (rows in the chunk, index of its first noisy row) when index > 0
    attend = shared_prefix._attend

    def spy(query: torch.Tensor, *args: object) -> torch.Tensor:
        delta = args[-1]
        if delta is not None and delta[0] > 0:
            straddles.append((query.shape[0], delta[0]))
        return attend(query, *args)

    monkeypatch.setattr(shared_prefix, "_attend", spy)
    # the chunk size the attention derives from its memory bound: chunk_rows rows of prefix scores
    monkeypatch.setattr(shared_prefix, "MAX_SCORE_BYTES", chunk_rows * 2 * 2 * NEW * PREFIX * 4)
    chunked = score_sample(model, ctx, cont, config)
    if chunk_rows > 1:
        assert straddles, "no chunk held both clean and noisy rows"
    for got, want in zip(chunked.kl + chunked.local, whole.kl + whole.local):
        assert math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12), (chunked, whole)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "generic"])
def test_zero_noise_scores_zero_at_every_layer(dtype: torch.dtype, fast: bool) -> None:
    """(c): with alpha = 0 every layer scores the same (zero): no numerical floor that falls with depth."""
    model = _model("llama", fast=fast, dtype=dtype)
    scores = score_sample(model, _ids(PREFIX, 5), _ids(NEW, 6), ProfilingConfig(alpha=0.0, repeats=2))
    assert max(scores.kl) < 1e-12, scores.kl
    assert max(scores.kl) - min(scores.kl) < 1e-12, scores.kl
    assert max(scores.local) < 1e-12, scores.local


def test_bfloat16_scores_track_float32() -> None:
    """With noise, bfloat16 profiling measures the float32 signal (no floor added to the early layers)."""
    ctx, cont = _ids(PREFIX, 7), _ids(NEW, 8)
    config = ProfilingConfig(alpha=0.5, repeats=2, seed=0)
    full = score_sample(_model("llama"), ctx, cont, config)
    half = score_sample(_model("llama", dtype=torch.bfloat16), ctx, cont, config)
    for got, want in zip(half.kl, full.kl):
        assert math.isclose(got, want, rel_tol=0.2), (half.kl, full.kl)


def _softmax64(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def test_float32_kl_equals_float64_recomputation() -> None:
    """(e): KL of float32 logits at SmolLM2's scale (49,152 tokens, log-sum-exp ~ 27) against float64."""
    generator = torch.Generator().manual_seed(0)
    positions, vocab = 32, 49152
    reference = torch.randn(positions, vocab, generator=generator) * 3.0
    reference[torch.arange(positions), torch.randint(0, vocab, (positions,), generator=generator)] += 25.0
    assert float(torch.logsumexp(reference, -1).mean()) > 24
    for scale in (0.03, 0.1, 0.3):  # KL from ~1e-5 to ~1e-3 nats, like a layer's score
        perturbed = reference + scale * torch.randn(positions, vocab, generator=generator)
        got = kl_divergence(reference[None], perturbed[None])
        assert got.dtype == torch.float64 and got.shape == (1,)
        ref_logp = _softmax64(reference.double().numpy())
        logp = _softmax64(perturbed.double().numpy())
        want = float((np.exp(ref_logp) * (ref_logp - logp)).sum(-1).mean())
        assert math.isclose(float(got[0]), want, rel_tol=1e-7, abs_tol=1e-12), (float(got[0]), want, scale)
    assert float(kl_divergence(reference[None], reference[None])[0]) == 0.0


def test_divergence_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="rows, positions, size"):
        kl_divergence(torch.zeros(3, 4), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="does not match"):
        kl_divergence(torch.zeros(2, 3, 4), torch.zeros(3, 3, 4))
    with pytest.raises(ValueError, match="does not match"):
        relative_change(torch.zeros(1, 3, 4), torch.zeros(2, 3, 5))


def test_kl_ignores_tokens_masked_on_both_sides() -> None:
    """A token with -inf logits in both distributions contributes 0 (0 * log 0), not NaN."""
    generator = torch.Generator().manual_seed(3)
    reference, other = torch.randn(1, 5, 16, generator=generator), torch.randn(2, 5, 16, generator=generator)
    keep = torch.arange(16) != 7
    masked_ref, masked_other = reference.clone(), other.clone()
    masked_ref[..., 7] = masked_other[..., 7] = -float("inf")
    torch.testing.assert_close(
        kl_divergence(masked_ref, masked_other), kl_divergence(reference[..., keep], other[..., keep])
    )
