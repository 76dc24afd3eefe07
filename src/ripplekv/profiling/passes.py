"""The perturbed continuation passes of sensitivity profiling, and the reference they are compared with.

Perturbed passes start at layer ``l`` from the input the clean pass recorded there. Each row's reference is one
zero-noise row in the same batch (same arithmetic), so ``alpha = 0`` gives KL 0 (to float64 rounding) at every
layer; a reference computed otherwise leaves a numerical floor, largest at the early layers. Passes run in float32
whatever the model's dtype (only the prefill keeps it): in bfloat16 a logit of magnitude 16 is a multiple of 0.06
(~1e-4 nats of KL), a floor above the least sensitive layers (``benchmarks/profile_bf16.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from ripplekv.models.attention import uses_varlen_attention
from ripplekv.models.cache import KVPair, PassThroughLayer, cache_from_layers
from ripplekv.models.decoder import find_decoder
from ripplekv.models.layer_types import sliding_layers
from ripplekv.models.shared_prefix import SharedPrefix
from ripplekv.profiling.divergence import ReferenceDistribution, kl_divergence, relative_change
from ripplekv.profiling.noise import ContinuationBuffers, noise_generator, norm_adaptive_noise


@dataclass(frozen=True)
class NoiseSpec:
    """What the perturbed rows of one sample get: ``repeats`` noise draws (rows) per layer, relative scale ``alpha``."""

    alpha: float
    repeats: int
    seed: int
    sample: int

    def generator(self, layer: int) -> torch.Generator:
        """The noise generator of ``layer`` for this sample."""
        return noise_generator(self.seed, self.sample, layer)


@dataclass(frozen=True)
class CleanPass:
    """The clean continuation pass: prefilled ``(keys, values)`` per layer (batch 1) and each layer's ``calls``."""

    clean: Sequence[KVPair]
    calls: Sequence[tuple[tuple, dict]]
    new_tokens: int

    def layer_input(self, index: int) -> torch.Tensor:
        """The hidden states that entered decoder layer ``index`` (batch 1), in the dtype of the prefilled values
        (float32 for float32 passes)."""
        args, kwargs = self.calls[index]
        return (args[0] if args else kwargs["hidden_states"]).to(self.clean[0][1].dtype)


PRECISIONS = ("float32", "float32-head", "model")
"""Arithmetic of the continuation passes: float32 layers and head (default), float32 head only, or the model's dtype
(kept to measure what float32 changes)."""

MAX_HEAD_BYTES = 256 * 2**20
"""Largest float32 output projection kept by :class:`Float32Head`; larger ones are cast in chunks per call
(a 128K vocabulary of width 4,096 is 2 GiB in float32)."""


class ModelHead:
    """The model's final norm and output projection as the model computes them (its dtype), then its
    ``final_logit_softcapping`` (Gemma 2)."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.norm, self.head = decoder_of(model).norm, model.get_output_embeddings()
        cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
        self.softcap = None if cap is None else float(cap)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(hidden))

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``(..., vocab)`` of decoder output ``hidden`` ``(..., hidden_size)``."""
        logits = self.project(hidden)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


class Float32Head(ModelHead):
    """:class:`ModelHead` in float32, whatever the model's dtype; a projection above :data:`MAX_HEAD_BYTES` is cast
    in chunks per call. ValueError if the output embeddings are not a linear layer."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__(model)
        if not isinstance(self.head, nn.Linear):
            raise ValueError(f"{type(model).__name__}'s output embeddings are not a linear layer")
        weight = self.head.weight
        self._bias = None if self.head.bias is None else self.head.bias.detach().float()
        self.chunk = max(1, MAX_HEAD_BYTES // (weight.shape[1] * 4))
        self._float_weight = weight.detach().float() if weight.shape[0] <= self.chunk else None

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        normed = self.norm(hidden.float()).float()
        if self._float_weight is not None:
            return F.linear(normed, self._float_weight, self._bias)
        weight, bias, chunk = self.head.weight, self._bias, self.chunk
        parts = []
        for start in range(0, weight.shape[0], chunk):
            part_bias = None if bias is None else bias[start : start + chunk]
            parts.append(F.linear(normed, weight[start : start + chunk].detach().float(), part_bias))
        return torch.cat(parts, dim=-1)


MAX_LAYER_COPY_BYTES = 2 * 2**30
"""Most bytes of float32 layer copies :class:`Float32Layers` keeps for reuse (beyond it, layers are copied anew)."""

_LOW_PRECISION = (torch.bfloat16, torch.float16)


class Float32Layers:
    """The decoder layers in float32: bfloat16/float16 layers are copied (the model is never modified), and the
    copies kept while they take at most ``max_bytes``; float32 layers are used as they are."""

    def __init__(self, layers: Sequence[nn.Module], max_bytes: int = MAX_LAYER_COPY_BYTES) -> None:
        self.layers = list(layers)
        self.max_bytes = max_bytes
        self._copies: dict[int, nn.Module] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, index: int) -> nn.Module:
        layer = self.layers[index]
        if not any(p.dtype in _LOW_PRECISION for p in layer.parameters()):
            return layer
        if index in self._copies:
            return self._copies[index]
        copied = copy.deepcopy(layer).float()
        size = sum(p.numel() * p.element_size() for p in copied.parameters())
        if self._bytes + size <= self.max_bytes:
            self._copies[index] = copied
            self._bytes += size
        return copied


def decoder_of(model: PreTrainedModel) -> nn.Module:
    """The decoder stack (``layers`` and final ``norm``) of a causal LM."""
    decoder = find_decoder(model)
    if decoder is None or not hasattr(decoder, "norm"):
        raise ValueError(f"{type(model).__name__} has no decoder `layers`/`norm`: not a supported architecture")
    return decoder


@contextmanager
def record_layer_calls(layers: Sequence[nn.Module]) -> Iterator[list[tuple[tuple, dict]]]:
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
    """Whether :func:`batched_by_depth` applies: ripplekv's attention functions (the only readers of a shared
    prefix), and every sliding window fits ``length`` (context plus continuation tokens)."""
    config = model.config.get_text_config()
    window = getattr(config, "sliding_window", None)
    fits = window is None or window >= length or not any(sliding_layers(config))
    return uses_varlen_attention(model) and fits


def _layer_kwargs(call: tuple[tuple, dict], cache: DynamicCache) -> dict[str, Any]:
    kwargs = {k: v for k, v in call[1].items() if k != "hidden_states"}
    kwargs["past_key_values"] = cache
    return kwargs


def _hidden(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _score(value: torch.Tensor) -> float:
    """Mean over noise draws, clamped at zero only now (a float64 KL average can round to -1e-17)."""
    return max(0.0, float(value.mean()))


def _arithmetic(
    model: PreTrainedModel, clean: CleanPass, precision: str, keep_copies: bool
) -> tuple[Float32Layers | list[nn.Module], Callable[[torch.Tensor], torch.Tensor], CleanPass]:
    """The layers, the head and the clean pass the continuation passes of ``precision`` run with."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    layers = list(decoder_of(model).layers)
    if precision == "model":
        return layers, ModelHead(model), clean
    head = Float32Head(model)
    if precision == "float32-head":
        return layers, head, clean
    copies = Float32Layers(layers, max_bytes=MAX_LAYER_COPY_BYTES if keep_copies else 0)
    return copies, head, CleanPass([(k.float(), v.float()) for k, v in clean.clean], clean.calls, clean.new_tokens)


