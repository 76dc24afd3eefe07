"""Attention-module state that a press leaves behind, carried with the cache it belongs to.

Some kvpress presses act on later passes through attributes of the attention modules rather than through the
cache alone: AdaKV (``AdaKVPress``, Feng et al. 2024, https://arxiv.org/abs/2407.11550) keeps every key and sets
``module.masked_key_indices``, which kvpress's attention wrapper (``kvpress.attention_patch``) reads on every
later pass to replace the masked keys by a fake key whose attention weight underflows to zero.

Such state belongs to one compressed cache, not to the model: two caches compressed with different presses
(or budgets) must not see each other's masks. RippleKV therefore *captures* the attributes a press set
(:func:`capture_state`, restoring the modules right away), stores them with the cache in
:class:`ripplekv.inference.Prefill`, and *applies* them only for the duration of a pass over that cache
(:func:`applied_state`, restoring the previous values afterwards, also on an exception, re-entrantly).

Only instance attributes (``vars(module)``) are captured, compared by identity, which is how kvpress presses
store such state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers import PreTrainedModel

from ripplekv.models.attention import attends_per_layer_natively
from ripplekv.models.attention_masks import fit_attention_mask

__all__ = [
    "ABSENT",
    "MASKED_KEYS",
    "ModuleState",
    "applied_state",
    "attention_modules",
    "capture_state",
    "changed_attributes",
    "headwise_attention_mask",
]

# kvpress's head-wise key masks (AdaKV): (batch, kv_head, position) index tensors set by ``compress``.
MASKED_KEYS = "masked_key_indices"


class _Absent:
    """Marks an attribute the press deleted (absent during passes over the cache)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


@dataclass(frozen=True)
class ModuleState:
    """Instance attributes of one layer's attention module that passes over a cache must see.

    Args:
        layer: index of the layer (the cache layer the attributes belong to).
        module: the attention module the attributes are set on.
        attributes: attribute name -> value (:data:`ABSENT`: the attribute is removed during the pass).
    """

    layer: int
    module: nn.Module
    attributes: Mapping[str, Any]

    def __post_init__(self) -> None:
        if not isinstance(self.module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(self.module).__name__}")
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 0:
            raise ValueError(f"layer must be a non-negative int, got {self.layer!r}")
        if not all(isinstance(name, str) for name in self.attributes):
            raise TypeError("attribute names must be strings")
        object.__setattr__(self, "attributes", MappingProxyType(dict(self.attributes)))


def attention_modules(model: PreTrainedModel) -> list[nn.Module]:
    """The attention module of every decoder layer, in layer order (the modules kvpress hooks).

    Args:
        model: a decoder-only transformers model (``model.model.layers[i].self_attn``, or under
            ``model.model.language_model`` for multimodal wrappers).
    """
    inner = getattr(model, "model", None)
    layers = getattr(getattr(inner, "language_model", inner), "layers", None)
    if layers is None or not all(hasattr(layer, "self_attn") for layer in layers):
        raise TypeError(
            f"cannot find the attention modules of {type(model).__name__} (expected model.model.layers[i].self_attn)"
        )
    return [layer.self_attn for layer in layers]


