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

Both run in float32 whatever the model's dtype: the decoder layers of the continuation passes
(:class:`Float32Layers`, float32 copies of a bfloat16 or float16 model's layers over the prefilled cache cast to
float32) and the final norm and output projection (:class:`Float32Head`). Rows whose inputs differ (the perturbed
rows and their reference) round differently, and in bfloat16 that rounding is a KL floor above the least
sensitive layers' scores: a logit of magnitude 16 is a multiple of 0.06 (~1e-4 nats of KL), and every layer's
hidden states are rounded to 8 bits of mantissa on the way. Only the prefill (the clean cache and the recorded
inputs of each layer) keeps the model's dtype: it is the operating point being measured, the same for every row.
``benchmarks/profile_bf16.py`` measures what each part contributes.
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
from ripplekv.models.layer_types import sliding_layers
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


PRECISIONS = ("float32", "float32-head", "model")
"""Arithmetic of the continuation passes: ``float32`` (layers and head, the default), ``float32-head`` (the final
norm and output projection only) or ``model`` (the model's dtype throughout: the arithmetic before float32 passes,
kept to measure what they change)."""

MAX_HEAD_BYTES = 256 * 2**20
"""Largest float32 copy of the output projection :class:`Float32Head` keeps; a larger one is cast in vocabulary
chunks of at most this size on every call (a 128K-token vocabulary of width 4,096 is 2 GiB in float32)."""


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


class ModelHead:
    """The model's final norm and output projection as the model computes them (its dtype, soft-capping too).

    Args:
        model: a causal LM with ``get_decoder().norm`` and ``get_output_embeddings()``.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.norm, self.head = decoder_of(model).norm, model.get_output_embeddings()
        cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
        self.softcap = None if cap is None else float(cap)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of decoder output ``hidden``, in the model's dtype."""
        logits = self.head(self.norm(hidden))
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


class Float32Head:
    """The model's final norm and output projection, computed in float32 (logits for the profiling KL).

    The norm runs on the hidden states cast to float32 (transformers' RMS norms compute in float32 and return the
    input's dtype, so their output stays float32, the norm weight promoted); the projection is ``F.linear`` of
    the float32 weight (and bias, if any), then the final logit soft-capping the config declares
    (``final_logit_softcapping``: Gemma 2; ``tanh(z / c) * c``), as the model's own forward applies it. The float32
    weight is cast once when it takes at most :data:`MAX_HEAD_BYTES`, else in vocabulary chunks on each call.

    Args:
        model: a causal LM with ``get_decoder().norm`` and a linear ``get_output_embeddings()``.

    Raises:
        ValueError: if the output embeddings are not a linear layer.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.norm = decoder_of(model).norm
        head = model.get_output_embeddings()
        if not isinstance(head, nn.Linear):
            raise ValueError(f"{type(model).__name__}'s output embeddings are not a linear layer")
        self._weight = head.weight
        self._bias = None if head.bias is None else head.bias.detach().float()
        cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
        self.softcap = None if cap is None else float(cap)
        rows = head.weight.shape[0]
        row_bytes = head.weight.shape[1] * 4
        self.chunk = max(1, MAX_HEAD_BYTES // row_bytes)
        self._float_weight = head.weight.detach().float() if rows <= self.chunk else None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``(..., vocab)`` of decoder output ``hidden`` ``(..., hidden_size)``, any dtype."""
        normed = self.norm(hidden.float()).float()
        if self._float_weight is not None:
            logits = F.linear(normed, self._float_weight, self._bias)
        else:
            parts = []
            for start in range(0, self._weight.shape[0], self.chunk):
                bias = None if self._bias is None else self._bias[start : start + self.chunk]
                parts.append(F.linear(normed, self._weight[start : start + self.chunk].detach().float(), bias))
            logits = torch.cat(parts, dim=-1)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


MAX_LAYER_COPY_BYTES = 2 * 2**30
"""Most bytes of float32 layer copies :class:`Float32Layers` keeps for reuse (beyond it, layers are copied anew)."""