def layer_by_layer(
    model: PreTrainedModel, clean: CleanPass, noise: NoiseSpec, precision: str = "float32"
) -> tuple[list[float], list[float]]:
    """Per-layer KL and local (relative attention-output change) scores, any attention implementation.

    Per layer ``l``, one batch run from ``l`` up: row 0 the clean reference, rows ``1..repeats`` the noise draws.
    """
    layers, head, clean = _arithmetic(model, clean, precision, keep_copies=True)
    batch = 1 + noise.repeats
    buffers = ContinuationBuffers(clean.clean, room=clean.new_tokens, batch=batch)
    kl_scores, local_scores = [], []
    for index in range(len(layers)):
        cache = buffers.perturbed_cache(index, noise.alpha, noise.generator(index), clean_rows=1)
        hidden = clean.layer_input(index).expand(batch, -1, -1)
        attention: list[torch.Tensor] = []
        with _record_attention_output(layers[index], attention):
            for j in range(index, len(layers)):
                hidden = _hidden(layers[j](hidden, **_layer_kwargs(clean.calls[j], cache)))
        logits = head(hidden)
        kl_scores.append(_score(kl_divergence(logits[:1], logits[1:])))
        local_scores.append(_score(relative_change(attention[0][:1], attention[0][1:])))
    return kl_scores, local_scores


def batched_by_depth(
    model: PreTrainedModel, clean: CleanPass, noise: NoiseSpec, precision: str = "float32"
) -> tuple[list[float], list[float]]:
    """:func:`layer_by_layer`'s scores in one pass, the batch grown by depth over shared clean prefixes.

    At layer j the batch holds the reference (row 0) and one block of ``repeats`` rows per layer l <= j; block j
    enters as a copy of row 0 and adds its noise to the prefix values, read once for the whole batch. Only when
    :func:`can_share_prefix` (FlashAttention would ignore ``shared_prefix``).
    """
    layers, head, clean = _arithmetic(model, clean, precision, keep_copies=False)  # each layer runs once
    repeats = noise.repeats
    cache = cache_from_layers([PassThroughLayer(clean.clean[0][0].shape[-2]) for _ in range(len(layers))])
    hidden = clean.layer_input(0)  # row 0: the reference
    local_scores = []
    for j in range(len(layers)):
        layer = layers[j]
        hidden = torch.cat([hidden, hidden[:1].expand(repeats, -1, -1)])
        keys, values = clean.clean[j]
        delta = norm_adaptive_noise(values.expand(repeats, -1, -1, -1), noise.alpha, noise.generator(j))
        layer_kwargs = _layer_kwargs(clean.calls[j], cache)
        layer_kwargs["shared_prefix"] = SharedPrefix(keys, values, value_delta=delta)
        attention: list[torch.Tensor] = []
        with _record_attention_output(layer, attention):
            hidden = _hidden(layer(hidden, **layer_kwargs))
        local_scores.append(_score(relative_change(attention[0][:1], attention[0][-repeats:])))

    # hidden: (1 + layers * repeats, new, hidden_size): row 0 the reference, then block l
    reference = ReferenceDistribution(head(hidden[:1]))
    kl_scores = []
    for block in range(len(layers)):
        rows = hidden[1 + block * repeats : 1 + (block + 1) * repeats]
        kl_scores.append(_score(reference.kl(head(rows))))
    return kl_scores, local_scores