def changed_attributes(module: nn.Module, before: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes of ``module`` that differ (by identity) from the snapshot ``before`` = ``dict(vars(module))``.

    Args:
        module: the module now.
        before: its instance attributes at the snapshot.

    Returns:
        name -> current value, :data:`ABSENT` for attributes deleted since the snapshot.
    """
    current = vars(module)
    changed = {}
    for name in sorted(current.keys() | before.keys()):
        now = current.get(name, ABSENT)
        if now is not before.get(name, ABSENT):
            changed[name] = now
    return changed


def restore_attributes(module: nn.Module, before: Mapping[str, Any]) -> dict[str, Any]:
    """Put ``module``'s instance attributes back as in the snapshot ``before``; returns what had changed.

    Args:
        module: the module to restore.
        before: ``dict(vars(module))`` taken earlier.
    """
    changed = changed_attributes(module, before)
    current = vars(module)
    for name in changed:
        if name in before:
            current[name] = before[name]
        else:
            del current[name]
    return changed


@contextmanager
def capture_state(modules: Sequence[nn.Module], into: list[ModuleState]) -> Iterator[None]:
    """Record the attributes the body sets on ``modules`` into ``into`` and restore the modules on exit.

    Args:
        modules: the attention modules, in layer order (``modules[i]`` is layer ``i``).
        into: a list that receives one :class:`ModuleState` per module whose attributes changed (filled on a
            normal exit; the modules are restored in every case).
    """
    snapshots = [dict(vars(module)) for module in modules]
    try:
        yield
    except BaseException:
        for module, before in zip(modules, snapshots):
            restore_attributes(module, before)
        raise
    for layer, (module, before) in enumerate(zip(modules, snapshots)):
        changed = restore_attributes(module, before)
        if changed:
            into.append(ModuleState(layer, module, changed))


def _check_masked(masked: tuple[torch.Tensor, ...], kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Validate kvpress's ``masked_key_indices``; returns ``(head, position, last masked position)``.

    Reads the indices' maxima on the host (one synchronisation): done once per application of a cache's state
    (:func:`applied_state`), not on every pass.
    """
    if len(masked) != 3:
        raise ValueError(f"masked_key_indices must be (batch, head, position) index tensors, got {len(masked)}")
    batch, head, position = masked
    if batch.numel() and int(batch.max()) > 0:
        raise ValueError("head-wise masked keys are supported for batch size 1 only")
    if head.numel() and int(head.max()) >= kv_heads:
        raise ValueError("masked_key_indices point outside the cached keys of the layer")
    last = int(position.max()) if position.numel() else -1
    return head, position, last


def _headwise_mask(
    base: torch.Tensor | None,
    head: torch.Tensor,
    position: torch.Tensor,
    heads: int,
    kv_heads: int,
    query_len: int,
    key_len: int,
    device: torch.device,
) -> torch.Tensor:
    """:func:`headwise_attention_mask` on validated indices, on ``device``, without a host synchronisation."""
    allowed = fit_attention_mask(base, query_len, key_len, device=device)
    if allowed is None:
        rows = torch.arange(query_len, device=device).unsqueeze(1)
        allowed = torch.arange(key_len, device=device).unsqueeze(0) <= rows + (key_len - query_len)
        allowed = allowed.view(1, 1, query_len, key_len)
    keep = torch.ones(kv_heads, key_len, dtype=torch.bool, device=device)
    keep[head.to(device), position.to(device)] = False
    keep = keep.repeat_interleave(heads // kv_heads, dim=0)
    return allowed.to(device) & keep.view(1, heads, 1, key_len)


def headwise_attention_mask(
    base: torch.Tensor | None,
    masked: tuple[torch.Tensor, ...],
    heads: int,
    kv_heads: int,
    query_len: int,
    key_len: int,
) -> torch.Tensor:
    """The boolean attention mask of one layer with kvpress's head-wise masked keys excluded exactly.

    Args:
        base: the mask the layer received (boolean, True = attend; ``None`` when transformers built none).
        masked: kvpress's ``masked_key_indices``: ``(batch, kv_head, position)`` index tensors (batch size 1).
        heads: query heads of the layer.
        kv_heads: key/value heads of the layer.
        query_len: new tokens of the pass (the last ``query_len`` keys).
        key_len: keys of the layer in the pass (cached plus new).

    Returns:
        ``(1, heads, query_len, key_len)`` on the device of ``base`` (else of the indices): ``base`` fitted to the
        layer (bottom-right causal when ``None``), with every query head of a KV head barred from that KV head's
        masked positions.
    """
    if base is not None and base.dtype != torch.bool:
        raise ValueError("head-wise masked keys (AdaKV) need a boolean attention mask: use sdpa, not eager attention")
    head, position, last = _check_masked(masked, kv_heads)
    if last >= key_len - query_len:
        raise ValueError("masked_key_indices point outside the cached keys of the layer")
    device = head.device if base is None else base.device
    return _headwise_mask(base, head, position, heads, kv_heads, query_len, key_len, device)


def _headwise_mask_hook(module: nn.Module, masked: tuple[torch.Tensor, ...]) -> Callable:
    """A forward pre-hook of an attention module that replaces its attention mask by the head-wise one.

    The indices are validated and moved to the module's device once, here; each pass then builds its mask on the
    device of its hidden states from Python-side lengths (the cache layer's length), without a host
    synchronisation.
    """
    config = module.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head, position, last = _check_masked(masked, kv_heads)
    weight = next(module.parameters(), None)
    if weight is not None:
        head, position = head.to(weight.device), position.to(weight.device)

    def hook(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        cache = kwargs.get("past_key_values")
        if cache is None or module.layer_idx >= len(cache.layers):
            raise ValueError("a pass over a cache with head-wise masked keys needs that cache (past_key_values)")
        if cache.layers[module.layer_idx].is_sliding:
            raise ValueError("head-wise masked keys are not supported on sliding-window layers")
        query_len = hidden.shape[1]
        cached = cache.layers[module.layer_idx].get_seq_length()
        if last >= cached:
            raise ValueError("masked_key_indices point outside the cached keys of the layer")
        base = kwargs.get("attention_mask")
        if base is not None and base.dtype != torch.bool:
            raise ValueError(
                "head-wise masked keys (AdaKV) need a boolean attention mask: use sdpa, not eager attention"
            )
        kwargs["attention_mask"] = _headwise_mask(
            base, head, position, heads, kv_heads, query_len, cached + query_len, hidden.device
        )
        return args, kwargs

    return hook


class _Application:
    """One application of a cache's attention state: what it set and how to undo it."""

    def __init__(self, states: Sequence[ModuleState], exact_headwise: bool) -> None:
        self.states = states
        self.exact_headwise = exact_headwise
        self.saved: list[tuple[dict[str, Any], str, Any]] = []
        self.handles: list[RemovableHandle] = []

    def apply(self) -> None:
        for state in self.states:
            current = vars(state.module)
            for name, value in state.attributes.items():
                self.saved.append((current, name, current.get(name, ABSENT)))
                if name == MASKED_KEYS and value is not None and value is not ABSENT and self.exact_headwise:
                    current[name] = None  # kvpress's fake-key wrapper stays inert: the hook masks exactly
                    hook = _headwise_mask_hook(state.module, value)
                    self.handles.append(state.module.register_forward_pre_hook(hook, with_kwargs=True))
                elif value is ABSENT:
                    current.pop(name, None)
                else:
                    current[name] = value

    def undo(self) -> None:
        for handle in reversed(self.handles):
            handle.remove()
        for current, name, old in reversed(self.saved):
            if old is ABSENT:
                current.pop(name, None)
            else:
                current[name] = old
        self.handles.clear()
        self.saved.clear()


# Applications in progress, innermost last. Only the innermost is on the modules: entering a nested pass over
# another cache suspends the enclosing one, so a pass sees exactly its own cache's state.
_ACTIVE: list[_Application] = []


@contextmanager
def applied_state(model: PreTrainedModel, states: Sequence[ModuleState]) -> Iterator[None]:
    """Apply ``states`` to their modules for the body of the ``with``, then put back what was there before.

    Attributes are set as captured, except kvpress's head-wise key masks (``masked_key_indices``, AdaKV): kvpress
    realises them with a fake key that must have a negative dot product with every query of the pass, found by an
    iterative search that fails on multi-token passes (``ValueError: Could not find fake keys``), so a
    teacher-forced pass over an AdaKV cache could not run. Here the masked (head, position) entries are removed
    exactly instead, through a per-head boolean attention mask set by a forward pre-hook on the module
    (:func:`headwise_attention_mask`), and ``masked_key_indices`` is ``None`` during the pass so kvpress's wrapper
    stays inert. Both give the same attention up to float rounding (tested against kvpress's own decoding).

    Under FlashAttention (:func:`ripplekv.models.attention.attends_per_layer_natively`), which takes no dense mask,
    ``masked_key_indices`` is applied as captured instead, so kvpress's wrapper of the FlashAttention function
    realises it with its fake keys, as kvpress does under it: exact on single-token decoding; a multi-token pass
    over such a cache (teacher forcing, a question after the context) may raise kvpress's ``ValueError`` when no
    fake key exists, and needs ``attn_implementation='sdpa'``.

    Re-entrant: a nested use (a pass over another cache inside this one) suspends the enclosing state for its
    duration, so the inner pass sees its own state only (none, for a cache without any); exception-safe. Not
    thread-safe (neither is running one model from several threads).

    Args:
        model: the model the pass runs on; every state's module must be one of its attention modules.
        states: the attributes to apply (a :class:`~ripplekv.inference.Prefill`'s ``attention_state``).
    """
    if states:
        own = {id(module) for module in attention_modules(model)}
        foreign = [state.layer for state in states if id(state.module) not in own]
        if foreign:
            raise ValueError(f"the attention state of layer(s) {foreign} belongs to another model's modules")
    application = _Application(states, exact_headwise=not attends_per_layer_natively(model))
    enclosing = _ACTIVE[-1] if _ACTIVE else None
    if enclosing is not None:
        enclosing.undo()
    _ACTIVE.append(application)
    try:
        application.apply()
        yield
    finally:
        application.undo()
        _ACTIVE.pop()
        if enclosing is not None:
            enclosing.apply()
