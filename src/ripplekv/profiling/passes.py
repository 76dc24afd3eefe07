"""The perturbed continuation passes of sensitivity profiling, and the reference they are compared with.

A clean continuation pass over the prefilled cache records every decoder layer's call (its input hidden
states and keyword arguments). The perturbed passes then start at the perturbed layer ``l`` from that
recorded input (layers below ``l`` cannot see a perturbation of layer ``l``).

The reference distribution of a perturbed row is always computed by the *same arithmetic, in the same
batch* as the row itself: one extra row whose noise is zero. Comparing against a reference computed another
way (stock attention in bfloat16 against the fast path's float32 attention, or another batch shape) leaves a
numerical floor in every score, larger for the early layers whose perturbed rows run through more layers of
the other arithmetic. With the reference in the batch, ``alpha = 0`` gives the same KL (zero up to float64
rounding) at every layer, in float32 and in bfloat16.

Two strategies, same results:

* :func:`batched_by_depth` (RippleKV attention, full attention): one pass over the layers whose batch grows
  by depth, every row attending to each layer's shared clean prefix (:mod:`ripplekv.models.shared_prefix`).
* :func:`layer_by_layer` (any attention implementation): per layer ``l``, one batch of the reference row and
  the noise draws, run from layer ``l`` up over preallocated cache buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from ripplekv.models.attention import uses_varlen_attention
from ripplekv.models.cache import KVPair, PassThroughLayer, cache_from_layers
from ripplekv.models.shared_prefix import SharedPrefix
from ripplekv.profiling.divergence import ReferenceDistribution, kl_divergence, relative_change
from ripplekv.profiling.noise import ContinuationBuffers, noise_generator, norm_adaptive_noise


@dataclass(frozen=True)
class NoiseSpec:
    """What the perturbed rows of one sample get.

    Attributes:
        alpha: relative noise scale.
        repeats: noise draws (rows) per perturbed layer.
        seed: profiling seed.
        sample: index of the sample (part of the noise seed).
    """

    alpha: float
    repeats: int
    seed: int
    sample: int

    def generator(self, layer: int) -> torch.Generator:
        """The noise generator of ``layer`` for this sample."""
        return noise_generator(self.seed, self.sample, layer)


@dataclass(frozen=True)
class CleanPass:
    """What the clean continuation pass leaves for the perturbed passes.

    Attributes:
        clean: the prefilled ``(keys, values)`` of every layer, batch 1.
        calls: ``(args, kwargs)`` of each decoder layer's call in the clean continuation pass.
        new_tokens: continuation length.
    """

    clean: Sequence[KVPair]
    calls: Sequence[tuple[tuple, dict]]
    new_tokens: int

    def layer_input(self, index: int) -> torch.Tensor:
        """The hidden states that entered decoder layer ``index`` (batch 1)."""
        args, kwargs = self.calls[index]
        return args[0] if args else kwargs["hidden_states"]


def decoder_of(model: PreTrainedModel) -> nn.Module:
    """The decoder stack (``layers`` and final ``norm``) of a causal LM."""
    decoder = model.get_decoder()
    if not hasattr(decoder, "layers") or not hasattr(decoder, "norm"):
        raise ValueError(f"{type(model).__name__} has no decoder `layers`/`norm`: not a supported architecture")
    return decoder


@contextmanager
def record_layer_calls(layers: Sequence[nn.Module]) -> Iterator[list[tuple[tuple, dict]]]:
    """Record ``(args, kwargs)`` of each decoder layer's call during the block.

    Args:
        layers: the decoder layers.
    """
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
def _record_attention_output(layer: nn.Module, store: list[torch.Tensor]) -> Iterator[None]:
    """Append the output of ``layer``'s self-attention to ``store`` during the block."""

    def hook(module: nn.Module, args: tuple, output: Any) -> None:
        store.append(output[0] if isinstance(output, tuple) else output)

    handle = layer.self_attn.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def can_share_prefix(model: PreTrainedModel, length: int) -> bool:
    """Whether :func:`batched_by_depth` applies: RippleKV attention and full (not sliding) attention.

    The shared-prefix rows are read by ripplekv's own attention functions only (``ripplekv_sdpa`` /
    ``ripplekv_eager``, :func:`ripplekv.models.attention.uses_varlen_attention`). Under any other implementation,
    FlashAttention included (kept as the user loaded it), this is False and profiling takes the exact generic path,
    :func:`layer_by_layer`, which gives the same scores up to float rounding.

    Args:
        model: the profiled model.
        length: context plus continuation tokens.
    """
    window = getattr(model.config.get_text_config(), "sliding_window", None)
    return uses_varlen_attention(model) and (window is None or window >= length)


