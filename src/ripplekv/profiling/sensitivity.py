"""Offline sensitivity profiling (RippleKV paper, 2026, step 1).

For every calibration sample (a context and its continuation):

1. prefill the context once into a full ``DynamicCache``;
2. run the continuation over a view of that cache: its next-token distributions ``P_ref`` are the
   reference, and the input hidden states and call arguments of every decoder layer are recorded;
3. for each layer ``l`` and each noise draw: add norm-adaptive noise to layer ``l``'s cached *Values*
   only (each value vector ``v`` gets ``alpha * ||v|| * u``, ``u`` a uniformly random unit vector), rerun the
   continuation **from layer l up** (layers below ``l`` cannot see the perturbation, so their recorded
   outputs are reused) and take ``KL(P_ref || P_perturbed)`` averaged over the continuation positions.

Cost: one prefill per sample plus, per layer, ``(L - l) / L`` of a continuation pass, never L prefills.
Keys and every other layer are never touched: perturbed caches are views that share the prefill's
tensors, except for the one freshly allocated perturbed Value tensor. The noise draws of a repeat are
batched into one pass per layer. Everything is seeded: the same inputs give the same profile.

Progress is checkpointed per sample to a JSON-lines file, so an interrupted run resumes where it
stopped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.models.attention import uses_varlen_attention
from ripplekv.models.cache import (
    KVPair,
    PassThroughLayer,
    PreallocatedLayer,
    cache_from_layers,
    cache_from_tensors,
    cache_tensors,
)
from ripplekv.models.loading import model_identity
from ripplekv.models.shared_prefix import SharedPrefix
from ripplekv.profiling.calibration import CalibrationSet
from ripplekv.profiling.profile import SensitivityProfile

DEFAULT_ALPHA = 0.5
DEFAULT_REPEATS = 1  # benchmarks/profile_stability.py: rho 0.983 across noise seeds, 0.995 vs 4 repeats


@dataclass(frozen=True)
class ProfilingConfig:
    """Parameters of sensitivity profiling.

    Attributes:
        alpha: relative noise scale; each cached value vector ``v`` of the perturbed layer becomes
            ``v + alpha * ||v|| * u`` with ``u`` a random unit vector. Norm-adaptive: every layer gets noise
            proportional to its own value magnitudes, so scores compare layers fairly.
        repeats: independent noise draws per (sample, layer), averaged (and run as one batch).
        seed: seed of the noise; draws depend only on ``(seed, sample index, repeat, layer)``.
        max_context_tokens: contexts are cut to their last ``max_context_tokens`` tokens (None: the model's
            ``max_position_embeddings`` minus the continuation).
    """

    alpha: float = DEFAULT_ALPHA
    repeats: int = DEFAULT_REPEATS
    seed: int = 0
    max_context_tokens: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.alpha, (int, float)) and np.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {self.alpha!r}")
        if not (isinstance(self.repeats, int) and self.repeats >= 1):
            raise ValueError(f"repeats must be an integer >= 1, got {self.repeats!r}")
        if self.max_context_tokens is not None and self.max_context_tokens < 1:
            raise ValueError(f"max_context_tokens must be >= 1, got {self.max_context_tokens}")


@dataclass(frozen=True)
class SampleScores:
    """Per-layer scores of one calibration sample."""

    kl: tuple[float, ...]
    local: tuple[float, ...]
    context_tokens: int
    continuation_tokens: int


def norm_adaptive_noise(values: torch.Tensor, alpha: float, generator: torch.Generator) -> torch.Tensor:
    """Noise ``alpha * ||v|| * u`` for every vector ``v`` along the last dimension of ``values``.

    ``u`` is uniform on the unit sphere (a normalised Gaussian). Drawn on the CPU in float32 from
    ``generator`` so that draws do not depend on the device, then cast to ``values``' dtype and device.
    """
    gauss = torch.randn(values.shape, generator=generator, dtype=torch.float32)
    unit = gauss / gauss.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    norms = values.detach().float().norm(dim=-1, keepdim=True).cpu()
    return (alpha * norms * unit).to(device=values.device, dtype=values.dtype)


class ContinuationBuffers:
    """The prefilled context of every layer, in buffers with room for the continuation, ``batch`` rows each.

    Built once per sample. Clean and perturbed passes get caches of :class:`PreallocatedLayer` views over
    these buffers, so a pass writes its continuation tokens in place instead of concatenating a copy of the
    whole context into every layer. Keys are never written before the prefix end; a perturbed pass reads
    the noisy Values of its layer from a separate buffer, so every clean tensor stays bit-identical.

    Memory: ``batch + 1`` times the context's KV cache (the buffers plus one noisy Value buffer per shape).
    """

    def __init__(self, clean: Sequence[KVPair], room: int, batch: int) -> None:
        self.prefix = clean[0][0].shape[-2]
        self.batch = batch
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        for k, v in clean:
            for source, target in ((k, self.keys), (v, self.values)):
                buffer = source.new_empty((batch, *source.shape[1:-2], self.prefix + room, source.shape[-1]))
                buffer[..., : self.prefix, :] = source
                target.append(buffer)
        self._noisy: dict[tuple[int, ...], torch.Tensor] = {}

    def clean_cache(self) -> DynamicCache:
        """A batch-1 cache over row 0 of the clean buffers."""
        return cache_from_layers([PreallocatedLayer(k[:1], v[:1], self.prefix) for k, v in zip(self.keys, self.values)])

    def perturbed_cache(self, layer: int, alpha: float, generator: torch.Generator) -> DynamicCache:
        """A batch cache in which only layer ``layer``'s context Values carry noise (one draw per row)."""
        values = self.values[layer]
        noisy = self._noisy.get(tuple(values.shape))
        if noisy is None:
            noisy = self._noisy.setdefault(tuple(values.shape), torch.empty_like(values))
        context = values[..., : self.prefix, :]
        torch.add(context, norm_adaptive_noise(context, alpha, generator), out=noisy[..., : self.prefix, :])
        layers = [PreallocatedLayer(k, v, self.prefix) for k, v in zip(self.keys, self.values)]
        layers[layer] = PreallocatedLayer(self.keys[layer], noisy, self.prefix)
        return cache_from_layers(layers)


