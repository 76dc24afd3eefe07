"""LayerBudgetPress: any kvpress token scorer, any per-layer budget schedule (SnapKV, PyramidKV, RippleKV)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from kvpress import ScorerPress, SnapKVPress
from kvpress.presses.base_press import BasePress
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from ripplekv.allocation.budget import BudgetSchedule, compression_ratio_keeping
from ripplekv.allocation.schedules import UniformSchedule
from ripplekv.models.attention import enable_varlen_attention, supports_per_layer_lengths
from ripplekv.models.layer_types import compressed_layers
from ripplekv.presses.scorers import check_attention_weights
from ripplekv.presses.selection_window import check_compressible, resolve_floor, scorer_window

__all__ = ["LayerBudgetPress", "global_schedule", "scorer_at_ratio"]


def scorer_at_ratio(press: BasePress, ratio: float) -> BasePress:
    """A shallow copy of a scorer (and of its wrapped ``press.press``) at ``compression_ratio = ratio``: scorers such
    as StreamingLLM score by their ratio; a copy keeps state ``dataclasses.replace`` would drop (``QFilterPress``)."""
    clone = copy.copy(press)
    inner = getattr(press, "press", None)
    if isinstance(inner, BasePress):
        clone.press = scorer_at_ratio(inner, ratio)  # type: ignore[attr-defined]
    clone.compression_ratio = ratio  # type: ignore[attr-defined]
    return clone


def global_schedule(schedule: BudgetSchedule, config: PretrainedConfig) -> tuple[BudgetSchedule, tuple[int, ...]]:
    """The schedule over a model's compressed (global) layers, and their indices (``ValueError`` if it does not fit)."""
    layers = compressed_layers(config)
    return schedule.over_layers(layers, int(config.get_text_config().num_hidden_layers)), layers


@dataclass
class LayerBudgetPress(BasePress):
    """Per-layer KV-cache budgets from a schedule, tokens ranked by any kvpress scorer: compressed layer ``l`` of
    ``n`` keeps the ``layer_budgets(n, prompt_tokens)[l]`` tokens ``press.score()`` ranks highest. Sliding-window
    layers stay whole; the scorer is never mutated.

    Args:
        press: token scorer (default ``SnapKVPress()``); its ``compression_ratio`` is ignored.
        floor: smallest budget a layer may get (``>= 1``); None: the scorer's ``window_size`` if it has one, else 1.
    """

    press: ScorerPress = field(default_factory=SnapKVPress)
    schedule: BudgetSchedule = field(default_factory=lambda: UniformSchedule(0.2))
    floor: int | None = None
    _bound: tuple[BudgetSchedule, tuple[int, ...]] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.press, ScorerPress):
            raise TypeError(f"{type(self).__name__} wraps a kvpress ScorerPress, got {type(self.press).__name__}")
        if not isinstance(self.schedule, BudgetSchedule):
            raise TypeError(f"schedule must be a BudgetSchedule, got {type(self.schedule).__name__}")
        self.floor = resolve_floor(self.floor, self.window_size)

    @property
    def window_size(self) -> int:
        """The scorer's observation window (0 if it has none)."""
        return scorer_window(self.press)

    @property
    def compression_ratio(self) -> float:
        """The schedule's (a token budget's raises ``TokenBudgetError``: ``ComposedPress`` never carries NaN)."""
        return self.schedule.spec.compression_ratio

    def compression_ratio_for(self, prompt_tokens: int) -> float:
        return self.schedule.spec.compression_ratio_for(prompt_tokens)

    def layer_budgets(self, n_layers: int, prompt_tokens: int) -> tuple[int, ...]:
        """Tokens kept by each of ``n_layers`` compressed layers: the schedule's budgets with this press's floor."""
        return self.schedule.layer_budgets(n_layers, prompt_tokens, self.floor)  # type: ignore[arg-type]

    def model_budgets(self, config: PretrainedConfig, prompt_tokens: int) -> tuple[int, ...]:
        """Tokens kept by every layer of a model: its budget for a global layer, the whole prompt for a sliding one."""
        schedule, layers = global_schedule(self.schedule, config)
        budgets = dict(zip(layers, schedule.layer_budgets(len(layers), prompt_tokens, self.floor)))  # type: ignore[arg-type]
        return tuple(budgets.get(i, prompt_tokens) for i in range(int(config.get_text_config().num_hidden_layers)))

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        """Bind the schedule to the model's compressed layers, check the scorer and, where layers may differ in
        length, enable variable-length attention."""
        self._bound = global_schedule(self.schedule, model.config)
        check_attention_weights(self.press, model)
        if self._needs_varlen(model):
            current = model.config._attn_implementation
            try:
                enable_varlen_attention(model)
            except ValueError as error:
                raise ValueError(
                    f"{type(self).__name__} gives layers different numbers of tokens, which attention {current!r} "
                    "cannot attend over: load the model with attn_implementation='sdpa' or 'flash_attention_2'"
                ) from error
        self.press.post_init_from_model(model)

    def _needs_varlen(self, model: PreTrainedModel) -> bool:
        """Whether the model must switch to variable-length attention: its layers may get different lengths."""
        return not self.schedule.uniform and not supports_per_layer_lengths(model)

    def _layer_budget(self, module: nn.Module, k_len: int) -> int | None:
        """Tokens layer ``module.layer_idx`` keeps of ``k_len`` (None: a sliding layer, kept whole)."""
        schedule, layers = self._bound or global_schedule(self.schedule, module.config)
        if module.layer_idx not in layers:
            return None
        return schedule.layer_budgets(len(layers), k_len, self.floor)[layers.index(module.layer_idx)]  # type: ignore[arg-type]

    def score(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> torch.Tensor:
        """The scorer's ``(batch, kv_heads, tokens)`` scores of this layer, from a copy at the layer's own ratio
        (for ratio-dependent scorers such as StreamingLLM)."""
        k_len = keys.shape[2]
        n_kept = self._layer_budget(module, k_len)
        ratio = 0.0 if n_kept is None else compression_ratio_keeping(max(1, min(n_kept, k_len)), k_len)
        return scorer_at_ratio(self.press, ratio).score(module, hidden_states, keys, values, attentions, kwargs)

    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep layer ``module.layer_idx``'s budget of the scorer's best tokens (:meth:`select`)."""
        k_len = keys.shape[2]
        n_kept = self._layer_budget(module, k_len)
        if n_kept is None:
            return keys, values
        check_compressible(self, kwargs, k_len, self.window_size)
        if n_kept >= k_len:
            return keys, values
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        return self.select(module, keys, values, scores, n_kept, kwargs)

    def select(
        self,
        module: nn.Module,
        keys: torch.Tensor,
        values: torch.Tensor,
        scores: torch.Tensor,
        n_kept: int,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``n_kept`` highest-scored tokens of every head."""
        indices = scores.topk(n_kept, dim=-1).indices.unsqueeze(-1).expand(-1, -1, -1, module.head_dim)
        return keys.gather(2, indices).contiguous(), values.gather(2, indices).contiguous()
