"""Shared prefill: one full prefill of a prompt feeds every (method, budget) compressed cache.

kvpress compresses a layer's cache in a forward hook that runs *after* the layer's attention, so compression
never changes the prefill's hidden states, logits or the full keys and values each layer hands to its press.
:func:`record_prefill` runs the prompt once with a :class:`RecordingPress`, which stores, per layer, exactly
what ``compress`` receives (the attention module, its input hidden states, the full keys and values, the
attention weights if the attention implementation returned any, and the forward kwargs) and keeps the cache
unchanged. :func:`derived_prefill` (or :func:`derive_cache`) then applies any derivable press to that record layer
by layer and builds the compressed cache from the results: the same tensors a direct ``prefill(model, ids, press)``
produces (tested tensor for tensor), at the cost of the press's ``compress`` alone.

Which presses are derivable (:func:`is_derivable`, checked again on every call):

1. the press keeps :class:`BasePress`'s ``forward_hook`` and ``__call__``: its whole effect on a prefill is
   to replace each layer's keys and values by what ``compress`` returns, plus any attributes ``compress`` sets on
   the attention module (presses that override the hook or the context manager, e.g. decoding-time or composed
   presses, are not derivable); a press class may also declare ``derivable_from_record = False`` to opt out;
2. ``compress`` leaves the recorded tensors as they were (a press writing into them in place invalidates the
   record and raises :class:`NotDerivableError`);
3. ``compress`` only reads kwargs the record holds (everything the attention layer received except the live
   cache ``past_key_values`` and ``hidden_states``, which is recorded as its own field); reading another one
   raises :class:`NotDerivableError`.

Presses that act through attention-module state are derivable too. AdaKV keeps every key and sets
``module.masked_key_indices``, which kvpress's attention wrapper reads on every later pass. Around each layer's
``compress`` the module's instance attributes are snapshotted; what ``compress`` changed is captured as a
:class:`~ripplekv.inference.module_state.ModuleState` of that layer and the module is restored at once. The
captured state travels with the derived cache as ``Prefill.attention_state``, and ``extend``, ``greedy_decode``
and ``teacher_forced_logprobs`` set it on the modules for the duration of each pass over that cache and put back
what was there afterwards (also on an exception). Configurations derived from one record therefore never see
each other's masks, and the modules are left as they were. :func:`compress_recorded` returns a bare cache and so
refuses such presses; use :func:`derived_prefill`.

FullPress, StreamingLLM, SnapKV, PyramidKV (kvpress's and the authors' schedule), AdaKV and RippleKV (any scorer)
are derivable.

Memory: a record holds one full (uncompressed) KV cache plus each layer's input hidden states, i.e. about
``n_tokens * n_layers * (2 * kv_heads * head_dim + hidden_size)`` elements (attention weights too when the
attention implementation returns them, as ``eager`` does: use ``sdpa``). Every compressed cache derived from it
holds new tensors (``gather``) or, for layers a press leaves whole, the record's own tensors by reference;
decoding appends through ``torch.cat`` and never writes into the record.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from kvpress.presses.base_press import BasePress
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from ripplekv.inference.generate import Prefill, prefill
from ripplekv.inference.module_state import ModuleState, capture_state
from ripplekv.models.cache import cache_from_tensors
from ripplekv.presses.registry import check_prompt_length

__all__ = [
    "LayerRecord",
    "NotDerivableError",
    "PrefillRecord",
    "RecordingPress",
    "compress_recorded",
    "derive_cache",
    "derived_prefill",
    "is_derivable",
    "record_prefill",
]

# Forward kwargs of the attention layer that are not recorded: the live cache (a derived cache is being built
# instead) and the hidden states (recorded as their own field).
_NOT_RECORDED = frozenset({"hidden_states", "past_key_values", "past_key_value"})


class NotDerivableError(ValueError):
    """A press whose compressed cache cannot be derived from a prefill record (prefill with it directly)."""


class _RecordedKwargs(dict):
    """The recorded forward kwargs; reading one that was not recorded raises :class:`NotDerivableError`."""

    def __missing__(self, key: str) -> Any:
        raise NotDerivableError(f"compress reads kwargs[{key!r}], which a prefill record does not hold")


@dataclass(frozen=True)
class LayerRecord:
    """What one layer's ``compress`` received during the recorded prefill (all tensors by reference)."""

    module: nn.Module
    hidden_states: torch.Tensor  # (batch, tokens, hidden): the attention layer's input
    keys: torch.Tensor  # (batch, kv_heads, tokens, head_dim): the full cache of the layer
    values: torch.Tensor
    attentions: torch.Tensor | None  # attention weights when the implementation returns them (eager), else None
    kwargs: Mapping[str, Any]  # forward kwargs (position_embeddings, attention_mask, cache_position, ...)


