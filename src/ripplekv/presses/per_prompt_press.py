"""PerPromptBudgetPress: budgets decided per prompt from every layer's statistics (CAKE, SqueezeAttention, ...).

The per-prompt rules of :mod:`ripplekv.allocation` (CAKE, SqueezeAttention, DynamicKV, LAVa) read a small
statistic from each layer during the prefill and share SnapKV's global budget out once every layer has produced
its own. kvpress compresses a layer in a forward hook that runs after the layer's attention, and a layer's
compression only changes what *later passes* attend to, never the prefill's own hidden states: layer ``l + 1``
attends over its own cache, computed from layer ``l``'s output, which compression does not touch. So every
layer's statistic (and its token scores) can be collected first and all layers pruned after the last one, and the
caches are exactly those of compressing each layer as soon as its budget is known (tested with a schedule whose
budgets are known in advance).

The press keeps each compressed layer's cache whole until the last compressed layer's hook, keeping only the
layer's statistic and its token scores (``(batch, kv_heads, tokens)`` floats), then prunes every layer to its
budget with the same top-k as :class:`~ripplekv.presses.LayerBudgetPress`. Sliding-window layers are left whole
and the budgets are shared over the global layers.

Token scores are computed with the scorer as given (its ``compression_ratio`` untouched), so the scorer's scores
must not depend on its compression ratio (SnapKV, ExpectedAttention, TOVA, KNorm, KeyDiff do not; StreamingLLM
does, and is refused).
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
    """Keep the ``n_kept`` highest-scored positions of every KV head (as kvpress's ScorerPress does).

    Args:
        keys, values: ``(batch, kv_heads, tokens, head_dim)``.
        scores: ``(batch, kv_heads, tokens)``.
        n_kept: positions kept per head (all of them when ``>= tokens``).
    """
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
        press: the token scorer (default ``SnapKVPress()``, window 64); its ``compression_ratio`` is ignored, and
            its scores must not depend on it (StreamingLLM is refused).
        schedule: the rule and the budget (:class:`~ripplekv.allocation.per_prompt.PerPromptSchedule`); its
            ``window_size`` is the window the budgets reserve, and must equal what the scorer always keeps: its
            ``window_size`` for a scorer with an observation window (SnapKV), 0 for one without (ExpectedAttention,
            TOVA, KNorm, ...), so that no layer's budget is forced uniform for a window nobody keeps.
        floor: smallest budget of a layer (``>= 1``); default the scorer's window, else 1 (as
            :class:`~ripplekv.presses.LayerBudgetPress`; resolved when built).
        statistic_window: the observation window of the rule's window statistics (the last ``statistic_window``
            prompt positions as queries; ``>= 1``); default the scorer's ``window_size``, else
            :data:`DEFAULT_STATISTIC_WINDOW` (resolved when built). A method's own window (DynamicKV's 8, CAKE's and
            LAVa's 32) can be set here without changing the scorer's. The window attention a rule reads covers the
            keys the selection chooses among, those before both windows (``n - max(statistic_window, window_size)``).
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
        """Average fraction removed (kvpress convention): ``1 - budget`` for a kept fraction.

        Raises:
            TokenBudgetError: for a token budget, whose ratio depends on the prompt length.
        """
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
        """Enable variable-length attention (which reads head-wise masked cache layers) and let the scorer see the
        model."""
        self.schedule.check_layers(len(compressed_layers(model.config)))  # type: ignore[union-attr]
        check_attention_weights(self.press, model)
        enable_varlen_attention(model)
        self.press.post_init_from_model(model)

    # ------------------------------------------------------------------------------------------- statistics

    def layer_statistic(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        kwargs: Mapping[str, Any],
        recorded: Mapping[str, Any] | None = None,
    ) -> Any:
        """The rule's statistic of one layer.

        Args:
            module: the attention module.
            hidden_states: its input (at least the last ``statistic_window + 1`` positions).
            keys, values: the layer's full prefill cache.
            kwargs: the attention layer's forward kwargs (``position_embeddings``).
            recorded: inputs captured while the prefill ran (``residual_in``, ``attention_output``).
        """
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

    # --------------------------------------------------------------------------------------- direct prefill

    @contextmanager
    def __call__(self, model: PreTrainedModel) -> Iterator[None]:
        """kvpress's context manager, plus, for rules that read the residual stream, a pre-hook on each decoder
        layer that keeps its input for the statistic (released at once). A kvpress wrapper (``ComposedPress``) runs
        its own context, not this one: such a rule under it is refused at its first layer."""
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
        """One layer's cache layer at its budget: here the ``budget`` best tokens of every head. A press that splits
        a layer's budget over heads (LAVa) overrides this, returning a :class:`~ripplekv.models.headwise.MaskedLayer`
        where heads keep different counts.

        Args:
            keys, values: the layer's full prefill cache.
            scores: the scorer's ``(batch, kv_heads, tokens)`` scores.
            budget: the layer's budget.
            config: the model's config.
        """
        return dynamic_layer(*select_top(keys, values, scores, budget))

    def __deepcopy__(self, memo: dict) -> PerPromptBudgetPress:
        clone = copy.copy(self)
        clone._pending = {}
        return clone