_LOW_PRECISION = (torch.bfloat16, torch.float16)


class Float32Layers:
    """The decoder layers the continuation passes run, in float32.

    A float32 (or float64) model's own layers are used as they are. Those of a bfloat16 or float16 model are
    copied and cast to float32 on first use (``copy.deepcopy(layer).float()``: the model is never modified) and
    kept for reuse while the copies take at most ``max_bytes``; beyond it a layer is copied again on each use.

    Args:
        layers: the model's decoder layers.
        max_bytes: the most bytes of copies kept.
    """

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


def float32_clean_pass(clean: CleanPass) -> CleanPass:
    """``clean`` with its prefilled keys and values in float32 (the same tensors if they already are)."""
    pairs = [(k.float(), v.float()) for k, v in clean.clean]
    return CleanPass(pairs, clean.calls, clean.new_tokens)


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
    """Whether :func:`batched_by_depth` applies: RippleKV attention, and every layer sees every key.

    The shared-prefix attention shows every row the whole prefix, which a sliding-window layer of window ``W``
    sees exactly while the sequence fits the window (its last position ``length - 1`` sees the ``W`` positions
    up to it). A model with sliding-window layers and a longer sequence takes :func:`layer_by_layer`, whose
    layers attend through the masks of the clean pass.

    The shared-prefix rows are read by ripplekv's own attention functions only (``ripplekv_sdpa`` /
    ``ripplekv_eager``, :func:`ripplekv.models.attention.uses_varlen_attention`). Under any other implementation,
    FlashAttention included (kept as the user loaded it), this is False and profiling takes the exact generic path,
    :func:`layer_by_layer`, which gives the same scores up to float rounding.

    Args:
        model: the profiled model.
        length: context plus continuation tokens.
    """
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
    _check_precision(precision)
    layers = list(decoder_of(model).layers)
    if precision == "model":
        return layers, ModelHead(model), clean
    head = Float32Head(model)
    if precision == "float32-head":
        return layers, head, clean
    copies = Float32Layers(layers, max_bytes=MAX_LAYER_COPY_BYTES if keep_copies else 0)
    return copies, head, float32_clean_pass(clean)


def _input(hidden: torch.Tensor, clean: CleanPass) -> torch.Tensor:
    """A recorded layer input in the dtype of the clean pass's cache (float32 for float32 passes)."""
    return hidden.to(clean.clean[0][1].dtype)


def layer_by_layer(
    model: PreTrainedModel, clean: CleanPass, noise: NoiseSpec, precision: str = "float32"
) -> tuple[list[float], list[float]]:
    """Generic path, any attention implementation: per layer l, one batch from layer l up.

    Row 0 of the batch keeps the clean Values (the reference), rows ``1..repeats`` carry the noise draws.

    Args:
        model: the profiled model.
        clean: the clean continuation pass.
        noise: noise of the perturbed rows.
        precision: one of :data:`PRECISIONS`.

    Returns:
        Per-layer KL scores and local (relative attention-output change) scores.
    """
    layers, head, clean = _arithmetic(model, clean, precision, keep_copies=True)
    batch = 1 + noise.repeats
    buffers = ContinuationBuffers(clean.clean, room=clean.new_tokens, batch=batch)
    kl_scores, local_scores = [], []
    for index in range(len(layers)):
        cache = buffers.perturbed_cache(index, noise.alpha, noise.generator(index), clean_rows=1)
        hidden = _input(clean.layer_input(index), clean).expand(batch, -1, -1)
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
        precision: one of :data:`PRECISIONS`.

    Returns:
        Per-layer KL scores and local (relative attention-output change) scores.
    """
    layers, head, clean = _arithmetic(model, clean, precision, keep_copies=False)  # each layer runs once
    repeats = noise.repeats
    cache = cache_from_layers([PassThroughLayer(clean.clean[0][0].shape[-2]) for _ in range(len(layers))])
    hidden = _input(clean.layer_input(0), clean)  # row 0: the reference
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
