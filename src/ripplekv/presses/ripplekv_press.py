"""RippleKVPress: per-layer token budgets from a sensitivity profile, any kvpress scorer for selection."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

import torch
from kvpress import ScorerPress, SnapKVPress
from kvpress.presses.base_press import BasePress
from torch import nn
from transformers import PreTrainedModel

from ripplekv.allocation import DEFAULT_GAMMA, DEFAULT_RATIO, AllocationConfig, allocate_budgets
from ripplekv.models.attention import PaddedBatchError
from ripplekv.profiling.profile import SensitivityProfile

SIGNALS = ("kl", "local")


@lru_cache(maxsize=256)
def _budgets(
    scores: tuple[float, ...], budget: float, prompt_tokens: int, ratio: float, gamma: float, min_tokens: int
) -> tuple[int, ...]:
    config = AllocationConfig(ratio=ratio, gamma=gamma)
    return tuple(allocate_budgets(scores, budget, prompt_tokens, config, min_tokens=min_tokens))


def has_padding(attention_mask: torch.Tensor | None) -> bool:
    """Whether a prefill's 4D attention mask hides some token from the last query (i.e. padding)."""
    if attention_mask is None:
        return False
    last = attention_mask[..., -1, :]
    visible = last if last.dtype == torch.bool else last == 0
    return not bool(visible.all())


@dataclass
class RippleKVPress(BasePress):
    """RippleKV (2026): give each layer the KV-cache budget its measured sensitivity asks for.

    Offline, :func:`ripplekv.profiling.profile_model` measures how much the model's output distribution
    moves when each layer's Value cache is perturbed. Here those scores become per-layer token budgets
    (min-max normalise, ``w_l = ratio ** s_l``, clip to ``[1/gamma, gamma]``, rescale to the global budget;
    see :mod:`ripplekv.allocation`), and layer ``l`` keeps exactly its budget of the tokens ranked highest
    by the inner press's ``score()``. Token selection is the inner press's; only the count changes, and no
    extra model pass is run at inference.

    The press never mutates the inner press (it calls ``score()`` on it, or on a copy when the score
    depends on the compression ratio), so one instance can serve several models or threads.

    Parameters
    ----------
    press : ScorerPress
        Token scorer (default: ``SnapKVPress()``, window 64). Its ``compression_ratio`` is ignored.
    budget : float
        Kept fraction of the prompt in (0, 1] (the paper's 10/20/30%), or, when > 1, the average number of
        tokens kept per layer. The global budget is ``num_layers`` times that average.
    profile : SensitivityProfile | None
        Sensitivity profile of the model; checked against the model when the press is applied.
    scores : Sequence[float] | None
        Raw per-layer scores instead of a profile (exactly one of ``profile`` and ``scores``).
    signal : str
        Which profile signal to allocate from: ``"kl"`` (downstream KL, the method) or ``"local"``
        (the ablation using the layer's own attention-output change).
    ratio : float
        Disparity ``r`` of the multipliers ``r ** s_l`` (``1`` gives uniform budgets).
    gamma : float
        Multipliers are clipped to ``[1/gamma, gamma]``.
    min_tokens : int | None
        Smallest budget a layer may get; default: the inner press's ``window_size`` if it has one
        (SnapKV always keeps its observation window), else 1.
    """

    press: ScorerPress = field(default_factory=SnapKVPress)
    budget: float = 0.2
    profile: SensitivityProfile | None = None
    scores: Sequence[float] | None = None
    signal: str = "kl"
    ratio: float = DEFAULT_RATIO
    gamma: float = DEFAULT_GAMMA
    min_tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.press, ScorerPress):
            raise TypeError(f"RippleKVPress wraps a kvpress ScorerPress, got {type(self.press).__name__}")
        if not (isinstance(self.budget, (int, float)) and math.isfinite(self.budget) and self.budget > 0):
            raise ValueError(f"budget must be a fraction in (0, 1] or a token count > 1, got {self.budget!r}")
        if self.budget > 1 and self.budget != int(self.budget):
            raise ValueError(f"a budget above 1 is a token count and must be a whole number, got {self.budget}")
        if (self.profile is None) == (self.scores is None):
            raise ValueError("give exactly one of `profile` and `scores`")
        if self.signal not in SIGNALS:
            raise ValueError(f"signal must be one of {SIGNALS}, got {self.signal!r}")
        AllocationConfig(ratio=self.ratio, gamma=self.gamma)  # validates ratio and gamma
        if self.min_tokens is not None and self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        for i, s in enumerate(self.layer_scores):
            if not math.isfinite(s):
                raise ValueError(f"score of layer {i} is {s} (NaN or non-finite)")

    @property
    def layer_scores(self) -> tuple[float, ...]:
        """The per-layer scores the budgets are allocated from."""
        if self.profile is not None:
            return tuple(self.profile.scores if self.signal == "kl" else self.profile.local_scores)
        return tuple(float(s) for s in self.scores or ())

    @property
    def floor(self) -> int:
        if self.min_tokens is not None:
            return self.min_tokens
        return int(getattr(self.press, "window_size", 1))

    @property
    def compression_ratio(self) -> float:
        """Average fraction removed, when the budget is a fraction (kvpress convention)."""
        return 1.0 - self.budget if self.budget <= 1 else float("nan")

    def layer_budgets(self, prompt_tokens: int) -> tuple[int, ...]:
        """Tokens kept by each layer for a prompt of ``prompt_tokens`` tokens."""
        return _budgets(self.layer_scores, float(self.budget), int(prompt_tokens), self.ratio, self.gamma, self.floor)

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        if self.profile is not None:
            self.profile.check_model(model)
        n_layers = model.config.get_text_config().num_hidden_layers
        if len(self.layer_scores) != n_layers:
            raise ValueError(f"{len(self.layer_scores)} layer scores for a model of {n_layers} layers")
        self.press.post_init_from_model(model)

    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if has_padding(kwargs.get("attention_mask")):
            raise PaddedBatchError("RippleKVPress cannot compress a padded batch: use batch size 1 or equal lengths")
        k_len = keys.shape[2]
        window = int(getattr(self.press, "window_size", 0) or 0)
        if k_len <= window:
            raise ValueError(f"the prompt has {k_len} tokens, not more than the {window}-token selection window")
        n_kept = self.layer_budgets(k_len)[module.layer_idx]
        if n_kept >= k_len:
            return keys, values
        # Scorers such as StreamingLLM derive their scores from compression_ratio: score with a copy set to
        # this layer's ratio (a new object: the caller's press is never modified).
        scorer = replace(self.press, compression_ratio=1.0 - n_kept / k_len)
        scores = scorer.score(module, hidden_states, keys, values, attentions, kwargs)
        indices = scores.topk(n_kept, dim=-1).indices
        indices = indices.unsqueeze(-1).expand(-1, -1, -1, module.head_dim)
        return keys.gather(2, indices).contiguous(), values.gather(2, indices).contiguous()