def _layer_kwargs(call: tuple[tuple, dict], cache: DynamicCache) -> dict[str, Any]:
    kwargs = {k: v for k, v in call[1].items() if k != "hidden_states"}
    kwargs["past_key_values"] = cache
    return kwargs


def _hidden(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _score(value: torch.Tensor) -> float:
    """Mean over noise draws, clamped at zero only now (a float64 KL average can round to -1e-17)."""
    return max(0.0, float(value.mean()))


def layer_by_layer(model: PreTrainedModel, clean: CleanPass, noise: NoiseSpec) -> tuple[list[float], list[float]]:
    """Generic path, any attention implementation: per layer l, one batch from layer l up.

    Row 0 of the batch keeps the clean Values (the reference), rows ``1..repeats`` carry the noise draws.

    Args:
        model: the profiled model.
        clean: the clean continuation pass.
        noise: noise of the perturbed rows.

    Returns:
        Per-layer KL scores and local (relative attention-output change) scores.
    """
    decoder, lm_head = decoder_of(model), model.get_output_embeddings()
    layers = list(decoder.layers)
    batch = 1 + noise.repeats
    buffers = ContinuationBuffers(clean.clean, room=clean.new_tokens, batch=batch)
    kl_scores, local_scores = [], []
    for index, layer in enumerate(layers):
        cache = buffers.perturbed_cache(index, noise.alpha, noise.generator(index), clean_rows=1)
        hidden = clean.layer_input(index).expand(batch, -1, -1)
        attention: list[torch.Tensor] = []
        with _record_attention_output(layer, attention):
            for j in range(index, len(layers)):
                hidden = _hidden(layers[j](hidden, **_layer_kwargs(clean.calls[j], cache)))
        logits = lm_head(decoder.norm(hidden))
        kl_scores.append(_score(kl_divergence(logits[:1], logits[1:])))
        local_scores.append(_score(relative_change(attention[0][:1], attention[0][1:])))
    return kl_scores, local_scores


def batched_by_depth(model: PreTrainedModel, clean: CleanPass, noise: NoiseSpec) -> tuple[list[float], list[float]]:
    """Fast path: every perturbation in one batch, grown by depth, over shared prefixes.

    Row 0 is the reference: the continuation over the clean cache, computed by the shared-prefix attention
    like every other row. At layer j the batch holds it and one block of ``repeats`` rows per perturbed layer
    l <= j: blocks l < j carry the hidden states their perturbation produced so far, and block j enters as a
    copy of row 0 (layers below j cannot see a perturbation of layer j). Every row attends to layer j's clean
    prefix, read once for the whole batch; block j (the last rows) adds its noise to the prefix values. Same
    arithmetic as :func:`layer_by_layer`, a single pass over the layers, and no copy of the prefix per row.

    Only ripplekv's attention functions serve the ``shared_prefix`` keyword (FlashAttention would ignore it and
    attend to the new tokens alone): callers check :func:`can_share_prefix` and take :func:`layer_by_layer` when
    it is False.

    Args:
        model: the profiled model (RippleKV attention, see :func:`can_share_prefix`).
        clean: the clean continuation pass.
        noise: noise of the perturbed rows.

    Returns:
        Per-layer KL scores and local (relative attention-output change) scores.
    """
    decoder, lm_head = decoder_of(model), model.get_output_embeddings()
    layers = list(decoder.layers)
    repeats = noise.repeats
    cache = cache_from_layers([PassThroughLayer(clean.clean[0][0].shape[-2]) for _ in layers])
    hidden = clean.layer_input(0)  # row 0: the reference
    local_scores = []
    for j, layer in enumerate(layers):
        hidden = torch.cat([hidden, hidden[:1].expand(repeats, -1, -1)])
        keys, values = clean.clean[j]
        delta = norm_adaptive_noise(values.expand(repeats, -1, -1, -1), noise.alpha, noise.generator(j))
        layer_kwargs = _layer_kwargs(clean.calls[j], cache)
        layer_kwargs["shared_prefix"] = SharedPrefix(keys, values, value_delta=delta)
        attention: list[torch.Tensor] = []
        with _record_attention_output(layer, attention):
            hidden = _hidden(layer(hidden, **layer_kwargs))
        local_scores.append(_score(relative_change(attention[0][:1], attention[0][-repeats:])))

    normed = decoder.norm(hidden)  # (1 + layers * repeats, new, hidden): row 0 the reference, then block l
    reference = ReferenceDistribution(lm_head(normed[:1]))
    kl_scores = []
    for block in range(len(layers)):
        rows = normed[1 + block * repeats : 1 + (block + 1) * repeats]
        kl_scores.append(_score(reference.kl(lm_head(rows))))
    return kl_scores, local_scores
