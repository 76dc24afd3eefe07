"""Sensitivity profiling on tiny config-built models."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from ripplekv.models.cache import cache_from_tensors, cache_tensors
from ripplekv.models.identity import model_identity, weights_fingerprint
from ripplekv.profiling.calibration import CalibrationSample, CalibrationSet
from ripplekv.profiling.noise import ContinuationBuffers, noise_generator, norm_adaptive_noise
from ripplekv.profiling.profile import ProfileError, ProfileWeightsWarning, SensitivityProfile
from ripplekv.profiling.sensitivity import ProfilingConfig, profile_model, score_sample
from tests.conftest import random_ids, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


class CharTokenizer:
    """One token per character: enough to profile a tiny model on text."""

    def __call__(self, text: str, add_special_tokens: bool = False, return_tensors: str | None = None) -> dict:
        ids = [min(ord(c), 255) for c in text]
        return {"input_ids": torch.tensor([ids]) if return_tensors == "pt" else ids}


def _calibration(n: int = 3) -> CalibrationSet:
    samples = tuple(
        CalibrationSample(
            context=f"sample {i}: " + "the quick brown fox jumps over the lazy dog. " * (2 + i),
            continuation=f"and then {i} more words follow here",
        )
        for i in range(n)
    )
    return CalibrationSet(samples=samples, description="synthetic")


def _prefill(model, ids: torch.Tensor) -> list:
    cache = DynamicCache()
    with torch.no_grad():
        model(ids, past_key_values=cache, use_cache=True)
    return cache_tensors(cache)


def test_noise_is_norm_adaptive() -> None:
    values = torch.randn(2, 3, 50, 16) * torch.linspace(0.1, 10, 50).view(1, 1, 50, 1)
    noise = norm_adaptive_noise(values, 0.3, torch.Generator().manual_seed(0))
    torch.testing.assert_close(noise.norm(dim=-1), 0.3 * values.norm(dim=-1), rtol=1e-5, atol=1e-6)
    again = norm_adaptive_noise(values, 0.3, torch.Generator().manual_seed(0))
    assert torch.equal(noise, again)


def test_perturbation_touches_only_that_layers_values(arch: str) -> None:
    model = tiny_model(arch, layers=4)
    clean = _prefill(model, random_ids(30))
    snapshot = [(k.clone(), v.clone()) for k, v in clean]
    buffers = ContinuationBuffers(clean, room=5, batch=3)
    cache = buffers.perturbed_cache(2, alpha=0.5, generator=noise_generator(0, 0, 2))
    for i, layer in enumerate(cache.layers):
        head_dim = clean[i][0].shape[-1]  # 16, or Gemma 3's own head_dim
        assert layer.keys.shape == (3, 2, 30, head_dim) == layer.values.shape
        for r in range(3):
            assert torch.equal(layer.keys[r], clean[i][0][0])  # keys bit-identical
            if i != 2:
                assert torch.equal(layer.values[r], clean[i][1][0])  # other layers bit-identical
        if i == 2:
            assert not torch.equal(layer.values[0], clean[i][1][0])
            assert not torch.equal(layer.values[0], layer.values[1])  # independent draws
            noise = layer.values - clean[i][1]
            torch.testing.assert_close(noise.norm(dim=-1), 0.5 * clean[i][1].norm(dim=-1).expand(3, -1, -1))
    with torch.no_grad():  # a pass over the cache writes only the tail, never the context
        positions = torch.arange(30, 35)
        model(
            random_ids(5, 1).expand(3, 5), past_key_values=cache, cache_position=positions, position_ids=positions[None]
        )
    assert [layer.get_seq_length() for layer in cache.layers] == [35] * 4
    for i, ((k, v), (k0, v0)) in enumerate(zip(clean, snapshot)):  # the prefill itself is never written
        assert torch.equal(k, k0) and torch.equal(v, v0)
        assert torch.equal(buffers.keys[i][:, :, :30], k0.expand(3, -1, -1, -1))
        assert torch.equal(buffers.values[i][:, :, :30], v0.expand(3, -1, -1, -1))


def test_zero_noise_gives_zero_kl(arch: str) -> None:
    model = tiny_model(arch, layers=3)
    scores = score_sample(model, random_ids(40), random_ids(8, 1), ProfilingConfig(alpha=0.0, repeats=2))
    assert len(scores.kl) == 3
    assert all(abs(s) < 1e-6 for s in scores.kl)
    assert all(abs(s) < 1e-6 for s in scores.local)


def test_scores_positive_deterministic_and_seeded(arch: str) -> None:
    model = tiny_model(arch, layers=4)
    ctx, cont = random_ids(48), random_ids(8, 1)
    a = score_sample(model, ctx, cont, ProfilingConfig(alpha=0.5, repeats=2, seed=3))
    b = score_sample(model, ctx, cont, ProfilingConfig(alpha=0.5, repeats=2, seed=3))
    c = score_sample(model, ctx, cont, ProfilingConfig(alpha=0.5, repeats=2, seed=4))
    assert a == b
    assert a.kl != c.kl
    assert all(s > 0 and math.isfinite(s) for s in a.kl + a.local)


def test_layer_l_shortcut_equals_full_recomputation(arch: str) -> None:
    """Rerunning only layers >= l gives the KL of a full forward pass over the perturbed cache."""
    model = tiny_model(arch, layers=4)
    ctx, cont = random_ids(36), random_ids(6, 1)
    config = ProfilingConfig(alpha=0.7, repeats=2, seed=11)
    scores = score_sample(model, ctx, cont, config, sample_index=5)
    clean = _prefill(model, ctx)
    positions = torch.arange(36, 42)
    with torch.no_grad():
        ref = (
            model(
                cont, past_key_values=cache_from_tensors(clean), cache_position=positions, position_ids=positions[None]
            )
            .logits[0]
            .float()
            .log_softmax(-1)
        )
        for layer in range(4):
            pairs = [(k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1)) for k, v in clean]
            noisy = pairs[layer][1] + norm_adaptive_noise(pairs[layer][1], 0.7, noise_generator(11, 5, layer))
            pairs[layer] = (pairs[layer][0], noisy)
            cache = cache_from_tensors(pairs)
            logp = (
                model(cont.expand(2, -1), past_key_values=cache, cache_position=positions, position_ids=positions[None])
                .logits.float()
                .log_softmax(-1)
            )
            kl = (ref.exp() * (ref - logp)).sum(-1).mean()
            assert math.isclose(float(kl), scores.kl[layer], rel_tol=1e-4, abs_tol=1e-7)


def test_profile_model_roundtrip_and_mismatch(tmp_path: Path) -> None:
    model = tiny_model("llama", layers=3)
    profile = profile_model(model, CharTokenizer(), _calibration(2), ProfilingConfig(alpha=0.4, repeats=1))
    assert len(profile.scores) == 3 and len(profile.sample_scores) == 2
    assert all(len(row) == 3 for row in profile.sample_scores)
    path = profile.save(tmp_path / "p.json")
    loaded = SensitivityProfile.load(path)
    assert loaded == profile
    loaded.check_model(model)  # the profiled model: silent
    with pytest.warns(ProfileWeightsWarning, match="other weights"):  # same architecture, other weights
        loaded.check_model(tiny_model("llama", layers=3, seed=9))
    with pytest.raises(ProfileError, match="num_hidden_layers"):
        loaded.check_model(tiny_model("llama", layers=4))
    with pytest.raises(ProfileError, match="config hashes differ"):
        loaded.check_model(tiny_model("qwen2", layers=3))


def test_nan_profile_is_rejected(tmp_path: Path) -> None:
    model = tiny_model("llama", layers=2)
    profile = profile_model(model, CharTokenizer(), _calibration(1), ProfilingConfig(repeats=1))
    data = profile.to_dict()
    data["scores"] = [data["scores"][0], float("nan")]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="layer 1.*NaN"):
        SensitivityProfile.load(path)
    with pytest.raises(ProfileError, match="not a RippleKV profile"):
        SensitivityProfile.from_dict({"scores": []})


def test_interrupted_profiling_resumes(tmp_path: Path) -> None:
    model = tiny_model("mistral", layers=2)
    calibration, config = _calibration(3), ProfilingConfig(alpha=0.5, repeats=1, seed=1)
    whole = profile_model(model, CharTokenizer(), calibration, config)

    class Interrupt(Exception):
        pass

    def stop_after_two(done: int, total: int) -> None:
        if done == 2:
            raise Interrupt

    ckpt = tmp_path / "profile.partial.jsonl"
    with pytest.raises(Interrupt):
        profile_model(model, CharTokenizer(), calibration, config, checkpoint=ckpt, progress=stop_after_two)
    # a line cut by the interruption is tolerated (that sample is redone)
    with ckpt.open("a") as f:
        f.write('{"sample": 2, "kl": [0.1')
    seen: list[int] = []
    resumed = profile_model(
        model, CharTokenizer(), calibration, config, checkpoint=ckpt, progress=lambda done, total: seen.append(done)
    )
    assert seen[0] == 2  # two samples came from the checkpoint
    assert resumed.scores == whole.scores and resumed.sample_scores == whole.sample_scores


def test_bad_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="alpha"):
        ProfilingConfig(alpha=float("nan"))
    with pytest.raises(ValueError, match="repeats"):
        ProfilingConfig(repeats=0)


@pytest.mark.parametrize("repeats", [1, 3])
def test_batched_shared_prefix_path_equals_layer_by_layer(arch: str, repeats: int) -> None:
    """The fast path (one batch grown by depth, shared prefixes) computes what the generic path computes."""
    from ripplekv.models.attention import enable_varlen_attention
    from ripplekv.profiling.passes import can_share_prefix

    model = tiny_model(arch, layers=4)
    fast_model = enable_varlen_attention(tiny_model(arch, layers=4))
    ctx, cont = random_ids(50, 3), random_ids(7, 4)
    config = ProfilingConfig(alpha=0.6, repeats=repeats, seed=2)
    assert not can_share_prefix(model, 57) and can_share_prefix(fast_model, 57)
    slow = score_sample(model, ctx, cont, config, sample_index=1)
    fast = score_sample(fast_model, ctx, cont, config, sample_index=1)
    for a, b in zip(slow.kl + slow.local, fast.kl + fast.local):
        assert math.isclose(a, b, rel_tol=2e-4, abs_tol=1e-7), (slow, fast)


def test_shared_prefix_attention_matches_sdpa_over_concatenated_caches() -> None:
    from ripplekv.models.shared_prefix import SharedPrefix, shared_prefix_attention

    generator = torch.Generator().manual_seed(0)
    rows, heads, kv_heads, length, new, dim = 5, 6, 2, 40, 4, 8
    query = torch.randn(rows, heads, new, dim, generator=generator)
    key, value = (torch.randn(rows, kv_heads, new, dim, generator=generator) for _ in range(2))
    prefix_k, prefix_v = (torch.randn(1, kv_heads, length, dim, generator=generator) for _ in range(2))
    delta = torch.randn(2, kv_heads, length, dim, generator=generator)
    out = shared_prefix_attention(query, key, value, SharedPrefix(prefix_k, prefix_v, delta))
    full_v = prefix_v.expand(rows, -1, -1, -1).clone()
    full_v[-2:] += delta
    keys = torch.cat([prefix_k.expand(rows, -1, -1, -1), key], dim=2)
    values = torch.cat([full_v, value], dim=2)
    mask = torch.ones(new, length + new, dtype=torch.bool).tril(diagonal=length)
    ref = torch.nn.functional.scaled_dot_product_attention(
        query, keys.repeat_interleave(3, 1), values.repeat_interleave(3, 1), attn_mask=mask
    ).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fused", [True, False])
def test_shared_prefix_attention_chunked_and_unfused(monkeypatch: pytest.MonkeyPatch, fused: bool) -> None:
    """Chunking the rows (memory bound) and the plain-matmul fallback give the same result."""
    from ripplekv.models import shared_prefix
    from ripplekv.models.shared_prefix import SharedPrefix, shared_prefix_attention

    generator = torch.Generator().manual_seed(1)
    query = torch.randn(7, 4, 3, 8, generator=generator)
    key, value = (torch.randn(7, 2, 3, 8, generator=generator) for _ in range(2))
    prefix = SharedPrefix(
        *(torch.randn(1, 2, 20, 8, generator=generator) for _ in range(2)),
        value_delta=torch.randn(3, 2, 20, 8, generator=generator),
    )
    whole = shared_prefix_attention(query, key, value, prefix)
    if not fused:
        monkeypatch.setattr(shared_prefix, "_FLASH_CPU", None)
    monkeypatch.setattr(shared_prefix, "MAX_SCORE_BYTES", 2 * 2 * 3 * 20 * 4)  # two rows per chunk
    torch.testing.assert_close(shared_prefix_attention(query, key, value, prefix), whole, atol=1e-5, rtol=1e-5)


def test_reference_rows_keep_clean_values_and_noisy_rows_the_same_draws() -> None:
    """``clean_rows`` rows of a perturbed cache hold the clean Values; the others get the draws a cache
    without clean rows would get (same generator), so adding the reference row changes no noise."""
    model = tiny_model("llama", layers=3)
    clean = _prefill(model, random_ids(25))
    with_ref = ContinuationBuffers(clean, room=4, batch=3).perturbed_cache(
        1, 0.5, noise_generator(0, 0, 1), clean_rows=1
    )
    without = ContinuationBuffers(clean, room=4, batch=2).perturbed_cache(1, 0.5, noise_generator(0, 0, 1))
    assert torch.equal(with_ref.layers[1].values[0], clean[1][1][0])
    assert torch.equal(with_ref.layers[1].values[1:], without.layers[1].values)
    with pytest.raises(ValueError, match="clean_rows"):
        ContinuationBuffers(clean, room=4, batch=2).perturbed_cache(1, 0.5, noise_generator(0, 0, 1), clean_rows=2)


def test_weights_fingerprint_tells_weights_apart() -> None:
    model = tiny_model("llama", layers=2, seed=0)
    fingerprint = weights_fingerprint(model)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", fingerprint)
    assert weights_fingerprint(tiny_model("llama", layers=2, seed=0)) == fingerprint  # same weights, same digest
    other = tiny_model("llama", layers=2, seed=1)
    assert model_identity(other)["config_hash"] == model_identity(model)["config_hash"]  # same architecture
    assert weights_fingerprint(other) != fingerprint
    assert weights_fingerprint(tiny_model("llama", layers=2, seed=0).to(torch.bfloat16)) != fingerprint
    with torch.no_grad():
        model.model.norm.weight[0] += 1e-3  # one changed weight is enough
    assert weights_fingerprint(model) != fingerprint
    with pytest.raises(TypeError, match="torch module"):
        weights_fingerprint(object())  # type: ignore[arg-type]


def test_profile_stores_the_fingerprint_and_old_profiles_still_load(tmp_path: Path) -> None:
    model = tiny_model("llama", layers=2)
    profile = profile_model(model, CharTokenizer(), _calibration(1), ProfilingConfig(repeats=1))
    assert profile.weights_fingerprint == weights_fingerprint(model)
    assert SensitivityProfile.load(profile.save(tmp_path / "p.json")) == profile
    old = profile.to_dict()
    del old["weights_fingerprint"]  # a profile written before the field existed
    assert SensitivityProfile.from_dict(old).weights_fingerprint is None
    with pytest.raises(ProfileError, match="weights_fingerprint"):
        SensitivityProfile.from_dict({**old, "weights_fingerprint": ""})


def test_checkpoint_of_other_weights_of_the_same_architecture_is_not_resumed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint is keyed by the weights: resuming it with another seed's model starts over."""
    calibration, config = _calibration(3), ProfilingConfig(alpha=0.5, repeats=1, seed=1)
    first, second = tiny_model("mistral", layers=2, seed=0), tiny_model("mistral", layers=2, seed=1)

    class Interrupt(Exception):
        pass

    def stop_after_two(done: int, total: int) -> None:
        if done == 2:
            raise Interrupt

    ckpt = tmp_path / "profile.partial.jsonl"
    with pytest.raises(Interrupt):
        profile_model(first, CharTokenizer(), calibration, config, checkpoint=ckpt, progress=stop_after_two)
    seen: list[int] = []
    with caplog.at_level(logging.WARNING, logger="ripplekv.profiling.checkpoint"):
        resumed = profile_model(
            second,
            CharTokenizer(),
            calibration,
            config,
            checkpoint=ckpt,
            progress=lambda done, total: seen.append(done),
        )
    assert seen[0] == 0  # nothing was taken from the first model's checkpoint
    assert "weights differ" in caplog.text
    fresh = profile_model(second, CharTokenizer(), calibration, config)
    assert resumed.sample_scores == fresh.sample_scores and resumed.scores == fresh.scores
    assert json.loads(ckpt.read_text().splitlines()[0])["weights"] == weights_fingerprint(second)