@dataclass
class PrefillRecord:
    """One full prefill of a prompt, enough to derive the cache any derivable press would have produced."""

    model: PreTrainedModel
    layers: tuple[LayerRecord, ...]
    next_logits: torch.Tensor  # (vocab,) logits of the token after the prompt (compression does not change them)
    prompt_tokens: int
    seconds: float  # wall time of the recorded prefill
    invalid: str | None = field(default=None, compare=False)  # set when a press wrote into the recorded tensors

    def full_cache(self) -> DynamicCache:
        """The uncompressed cache (references to the recorded tensors)."""
        return cache_from_tensors([(layer.keys, layer.values) for layer in self.layers])

    def nbytes(self) -> int:
        """Bytes held by the record's tensors (each distinct storage counted once)."""
        seen: dict[int, int] = {}

        def add(value: Any) -> None:
            if isinstance(value, torch.Tensor):
                seen[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
            elif isinstance(value, (tuple, list)):
                for item in value:
                    add(item)

        for layer in self.layers:
            add((layer.hidden_states, layer.keys, layer.values, layer.attentions, *layer.kwargs.values()))
        return sum(seen.values())


@dataclass
class RecordingPress(BasePress):
    """A press that compresses nothing and records, per layer, what ``compress`` receives."""

    layers: dict[int, LayerRecord] = field(default_factory=dict)

    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        recorded = {key: value for key, value in kwargs.items() if key not in _NOT_RECORDED}
        self.layers[module.layer_idx] = LayerRecord(module, hidden_states, keys, values, attentions, recorded)
        return keys, values


def record_prefill(model: PreTrainedModel, input_ids: torch.Tensor) -> PrefillRecord:
    """Prefill ``input_ids`` (shape ``(1, n)``) once, recording every layer's compression inputs."""
    press = RecordingPress()
    state = prefill(model, input_ids, press)
    n_layers = model.config.get_text_config().num_hidden_layers
    missing = [i for i in range(n_layers) if i not in press.layers]
    if missing:
        raise ValueError(f"the prefill recorded no attention output for layer(s) {missing}: unsupported model")
    layers = tuple(press.layers[i] for i in range(n_layers))
    return PrefillRecord(model, layers, state.next_logits, state.prompt_tokens, state.seconds)


def is_derivable(press: BasePress) -> bool:
    """Static part of the rule (see the module docstring): default hook and context manager, no opt-out.

    :func:`compress_recorded` also checks, on every call, that ``compress`` writes no module state and no
    recorded tensor and reads only recorded kwargs.
    """
    if not getattr(press, "derivable_from_record", True):
        return False
    cls = type(press)
    return cls.forward_hook is BasePress.forward_hook and cls.__call__ is BasePress.__call__


def _tensor_versions(layer: LayerRecord) -> list[int]:
    tensors = [layer.hidden_states, layer.keys, layer.values]
    if layer.attentions is not None:
        tensors.append(layer.attentions)
    return [t._version for t in tensors]


@torch.no_grad()
def derive_cache(record: PrefillRecord, press: BasePress) -> tuple[DynamicCache, tuple[ModuleState, ...]]:
    """The cache ``prefill(model, ids, press)`` would have built, and the attention-module state it set.

    Calls ``press.post_init_from_model(model)`` first (RippleKV checks its profile there), then
    ``press.compress`` layer by layer on the recorded inputs. Attributes ``compress`` sets on a layer's attention
    module (AdaKV's ``masked_key_indices``) are captured into the returned state and the module is restored at
    once, so no configuration sees another's state. Raises :class:`NotDerivableError` for a press that cannot be
    derived (see the module docstring).

    Args:
        record: the recorded full prefill.
        press: the press to derive a cache for.
    """
    if record.invalid is not None:
        raise NotDerivableError(f"the prefill record is no longer valid: {record.invalid}")
    if not is_derivable(press):
        raise NotDerivableError(
            f"{type(press).__name__} overrides the kvpress forward hook or context manager (or opts out): "
            "its cache cannot be derived from a prefill record"
        )
    check_prompt_length(press, record.prompt_tokens)
    press.post_init_from_model(record.model)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    states: list[ModuleState] = []
    for index, layer in enumerate(record.layers):
        versions = _tensor_versions(layer)
        kwargs = _RecordedKwargs(layer.kwargs)
        captured: list[ModuleState] = []
        with capture_state([layer.module], captured):
            keys, values = press.compress(
                layer.module, layer.hidden_states, layer.keys, layer.values, layer.attentions, kwargs
            )
        if _tensor_versions(layer) != versions:
            record.invalid = f"{type(press).__name__}.compress wrote into the recorded tensors in place"
            raise NotDerivableError(record.invalid)
        states.extend(ModuleState(index, state.module, state.attributes) for state in captured)
        pairs.append((keys, values))
    return cache_from_tensors(pairs), tuple(states)


def compress_recorded(record: PrefillRecord, press: BasePress) -> DynamicCache:
    """The cache ``prefill(model, ids, press)`` would have built, for presses that act through the cache alone.

    A bare cache cannot carry attention-module state: for a press whose ``compress`` sets some (AdaKV) this
    raises :class:`NotDerivableError` (the modules are left as they were); use :func:`derived_prefill`, which
    carries that state with the cache.

    Args:
        record: the recorded full prefill.
        press: the press to derive a cache for.
    """
    cache, states = derive_cache(record, press)
    if states:
        names = sorted({name for state in states for name in state.attributes})
        raise NotDerivableError(
            f"{type(press).__name__}.compress sets {', '.join(names)} on the attention modules (state read by later "
            "passes, as AdaKV's masked keys): a bare cache cannot carry it, use derived_prefill"
        )
    return cache


def derived_prefill(record: PrefillRecord, press: BasePress) -> tuple[Prefill, float]:
    """A :class:`Prefill` over the cache derived for ``press``, and the seconds the derivation took.

    Works for every press of :func:`ripplekv.presses.make_press`, AdaKV included: the attention-module state
    ``compress`` set is the result's ``attention_state``, applied during every later pass over it. Its ``seconds``
    is the recorded prefill's time plus the derivation's, what a direct prefill would report.

    Args:
        record: the recorded full prefill.
        press: the press to derive a cache for.
    """
    start = time.perf_counter()
    cache, states = derive_cache(record, press)
    seconds = time.perf_counter() - start
    prefill_state = Prefill(cache, record.next_logits, record.prompt_tokens, record.seconds + seconds, states)
    return prefill_state, seconds
