"""PerPromptBudgetPress: budgets decided per prompt from every layer's statistics (CAKE, SqueezeAttention, ...).

A layer's compression only changes what later passes attend to, never the prefill's own hidden states, so the press
keeps each compressed layer's cache whole while collecting its statistic and token scores, and after the last
compressed layer prunes every layer to its budget: the same caches as compressing each layer as soon as its budget
is known. Sliding-window layers are left whole. The scorer's scores must not depend on its compression ratio
(StreamingLLM's do, and is refused).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from kvpress import ScorerPress, SnapKVPress, StreamingLLMPress
from kvpress.presses.base_press import BasePress
from kvpress.utils import extract_keys_and_values
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from ripplekv.allocation.budget import TokenBudgetError
from ripplekv.allocation.per_prompt import PerPromptSchedule
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.cache import dynamic_layer
from ripplekv.models.decoder import decoder_layers
from ripplekv.models.layer_types import compressed_layers
from ripplekv.presses.scorers import check_attention_weights
from ripplekv.presses.selection_window import check_compressible, resolve_floor, scorer_window
from ripplekv.validation import is_integer

__all__ = ["DEFAULT_STATISTIC_WINDOW", "RESIDUAL_STATISTICS", "PerPromptBudgetPress", "select_top"]

RESIDUAL_STATISTICS = frozenset({"residual_in", "attention_output"})
"""Statistic inputs the attention hook of kvpress does not receive as compression inputs: the decoder layer's
input residual stream and the attention output. Rules reading them are computed while the prefill runs."""


DEFAULT_STATISTIC_WINDOW = 64
"""The statistics' observation window under a scorer without one (kvpress's SnapKV default)."""


def select_top(keys: torch.Tensor, values: torch.Tensor, scores: torch.Tensor, n_kept: int) -> tuple:
    """Keep the ``n_kept`` highest ``(batch, kv_heads, tokens)`` scores' positions of every KV head (as kvpress's
    ScorerPress does; all when ``n_kept >= tokens``)."""
    if n_kept >= keys.shape[2]:
        return keys, values
    indices = scores.topk(n_kept, dim=-1).indices.unsqueeze(-1)
    return (
        keys.gather(2, indices.expand(-1, -1, -1, keys.shape[-1])).contiguous(),
        values.gather(2, indices.expand(-1, -1, -1, values.shape[-1])).contiguous(),
    )


@dataclass
class _Pending:
    """What one prefill has collected so far: per compressed layer, its statistic and token scores."""

    stats: dict[int, Any] = field(default_factory=dict)
    scores: dict[int, torch.Tensor] = field(default_factory=dict)
    residual: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class PerPromptBudgetPress(BasePress):
    """Per-layer budgets decided per prompt by a per-prompt rule, tokens ranked by any kvpress scorer.

    Args:
        press: the token scorer (default ``SnapKVPress()``); its ``compression_ratio`` is ignored.
        schedule: the rule and the budget; its ``window_size`` (the window the budgets reserve) must equal what the
            scorer always keeps: its ``window_size``, 0 for a scorer without one.
        floor: smallest budget of a layer (``>= 1``); default the scorer's window, else 1.
        statistic_window: the queries of the rule's window statistics (``>= 1``); default the scorer's
            ``window_size``, else :data:`DEFAULT_STATISTIC_WINDOW`. Its keys are those before both windows.
    """

    press: ScorerPress = field(default_factory=SnapKVPress)
    schedule: PerPromptSchedule | None = None
    floor: int | None = None
    statistic_window: int | None = None
    _pending: dict[int, _Pending] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.press, ScorerPress):
            raise TypeError(f"{type(self).__name__} wraps a kvpress ScorerPress, got {type(self.press).__name__}")
        if isinstance(self.press, StreamingLLMPress):
            raise ValueError(
                "StreamingLLM's scores depend on its compression ratio, which a per-prompt schedule only knows "
                "after the last layer: use a scorer whose scores do not (snapkv, expected_attention, knorm, ...)"
            )
        if not isinstance(self.schedule, PerPromptSchedule):
            raise TypeError(f"schedule must be a PerPromptSchedule, got {type(self.schedule).__name__}")
        if self.schedule.window_size != self.window_size:
            raise ValueError(
                f"the schedule reserves a {self.schedule.window_size}-token window but the scorer "
                f"{type(self.press).__name__} always keeps {self.window_size}: give the schedule window_size="
                f"{self.window_size} (a scorer's window_size, 0 for a scorer without one)"
            )
        self.floor = resolve_floor(self.floor, self.window_size)
        if self.statistic_window is not None and (not is_integer(self.statistic_window) or self.statistic_window < 1):
            raise ValueError(f"statistic_window must be an integer >= 1, got {self.statistic_window!r}")
        self.statistic_window = int(self.statistic_window or self.window_size or DEFAULT_STATISTIC_WINDOW)

    @property
    def window_size(self) -> int:
        """The window the scorer always keeps in every layer (its ``window_size``; 0 for a scorer without one)."""
        return scorer_window(self.press)

    @property
    def budget(self) -> float | None:
        """The schedule's kept fraction, or None for a token budget (``tokens=``)."""
        fraction = self.schedule.budget  # type: ignore[union-attr]
        return None if fraction is None else float(fraction)

    @property
    def compression_ratio(self) -> float:
        """``1 - budget`` (kvpress convention); a token budget raises :class:`TokenBudgetError`."""
        if self.budget is None:
            tokens = self.schedule.tokens  # type: ignore[union-attr]
            raise TokenBudgetError(
                f"{type(self).__name__} keeps {tokens} tokens per layer on average: a token budget has no fixed "
                "compression ratio, it depends on the prompt length"
            )
        return 1.0 - self.budget

    @property
    def needs_residual(self) -> bool:
        """Whether the rule reads the residual stream (captured by :meth:`__call__`'s pre-hooks during the prefill)."""
        return bool(RESIDUAL_STATISTICS & set(self.schedule.rule.statistic_inputs))  # type: ignore[union-attr]

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        """Enable variable-length attention and let the scorer see the model."""
        self.schedule.check_layers(len(compressed_layers(model.config)))  # type: ignore[union-attr]
        check_attention_weights(self.press, model)
        enable_varlen_attention(model)
        self.press.post_init_from_model(model)

    def layer_statistic(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        kwargs: Mapping[str, Any],
        recorded: Mapping[str, Any] | None = None,
    ) -> Any:
        """The rule's statistic of one layer from its attention module's inputs, its full prefill cache and the
        inputs ``recorded`` while the prefill ran (``residual_in``, ``attention_output``)."""
        rule = self.schedule.rule  # type: ignore[union-attr]
        inputs: list[Any] = []
        for name in rule.statistic_inputs:
            if name == "window_attention":
                attention = SnapKVPress.compute_window_attention(
                    module, hidden_states, keys, self.statistic_window, kwargs["position_embeddings"]
                )
                # the keys the selection chooses among: before both the statistics' window and the kept one
                candidates = keys.shape[2] - max(self.statistic_window, self.window_size)  # type: ignore[type-var]
                inputs.append(attention[..., :candidates].float())
            elif name == "values":
                inputs.append(values)
            elif recorded is not None and name in recorded:
                inputs.append(recorded[name])
            else:
                raise ValueError(f"the {rule.name} statistic needs {name!r}, which this layer's inputs lack")
        return rule.layer_statistic(*inputs)

    def layer_scores(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor | None,
        kwargs: Mapping[str, Any],
    ) -> torch.Tensor:
        """The scorer's token scores of one layer, ``(batch, kv_heads, tokens)``."""
        return self.press.score(module, hidden_states, keys, values, attentions, dict(kwargs))

    def budgets(self, stats: Sequence[Any], config: PretrainedConfig, prompt_tokens: int) -> dict[int, int]:
        """Tokens kept by each compressed layer (a dict by layer index), from every compressed layer's statistic."""
        layers = compressed_layers(config)
        if len(stats) != len(layers):
            raise ValueError(f"{len(stats)} layer statistics for {len(layers)} compressed layers")
        budgets = self.schedule.layer_budgets(len(layers), prompt_tokens, self.floor, stats=stats)  # type: ignore[union-attr, arg-type]
        return dict(zip(layers, budgets))

    @contextmanager
    def __call__(self, model: PreTrainedModel) -> Iterator[None]:
        """kvpress's context manager, plus, for rules that read the residual stream, a pre-hook on each decoder
        layer that keeps its input for the statistic."""
        handles = []
        if self.needs_residual:
            for layer in decoder_layers(model):
                handles.append(layer.register_forward_pre_hook(self._residual_hook(layer), with_kwargs=True))
        try:
            with super().__call__(model):
                yield
        finally:
            for handle in handles:
                handle.remove()
            self._pending.clear()

    def _residual_hook(self, layer: nn.Module) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            cache = kwargs.get("past_key_values")
            if cache is not None:  # no cache (use_cache=False): nothing is compressed
                pending = self._pending.setdefault(id(cache), _Pending())
                pending.residual[layer.self_attn.layer_idx] = args[0] if args else kwargs["hidden_states"]

        return hook

    def forward_hook(self, module: nn.Module, input: list, kwargs: dict, output: list) -> list:
        """Collect this layer's statistic and scores; after the last compressed layer, prune every layer."""
        hidden_states = kwargs["hidden_states"]
        cache = kwargs["past_key_values"]
        cache_position = kwargs["cache_position"]
        if cache_position[-1] > hidden_states.shape[1]:  # decoding (kvpress's is_prefilling, without a sync)
            return output
        layers = compressed_layers(module.config)
        index = module.layer_idx
        if index not in layers:
            return output
        keys, values = extract_keys_and_values(cache, index)
        check_compressible(self, kwargs, keys.shape[2], self.statistic_window)  # type: ignore[arg-type]
        if self.needs_residual and index not in self._pending.get(id(cache), _Pending()).residual:
            raise RuntimeError(  # kvpress gives a wrapped press no hook before a decoder layer, nor an end of context
                f"{self.schedule.rule.name} reads each decoder layer's input residual stream, which "  # type: ignore[union-attr]
                f"{type(self).__name__} captures under its own context manager only (`with press(model):`); layer "
                f"{index}'s was not captured: a wrapper that calls its forward_hook (kvpress's ComposedPress, "
                "PrefillDecodingPress) cannot run it. Apply the press directly, or use a rule that reads the attention "
                "layer's inputs (cake, dynamickv, lava-layer)"
            )
        pending = self._pending.setdefault(id(cache), _Pending())
        recorded = {}
        if self.needs_residual:
            recorded = {"residual_in": pending.residual.pop(index), "attention_output": output[0]}
        pending.stats[index] = self.layer_statistic(module, hidden_states, keys, values, kwargs, recorded)
        pending.scores[index] = self.layer_scores(module, hidden_states, keys, values, output[1], kwargs)
        if index != layers[-1]:
            return output
        del self._pending[id(cache)]
        budgets = self.budgets([pending.stats[i] for i in layers], module.config, keys.shape[2])
        for layer in layers:
            layer_keys, layer_values = extract_keys_and_values(cache, layer)
            cache.layers[layer] = self.prune(
                layer_keys, layer_values, pending.scores[layer], budgets[layer], module.config
            )
        return output

    def prune(
        self, keys: torch.Tensor, values: torch.Tensor, scores: torch.Tensor, budget: int, config: PretrainedConfig
    ) -> DynamicLayer:
        """One layer's cache layer at its budget: the ``budget`` best tokens of every head (LAVa's press overrides
        it to split the budget over heads)."""
        return dynamic_layer(*select_top(keys, values, scores, budget))

    def __deepcopy__(self, memo: dict) -> PerPromptBudgetPress:
        clone = copy.copy(self)
        clone._pending = {}
        return clone
