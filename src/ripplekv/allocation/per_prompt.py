"""Per-prompt per-layer budget rules (CAKE, SqueezeAttention, DynamicKV, LAVa; one module each): a statistic of
every layer read during the prefill, and after the last layer SnapKV's global budget shared out exactly, each layer
in ``[window_size (and floor), prompt]``, as exact rationals rounded by largest remainder."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ripplekv.allocation.budget import BudgetSchedule, fill_shares, largest_remainder
from ripplekv.validation import check_int, is_integer, is_real

if TYPE_CHECKING:
    import torch


class PerPromptRule(ABC):
    """A per-layer statistic and the budgets it implies once all layers are seen (a frozen dataclass of the method's
    hyperparameters). ``statistic_inputs`` names the tensors :meth:`layer_statistic` takes, ``statistic_names`` the
    fields it returns."""

    name: ClassVar[str]
    statistic_inputs: ClassVar[tuple[str, ...]]
    statistic_names: ClassVar[tuple[str, ...]]

    @abstractmethod
    def layer_statistic(self, *tensors: Any) -> tuple[Any, ...]:
        """The statistic of one layer, from the tensors named by ``statistic_inputs``."""

    @abstractmethod
    def layer_budgets(
        self,
        n_layers: int,
        prompt_tokens: int,
        floor: int,
        *,
        stats: Sequence[Sequence[Any]],
        total: int,
        window_size: int,
    ) -> tuple[int, ...]:
        """Tokens kept by each layer, summing exactly to ``total``, each in ``[layer_floor(...), prompt_tokens]``
        (``window_size``: the scorer's observation window, which every layer keeps). ValueError on a bad
        statistic."""


@dataclass(frozen=True)
class TokenStatistic:
    """A per-layer statistic over per-token values: ``whole(*inputs)`` at once, or over a chunked prefill
    ``reduce([per_token(*chunk_inputs), ...])``, the same reduction over the same values (never a mean of means)."""

    whole: Callable[..., Any]
    per_token: Callable[..., Any]
    reduce: Callable[[Sequence[Any]], Any]

    def __post_init__(self) -> None:
        for name in ("whole", "per_token", "reduce"):
            if not callable(getattr(self, name)):
                raise TypeError(f"TokenStatistic.{name} must be callable, got {getattr(self, name)!r}")

    def __call__(self, *inputs: Any) -> Any:
        """The statistic of the whole prompt: ``whole(*inputs)``."""
        return self.whole(*inputs)


def check_rule_call(
    n_layers: int, prompt_tokens: int, floor: int, *, stats: Sequence[Any], total: int, window_size: int
) -> None:
    """Raise ValueError unless :meth:`PerPromptRule.layer_budgets`' arguments are in range, one statistic a layer."""
    if not is_integer(n_layers) or n_layers < 1:
        raise ValueError(f"n_layers must be an integer >= 1, got {n_layers!r}")
    if not is_integer(prompt_tokens) or prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be an integer >= 1, got {prompt_tokens!r}")
    for name, value in (("window_size", window_size), ("floor", floor)):
        if not is_integer(value) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if not is_integer(total) or not 0 <= total <= n_layers * prompt_tokens:
        raise ValueError(
            f"total must be an integer in [0, n_layers * prompt_tokens] = [0, {n_layers * prompt_tokens}], "
            f"got {total!r}"
        )
    if len(stats) != n_layers:
        raise ValueError(f"{len(stats)} layer statistics for a model of {n_layers} layers (need one per layer)")


def layer_floor(n_layers: int, prompt_tokens: int, floor: int, *, total: int, window_size: int) -> int:
    """The smallest budget every layer gets: ``min(max(floor, window_size), prompt_tokens)`` (SnapKV never drops its
    window), or the average ``total // n_layers`` when ``n_layers`` such floors exceed ``total``."""
    low = min(max(int(floor), int(window_size)), int(prompt_tokens))
    return low if n_layers * low <= total else total // n_layers


def apportion(
    offsets: Sequence[float | Fraction],
    slopes: Sequence[float | Fraction],
    total: int,
    lows: Sequence[int],
    highs: Sequence[int],
    strength: Sequence[float | Fraction] | None = None,
    preference: Sequence[float] | None = None,
) -> tuple[int, ...]:
    """Integer budgets from :func:`fill_shares`, rounded by largest remainder (ties to larger ``strength``, default
    the slopes, then larger ``preference``, then lower index), summing exactly to ``total``, within the bounds."""
    shares = fill_shares(offsets, slopes, lows, highs, total)
    ties = [Fraction(s) for s in (slopes if strength is None else strength)]
    second = [0.0] * len(shares) if preference is None else [float(p) for p in preference]
    return tuple(largest_remainder(shares, ties, second, int(total)))


def top_k_counts(rows: Sequence[Any], k: int) -> tuple[Fraction, ...]:
    """How many of the ``k`` highest entries of all ``rows`` together each row holds (DynamicKV's global top-k,
    LAVa's joint top-k over heads): entries tied with the ``k``-th highest share the slots left in proportion to
    how many each row holds, so the counts are exact fractions summing to ``min(k, entries)``."""
    if not is_integer(k) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")
    arrays = [np.asarray(row, dtype=np.float64).reshape(-1) for row in rows]
    entries = sum(a.size for a in arrays)
    if k == 0 or entries == 0:
        return (Fraction(0),) * len(arrays)
    if k >= entries:
        return tuple(Fraction(a.size) for a in arrays)
    joined = np.concatenate(arrays)
    threshold = np.partition(joined, entries - k)[entries - k]  # the k-th highest entry
    above = [int(np.count_nonzero(a > threshold)) for a in arrays]
    tied = [int(np.count_nonzero(a == threshold)) for a in arrays]
    left = int(k) - sum(above)
    return tuple(Fraction(up) + Fraction(left * tie, sum(tied)) for up, tie in zip(above, tied))


def pool_keys(scores: torch.Tensor, kernel_size: int, pooling: str) -> torch.Tensor:
    """``(batch, heads, keys)`` scores pooled along the keys, stride 1, same length (``F.avg_pool1d`` /
    ``F.max_pool1d``)."""
    from torch.nn import functional as F

    batch, heads, keys = scores.shape
    pool = F.max_pool1d if pooling == "maxpool" else F.avg_pool1d
    pooled = pool(scores.reshape(batch * heads, 1, keys), kernel_size=kernel_size, padding=kernel_size // 2, stride=1)
    return pooled.reshape(batch, heads, keys)


def even_split(total: int, n_layers: int) -> tuple[int, ...]:
    """``total`` split as evenly as possible (the remainder to the first layers)."""
    base, extra = divmod(int(total), int(n_layers))
    return tuple(base + (1 if layer < extra else 0) for layer in range(n_layers))


def finite_array(values: Sequence[Any], what: str, *, nonnegative: bool = True) -> np.ndarray:
    """``values`` as a 1-D float64 array, raising ``ValueError`` (naming ``what``) if non-finite or negative."""
    try:
        array = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{what} must be real numbers: {error}") from error
    bad = np.flatnonzero(~np.isfinite(array) | ((array < 0) if nonnegative else False))
    if bad.size:
        kind = "finite and >= 0" if nonnegative else "finite"
        raise ValueError(f"{what} must be {kind}; layer {int(bad[0])} has {array[bad[0]]!r}")
    return array


def check_positive(owner: str, name: str, value: object, *, minimum: float = 0.0, strict: bool = True) -> None:
    """Raise ``ValueError`` naming ``owner.name`` unless ``value`` is a finite real ``> minimum`` (or ``>=``)."""
    ok = is_real(value) and math.isfinite(float(value))  # type: ignore[arg-type]
    if ok:
        ok = float(value) > minimum if strict else float(value) >= minimum  # type: ignore[arg-type]
    if not ok:
        relation = ">" if strict else ">="
        raise ValueError(f"{owner}.{name} must be a finite number {relation} {minimum:g}, got {value!r}")


POOLINGS: tuple[str, ...] = ("avgpool", "maxpool")
"""The pooling of window-attention scores along the keys that DynamicKV and LAVa offer."""


def check_pooling(owner: str, kernel_size: object, pooling: object) -> None:
    """Raise ``ValueError`` naming ``owner`` unless ``kernel_size`` is an odd integer ``>= 1`` and ``pooling`` known."""
    check_int(f"{owner}.kernel_size", kernel_size, 1)
    if int(kernel_size) % 2 == 0:  # type: ignore[call-overload]
        raise ValueError(f"{owner}.kernel_size must be odd (pooling keeps the keys' length), got {kernel_size}")
    if pooling not in POOLINGS:
        raise ValueError(f"{owner}.pooling must be one of {POOLINGS}, got {pooling!r}")


@dataclass(frozen=True)
class PerPromptSchedule(BudgetSchedule):
    """A per-prompt rule at a user-facing budget: SnapKV's global budget, shared out from every layer's statistic
    (``window_size``: the scorer's observation window, which every layer keeps; kvpress's SnapKV default is 64)."""

    rule: PerPromptRule
    budget: float | None = None
    window_size: int = 64
    _: KW_ONLY
    tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.rule, PerPromptRule):
            raise TypeError(f"PerPromptSchedule.rule must be a PerPromptRule, got {type(self.rule).__name__}")
        self._check_budget()
        check_int("PerPromptSchedule.window_size", self.window_size, 0)

    @property
    def statistic_names(self) -> tuple[str, ...]:
        """The fields of the rule's per-layer statistic."""
        return self.rule.statistic_names

    def total(self, n_layers: int, prompt_tokens: int) -> int:
        """SnapKV's global budget: ``n_layers * spec.average(prompt_tokens)``, as :class:`UniformSchedule` keeps."""
        self.check_layers(n_layers)
        return int(n_layers) * self.spec.average(prompt_tokens)

    def layer_budgets(
        self, n_layers: int, prompt_tokens: int, floor: int, *, stats: Sequence[Sequence[Any]]
    ) -> tuple[int, ...]:
        """Tokens kept by each layer for this prompt: :meth:`PerPromptRule.layer_budgets` at :meth:`total`."""
        total = self.total(n_layers, prompt_tokens)
        return self.rule.layer_budgets(
            n_layers, prompt_tokens, floor, stats=stats, total=total, window_size=self.window_size
        )
