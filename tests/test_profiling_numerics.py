"""Exactness of sensitivity profiling at realistic sizes: long prefixes, chunked rows, bfloat16, float64 KL.

Models are tiny (hidden 64, 4 layers) but the prefixes are longer than 1,024 keys (where attention kernels
split the keys into blocks), the vocabulary is 8,192 tokens (so the log-sum-exp of the logits is large
enough for float32 shortcuts to show) and the row chunks of the shared-prefix attention are forced to cut
through the noisy rows.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from transformers import (
    DynamicCache,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from ripplekv.models import shared_prefix
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.cache import cache_from_tensors, cache_tensors
from ripplekv.profiling import passes
from ripplekv.profiling.divergence import kl_divergence, relative_change
from ripplekv.profiling.noise import noise_generator, norm_adaptive_noise
from ripplekv.profiling.passes import Float32Head, Float32Layers, can_share_prefix
from ripplekv.profiling.sensitivity import ProfilingConfig, score_sample

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 8192
PREFIX = 1100  # more than 1,024 keys
NEW = 12


def _model(
    arch: str = "llama",
    fast: bool = True,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    layers: int = 4,
    head_scale: float = 1.0,
) -> PreTrainedModel:
    """A model of ``layers`` layers (default 4; hidden 64, GQA 4/2 heads, 8,192-token vocabulary, 4,096 positions).

    ``head_scale`` multiplies the output projection (2: logits up to ~16 in magnitude, as SmolLM2's).
    """
    torch.manual_seed(seed)
    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
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
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
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


def _agreement(got: list[float], want: list[float]) -> tuple[float, float, float]:
    """Spearman rho, max and median relative error of the scores ``got`` against ``want``."""
    got_, want_ = np.array(got), np.array(want)
    relative = np.abs(got_ - want_) / want_
    return float(spearmanr(got_, want_)[0]), float(relative.max()), float(np.median(relative))


def within(worst: float, median: float) -> bool:
    """The tolerance of a bfloat16 profile against float32: worst relative error under 0.2, median under 0.1."""
    return worst < 0.2 and median < 0.1


@pytest.mark.parametrize("fast", [True, False], ids=["batched_by_depth", "layer_by_layer"])
def test_bfloat16_profile_equals_float32_profile_of_the_same_weights(fast: bool) -> None:
    """An 8-layer model in bfloat16 scores every layer as the same weights in float32 do.

    Logits up to ~16 in magnitude and scores down to ~5e-4 nats (alpha 0.1), where bfloat16 rounding of the
    logits and of the continuation's hidden states shows: the tolerance fails when the final norm and output
    projection run in bfloat16 (scores off by up to ~80%), and when only they run in float32 (~40%); the
    remaining error is the bfloat16 prefill (the operating point), a few percent.
    """
    half = _model("llama", fast=fast, dtype=torch.bfloat16, layers=8, head_scale=2.0)
    full = copy.deepcopy(half).float()  # the same (bfloat16-rounded) weights, float32 arithmetic
    ctx, cont = _ids(256, 11), _ids(16, 12)
    assert can_share_prefix(half, 272) is fast
    with torch.no_grad():
        assert float(full(ctx).logits.abs().max()) > 12  # the logit scale at which bfloat16 rounding shows
    config = ProfilingConfig(alpha=0.1, repeats=2, seed=0)
    want = score_sample(full, ctx, cont, config).kl
    got = score_sample(half, ctx, cont, config).kl
    assert min(want) < 1e-3, want  # scores as small as the least sensitive layers of a real model
    rho, worst, median = _agreement(got, want)
    assert rho >= 0.95 and within(worst, median), (rho, worst, median, got, want)
    for precision in ("model", "float32-head"):  # the tolerance catches bfloat16 arithmetic left in the passes
        rounded = score_sample(half, ctx, cont, replace(config, precision=precision)).kl
        _, worst, median = _agreement(rounded, want)
        assert not within(worst, median), (precision, worst, median)


def test_float32_head_is_the_models_own_head_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Norm, projection with bias, final logit soft-capping (Gemma 2/3 configs), whole or in vocabulary chunks."""
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=1000,
        final_logit_softcapping=5.0,
        initializer_range=0.5,
        attn_implementation="sdpa",
    )
    model = Gemma3ForCausalLM(config).eval()
    model.lm_head.bias = torch.nn.Parameter(torch.randn(1000))  # some checkpoints' heads have a bias
    hidden = torch.randn(2, 3, 64) * 10
    with torch.no_grad():
        want = model.lm_head(model.model.norm(hidden))
        want = torch.tanh(want / 5.0) * 5.0
        assert float(want.abs().max()) > 4.5  # the cap binds
        torch.testing.assert_close(Float32Head(model)(hidden), want)
        monkeypatch.setattr(passes, "MAX_HEAD_BYTES", 64 * 4 * 300)  # chunks of 300 rows, the last one shorter
        chunked = Float32Head(model)
        assert chunked.chunk == 300
        torch.testing.assert_close(chunked(hidden), want)
        half = copy.deepcopy(model).to(torch.bfloat16)
        logits = Float32Head(half)(hidden.to(torch.bfloat16))
    assert logits.dtype == torch.float32
    assert half.lm_head.weight.dtype == torch.bfloat16  # the model is left as it was


def test_float32_layers_copy_low_precision_layers_only() -> None:
    full = _model("llama")
    layers = Float32Layers(full.model.layers)
    assert layers[0] is full.model.layers[0]
    half = _model("llama", dtype=torch.bfloat16)
    kept, fresh = Float32Layers(half.model.layers), Float32Layers(half.model.layers, max_bytes=0)
    assert kept[1] is kept[1] and fresh[1] is not fresh[1]
    assert all(p.dtype == torch.float32 for p in kept[1].parameters())
    assert all(p.dtype == torch.bfloat16 for p in half.parameters())


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


def test_precision_is_validated_and_keys_the_checkpoint() -> None:
    from ripplekv.profiling.calibration import CalibrationSample, CalibrationSet
    from ripplekv.profiling.sensitivity import checkpoint_key

    with pytest.raises(ValueError, match="precision must be one of"):
        ProfilingConfig(precision="bfloat16")
    calibration = CalibrationSet((CalibrationSample(context="a", continuation="b"),), "one")
    identity = {"config_hash": "h"}
    default = checkpoint_key(identity, "w", calibration, ProfilingConfig())
    assert "precision" not in default
    assert checkpoint_key(identity, "w", calibration, ProfilingConfig(precision="model"))["precision"] == "model"