def noise_generator(seed: int, sample: int, layer: int) -> torch.Generator:
    """The noise generator of one (seed, sample, layer): independent streams, reproducible anywhere."""
    state = np.random.SeedSequence([seed, sample, layer]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def _decoder(model: PreTrainedModel) -> nn.Module:
    decoder = model.get_decoder()
    if not hasattr(decoder, "layers") or not hasattr(decoder, "norm"):
        raise ValueError(f"{type(model).__name__} has no decoder `layers`/`norm`: not a supported architecture")
    return decoder


@contextmanager
def _record_layer_calls(layers: Sequence[nn.Module]) -> Iterator[list[tuple[tuple, dict]]]:
    """Record ``(args, kwargs)`` of each decoder layer's call during the block."""
    calls: list[tuple[tuple, dict]] = [((), {})] * len(layers)

    def recorder(index: int) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            calls[index] = (args, dict(kwargs))

        return hook

    handles = [layer.register_forward_pre_hook(recorder(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def _record_attention_outputs(layers: Sequence[nn.Module], store: dict[int, torch.Tensor]) -> Iterator[None]:
    """Record the output of each layer's self-attention into ``store[layer_index]``."""

    def recorder(index: int) -> Callable:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            store[index] = output[0] if isinstance(output, tuple) else output

        return hook

    handles = [layer.self_attn.register_forward_hook(recorder(i)) for i, layer in enumerate(layers)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _expected_logp(ref_p: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``sum_v P_ref(v) log P(v)`` per row and position, from raw logits (``(B, T, V)`` -> ``(B, T)``)."""
    logits = logits.float()
    return (ref_p * logits).sum(-1) - torch.logsumexp(logits, dim=-1)


@torch.no_grad()
def score_sample(
    model: PreTrainedModel,
    context_ids: torch.Tensor,
    continuation_ids: torch.Tensor,
    config: ProfilingConfig,
    sample_index: int = 0,
) -> SampleScores:
    """Per-layer sensitivity scores of one sample (see the module docstring).

    Args:
        model: a decoder-only transformers model with ``model.get_decoder().layers`` (Llama, Qwen2, Mistral...).
        context_ids: ``(1, n)`` token ids prefilled into the cache.
        continuation_ids: ``(1, m)`` token ids run over the cache; ``m >= 1``.
        config: profiling parameters.
        sample_index: index of the sample, part of the noise seed.
    """
    if context_ids.dim() != 2 or context_ids.shape[0] != 1 or continuation_ids.dim() != 2:
        raise ValueError("score_sample takes one sample: ids of shape (1, n)")
    if continuation_ids.shape[1] < 1 or context_ids.shape[1] < 1:
        raise ValueError("context and continuation must each hold at least one token")
    device = next(model.parameters()).device
    context_ids, continuation_ids = context_ids.to(device), continuation_ids.to(device)
    decoder = _decoder(model)
    layers = list(decoder.layers)
    n_ctx, n_cont = context_ids.shape[1], continuation_ids.shape[1]
    positions = torch.arange(n_ctx, n_ctx + n_cont, device=device)

    prefill = DynamicCache()
    model(context_ids, past_key_values=prefill, use_cache=True, logits_to_keep=1)
    clean = cache_tensors(prefill)
    del prefill

    clean_attention: dict[int, torch.Tensor] = {}
    with _record_layer_calls(layers) as calls, _record_attention_outputs(layers, clean_attention):
        logits = model(
            continuation_ids,
            past_key_values=cache_from_tensors(clean),
            use_cache=True,
            cache_position=positions,
            position_ids=positions.unsqueeze(0),
        ).logits
    ref_logp = torch.log_softmax(logits[0].float(), dim=-1)
    ref_p = ref_logp.exp()
    ref_neg_entropy = (ref_p * ref_logp).sum(-1)  # KL(P_ref || P) = sum P_ref log P_ref - sum P_ref log P

    ref = _Reference(clean, calls, clean_attention, ref_p, ref_neg_entropy, n_cont)
    run = _batched_by_depth if _can_share_prefix(model, n_ctx + n_cont) else _layer_by_layer
    kl_scores, local_scores = run(model, ref, config, sample_index)
    return SampleScores(tuple(kl_scores), tuple(local_scores), n_ctx, n_cont)


@dataclass(frozen=True)
class _Reference:
    """What the clean continuation pass leaves for the perturbed passes."""

    clean: Sequence[KVPair]  # prefilled (keys, values) per layer
    calls: Sequence[tuple[tuple, dict]]  # (args, kwargs) of each decoder layer's call
    attention: dict[int, torch.Tensor]  # each layer's self-attention output
    p: torch.Tensor  # (new, vocab) next-token probabilities
    neg_entropy: torch.Tensor  # (new,) sum_v p log p
    new_tokens: int

    def kl(self, logits: torch.Tensor) -> torch.Tensor:
        """KL(P_ref || softmax(logits)) per row, averaged over positions."""
        return (self.neg_entropy - _expected_logp(self.p, logits)).clamp_min(0.0).mean(-1)


def _can_share_prefix(model: PreTrainedModel, length: int) -> bool:
    """Whether the batched shared-prefix path applies: RippleKV attention and full (not sliding) attention."""
    window = getattr(model.config.get_text_config(), "sliding_window", None)
    return uses_varlen_attention(model) and (window is None or window >= length)


def _layer_kwargs(call: tuple[tuple, dict], cache: DynamicCache) -> dict[str, Any]:
    kwargs = {k: v for k, v in call[1].items() if k != "hidden_states"}
    kwargs["past_key_values"] = cache
    return kwargs


def _local_change(perturbed: torch.Tensor, clean: torch.Tensor) -> float:
    clean = clean.float()
    delta = (perturbed.float() - clean).norm(dim=-1)
    return float((delta / clean.norm(dim=-1).clamp_min(1e-12)).mean())


def _layer_by_layer(
    model: PreTrainedModel, ref: _Reference, config: ProfilingConfig, sample_index: int
) -> tuple[list[float], list[float]]:
    """Generic path, any attention implementation: per layer l, one batch of noise draws from layer l up."""
    decoder, lm_head = _decoder(model), model.get_output_embeddings()
    layers = list(decoder.layers)
    buffers = ContinuationBuffers(ref.clean, room=ref.new_tokens, batch=config.repeats)
    kl_scores, local_scores = [], []
    for index, layer in enumerate(layers):
        cache = buffers.perturbed_cache(index, config.alpha, noise_generator(config.seed, sample_index, index))
        args, kwargs = ref.calls[index]
        hidden = args[0] if args else kwargs["hidden_states"]
        hidden = hidden.expand(config.repeats, *hidden.shape[1:])
        perturbed_attention: dict[int, torch.Tensor] = {}
        with _record_attention_outputs([layer], perturbed_attention):
            for j in range(index, len(layers)):
                out = layers[j](hidden, **_layer_kwargs(ref.calls[j], cache))
                hidden = out[0] if isinstance(out, tuple) else out
        kl_scores.append(float(ref.kl(lm_head(decoder.norm(hidden))).mean()))
        local_scores.append(_local_change(perturbed_attention[0], ref.attention[index]))
    return kl_scores, local_scores


def _batched_by_depth(
    model: PreTrainedModel, ref: _Reference, config: ProfilingConfig, sample_index: int
) -> tuple[list[float], list[float]]:
    """Fast path: every perturbation in one batch, grown by depth, over shared prefixes.

    At layer j the batch holds one block of ``repeats`` rows per perturbed layer l <= j: blocks l < j carry
    the hidden states their perturbation produced so far, and block j enters with layer j's clean input
    (layers below j cannot see a perturbation of layer j). Every row attends to layer j's clean prefix,
    read once for the whole batch; block j adds its noise to the prefix values. Same arithmetic as
    :func:`_layer_by_layer`, a single pass over the layers, and no copy of the prefix per row.
    """
    decoder, lm_head = _decoder(model), model.get_output_embeddings()
    layers = list(decoder.layers)
    repeats = config.repeats
    cache = cache_from_layers([PassThroughLayer(ref.clean[0][0].shape[-2]) for _ in layers])
    hidden: torch.Tensor | None = None
    local_scores = []
    for j, layer in enumerate(layers):
        args, kwargs = ref.calls[j]
        entering = (args[0] if args else kwargs["hidden_states"]).expand(repeats, -1, -1)
        hidden = entering if hidden is None else torch.cat([hidden, entering])
        keys, values = ref.clean[j]
        noise = norm_adaptive_noise(
            values.expand(repeats, -1, -1, -1), config.alpha, noise_generator(config.seed, sample_index, j)
        )
        layer_kwargs = _layer_kwargs(ref.calls[j], cache)
        layer_kwargs["shared_prefix"] = SharedPrefix(keys, values, value_delta=noise)
        attention: dict[int, torch.Tensor] = {}
        with _record_attention_outputs([layer], attention):
            out = layer(hidden, **layer_kwargs)
        hidden = out[0] if isinstance(out, tuple) else out
        local_scores.append(_local_change(attention[0][-repeats:], ref.attention[j]))

    kl_scores = []
    normed = decoder.norm(hidden)  # (layers * repeats, new, hidden): block l = perturbation of layer l
    for block in range(len(layers)):
        rows = normed[block * repeats : (block + 1) * repeats]
        kl_scores.append(float(ref.kl(lm_head(rows)).mean()))
    return kl_scores, local_scores


def _tokenize(tokenizer: PreTrainedTokenizerBase, text: str) -> torch.Tensor:
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    return ids


class _Checkpoint:
    """Per-sample results in a JSON-lines file; the first line is the run's key."""

    def __init__(self, path: Path, key: dict[str, Any]) -> None:
        self.path = path
        self.key = key
        self.done: dict[int, SampleScores] = {}
        if path.exists():
            lines = path.read_text().splitlines()
            header = json.loads(lines[0]) if lines else None
            if header == key:
                for line in lines[1:]:
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        break  # a line cut by an interruption: that sample is redone
                    self.done[row["sample"]] = SampleScores(
                        tuple(row["kl"]),
                        tuple(row["local"]),
                        row["context_tokens"],
                        row["continuation_tokens"],
                    )
        if not self.done:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(key) + "\n")

    def add(self, index: int, scores: SampleScores) -> None:
        self.done[index] = scores
        row = {
            "sample": index,
            "kl": scores.kl,
            "local": scores.local,
            "context_tokens": scores.context_tokens,
            "continuation_tokens": scores.continuation_tokens,
        }
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())


def profile_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    calibration: CalibrationSet,
    config: ProfilingConfig | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SensitivityProfile:
    """Measure the sensitivity profile of ``model`` on ``calibration``.

    Args:
        model: the model to profile (evaluation mode; any device and dtype).
        tokenizer: its tokenizer.
        calibration: calibration samples (context + continuation).
        config: noise scale, repeats, seed and context limit (default: :class:`ProfilingConfig()`).
        checkpoint: optional JSON-lines file; finished samples are appended to it and a rerun with the
            same model, calibration and config skips them.
        progress: optional callback ``progress(done, total)`` after each sample.
    """
    from ripplekv import __version__

    config = config or ProfilingConfig()
    if len(calibration) == 0:
        raise ValueError("the calibration set is empty")
    identity = model_identity(model)
    max_ctx = config.max_context_tokens
    limit = getattr(model.config, "max_position_embeddings", None)
    key = {
        "model": identity["config_hash"],
        "calibration": calibration.sha256(),
        "alpha": config.alpha,
        "repeats": config.repeats,
        "seed": config.seed,
        "max_context_tokens": max_ctx,
    }
    ckpt = _Checkpoint(Path(checkpoint), key) if checkpoint is not None else None
    done: dict[int, SampleScores] = dict(ckpt.done) if ckpt else {}

    total = len(calibration)
    if progress:
        progress(len(done), total)
    for index, sample in enumerate(calibration.samples):
        if index in done:
            continue
        context_ids = _tokenize(tokenizer, sample.context)
        continuation_ids = _tokenize(tokenizer, sample.continuation)
        room = max_ctx if max_ctx is not None else (limit - continuation_ids.shape[1] if limit else None)
        if room is not None and context_ids.shape[1] > room:
            context_ids = context_ids[:, -room:]
        scores = score_sample(model, context_ids, continuation_ids, config, sample_index=index)
        done[index] = scores
        if ckpt:
            ckpt.add(index, scores)
        if progress:
            progress(len(done), total)

    ordered = [done[i] for i in range(total)]
    kl = np.array([s.kl for s in ordered], dtype=np.float64)
    local = np.array([s.local for s in ordered], dtype=np.float64)
    return SensitivityProfile(
        model=identity,
        scores=tuple(float(x) for x in kl.mean(0)),
        sample_scores=tuple(tuple(float(x) for x in row) for row in kl),
        local_scores=tuple(float(x) for x in local.mean(0)),
        alpha=float(config.alpha),
        repeats=config.repeats,
        seed=config.seed,
        calibration={
            "description": calibration.description,
            "sha256": calibration.sha256(),
            "samples": total,
            "context_tokens": [s.context_tokens for s in ordered],
            "continuation_tokens": [s.continuation_tokens for s in ordered],
        },
        library_version=__version__,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
