"""A KV-cache budget (:class:`BudgetSpec`) and its per-layer integers: each schedule splits SnapKV's total ``layers *
average`` by :func:`scale_to_total` (exact water-filling, largest remainder); RippleKV's rule is :func:`allocate`."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import cached_property, lru_cache
from typing import Any, ClassVar

import numpy as np

from ripplekv.validation import is_integer, is_real


class TokenBudgetError(ValueError):
    """``compression_ratio`` of a token budget (a ``ValueError``: ``getattr(press, "compression_ratio", d)`` raises)."""


_BUDGET_RULE = "budget= is a kept fraction in (0, 1] (0.1 = 10%), tokens= an average token count per layer (>= 1)"


def _budget_problem(budget: object, tokens: object) -> str | None:
    """What is wrong with a ``(budget, tokens)`` pair, or None when exactly one of them is valid."""
    if budget is None and tokens is None:
        return f"no budget given: {_BUDGET_RULE}"
    if budget is not None and tokens is not None:
        return f"give budget= or tokens=, not both (got budget={budget!r}, tokens={tokens!r})"
    if budget is None:
        if not is_integer(tokens):
            kind = "a bool" if isinstance(tokens, bool) else repr(tokens)
            return f"tokens must be an integer >= 1 (an average token count per layer), got {kind}"
        too_small = tokens < 1  # type: ignore[operator]
        return f"tokens must be >= 1 (an average token count per layer), got {tokens!r}" if too_small else None
    if not is_real(budget):
        return f"budget must be a real number, a kept fraction in (0, 1]; got {budget!r}"
    value = float(budget)  # type: ignore[arg-type]
    if not math.isfinite(value):
        kind = "NaN" if math.isnan(value) else f"{value} (infinite)"
        return f"budget is {kind}; it must be a kept fraction in (0, 1]"
    if value <= 0:
        return f"budget must be > 0 (a kept fraction in (0, 1]), got {budget!r}"
    if value > 1:
        hint = f"tokens={int(value)}" if value.is_integer() else "tokens=N (an integer)"
        return (
            f"budget={budget!r} is above 1, but budget is a kept fraction in (0, 1]; for an average number of "
            f"tokens kept per layer use {hint}"
        )
    return None


def _check_prompt(prompt_tokens: object) -> None:
    if not is_integer(prompt_tokens) or prompt_tokens < 1:  # type: ignore[operator]
        raise ValueError(f"prompt_tokens must be an integer >= 1, got {prompt_tokens!r}")


def compression_ratio_keeping(kept: int, prompt_tokens: int) -> float:
    """The kvpress ``compression_ratio`` that keeps exactly ``kept`` of ``prompt_tokens`` tokens (0: all kept):
    ``1 - kept / prompt_tokens``, moved by a few ulps where kvpress's ``int(prompt_tokens * (1 - ratio))`` is off."""
    _check_prompt(prompt_tokens)
    if not is_integer(kept) or not 1 <= kept <= prompt_tokens:
        raise ValueError(f"kept must be an integer in [1, {prompt_tokens}], got {kept!r}")
    ratio = 1.0 - int(kept) / int(prompt_tokens)  # 0.0 when every token is kept
    for _ in range(64):
        counted = int(prompt_tokens * (1 - ratio))
        if counted == kept:
            return ratio
        ratio = math.nextafter(ratio, -math.inf if counted < kept else math.inf)
    raise AssertionError(f"no float ratio keeps {kept} of {prompt_tokens} tokens")  # pragma: no cover


@dataclass(frozen=True)
class BudgetSpec:
    """A budget: a kept fraction of the prompt (``budget`` in ``(0, 1]``) or an average of ``tokens`` kept per
    layer (an integer ``>= 1``), exactly one of them, so ``1.0`` (keep everything) and ``tokens=1`` never mix."""

    budget: float | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        problem = _budget_problem(self.budget, self.tokens)
        if problem is not None:
            raise ValueError(problem)
        given = ("budget", float(self.budget)) if self.budget is not None else ("tokens", int(self.tokens))  # type: ignore[arg-type]
        object.__setattr__(self, *given)

    def average(self, prompt_tokens: int) -> int:
        """Kept tokens per layer on average: ``min(tokens, prompt_tokens)``, or for a fraction kvpress's own count
        ``max(1, int(prompt_tokens * (1 - (1 - budget))))`` (10% of 100 tokens is 9, as in kvpress)."""
        _check_prompt(prompt_tokens)
        if self.tokens is not None:
            return min(self.tokens, int(prompt_tokens))
        return max(1, int(prompt_tokens * (1.0 - (1.0 - float(self.budget)))))  # type: ignore[arg-type]

    @property
    def compression_ratio(self) -> float:
        """kvpress's ``1 - budget``; a token budget raises :class:`TokenBudgetError` (use the ``_for`` variant)."""
        if self.tokens is not None:
            raise TokenBudgetError(
                f"a budget of tokens={self.tokens} per layer has no compression_ratio without the prompt length: "
                "use compression_ratio_for(prompt_tokens)"
            )
        return 1.0 - float(self.budget)  # type: ignore[arg-type]

    def compression_ratio_for(self, prompt_tokens: int) -> float:
        """The fraction of a ``prompt_tokens``-token prompt removed when each layer keeps :meth:`average`."""
        return compression_ratio_keeping(self.average(prompt_tokens), int(prompt_tokens))

    def kwargs(self) -> dict[str, float | int]:
        """``{"budget": fraction}`` or ``{"tokens": count}``, for ``make_press`` and the schedules."""
        return {"budget": self.budget} if self.tokens is None else {"tokens": self.tokens}  # type: ignore[dict-item]


def fill_shares(
    offsets: Sequence[float | Fraction],
    slopes: Sequence[float | Fraction],
    lows: Sequence[int],
    highs: Sequence[int],
    total: int,
) -> list[Fraction]:
    """Exact water-filling: real shares ``x_l = clip(a_l + t * c_l, lo_l, hi_l)`` with ``sum(x) == total``, one level
    ``t`` for all.

    ``a = 0, c = w`` is proportional water-filling; ``c = 1`` is additive (an excess or deficit spread evenly). Each
    round fixes at their bound only the side (upper or lower) with the larger total violation, whose violators stay
    violators at the final ``t`` (``sum(x)`` is non-decreasing in ``t``). Entries with ``c_l == 0`` stay at
    ``clip(a_l, lo_l, hi_l)`` unless the others cannot absorb ``total``: they then share what is left evenly. Needs
    finite ``a``, ``c >= 0``, ``lo <= hi``, ``sum(lows) <= total <= sum(highs)``.
    """
    n = len(offsets)
    if not n or len(slopes) != n or len(lows) != n or len(highs) != n:
        raise ValueError("fill_shares needs equally long, non-empty offsets, slopes, lows and highs")
    if any(not isinstance(v, Fraction) and not math.isfinite(float(v)) for v in [*offsets, *slopes]):
        raise ValueError("fill_shares needs finite offsets and slopes")
    a = [Fraction(v) for v in offsets]
    c = [Fraction(v) for v in slopes]
    if any(s < 0 for s in c):
        raise ValueError(f"slopes must be >= 0, got {[float(s) for s in c]}")
    if any(lo > hi for lo, hi in zip(lows, highs)):
        raise ValueError("every lower bound must be <= its upper bound")
    if not sum(lows) <= total <= sum(highs):
        raise ValueError(f"a total of {total} is outside [sum(lows), sum(highs)] = [{sum(lows)}, {sum(highs)}]")
    moving = [i for i in range(n) if c[i] > 0]
    if not moving:
        return fill_shares(a, [1] * n, lows, highs, total)
    fixed = [i for i in range(n) if c[i] == 0]
    shares = [min(max(a[i], Fraction(lows[i])), Fraction(highs[i])) for i in range(n)]  # the fixed entries' values
    remaining = total - sum((shares[i] for i in fixed), Fraction(0))
    if not sum(lows[i] for i in moving) <= remaining <= sum(highs[i] for i in moving):
        # the moving entries all sit at one bound; the constant ones share the rest evenly among themselves
        bound = highs if remaining > sum(highs[i] for i in moving) else lows
        rest = fill_shares(
            [a[i] for i in fixed],
            [1] * len(fixed),
            [lows[i] for i in fixed],
            [highs[i] for i in fixed],
            total - sum(bound[i] for i in moving),
        )
        for i, value in [*((i, Fraction(bound[i])) for i in moving), *zip(fixed, rest)]:
            shares[i] = value
        return shares
    free = moving
    while free:
        level = (remaining - sum(a[i] for i in free)) / sum(c[i] for i in free)
        over = [i for i in free if a[i] + level * c[i] > highs[i]]
        under = [i for i in free if a[i] + level * c[i] < lows[i]]
        excess = sum((a[i] + level * c[i] - highs[i] for i in over), Fraction(0))
        deficit = sum((lows[i] - a[i] - level * c[i] for i in under), Fraction(0))
        pinned = {i: highs[i] for i in over if excess >= deficit} | {i: lows[i] for i in under if deficit >= excess}
        for i in free:
            shares[i] = Fraction(pinned[i]) if i in pinned else a[i] + level * c[i]
        remaining -= sum(pinned.values())
        free = [i for i in free if i not in pinned]
        if not pinned:
            break
    return shares


def largest_remainder(
    shares: Sequence[Fraction], weights: Sequence[Fraction], preference: Sequence[float], total: int
) -> list[int]:
    """Exact shares summing to ``total`` rounded to integers summing to ``total``: leftover units go to the largest
    remainders (ties: larger weight, larger ``preference``, lower index); no share moves past its ceiling."""
    floors = [math.floor(share) for share in shares]
    order = sorted(range(len(shares)), key=lambda i: (-(shares[i] - floors[i]), -weights[i], -preference[i], i))
    raised = set(order[: total - sum(floors)])
    return [floor + (i in raised) for i, floor in enumerate(floors)]


def scale_to_total(
    weights: Sequence[float | Fraction], total: int, floor: int, cap: int, preference: Sequence[float] | None = None
) -> list[int]:
    """Integers proportional to positive ``weights`` in ``[floor, cap]`` summing to ``total`` (monotone in the
    weights). ``floor`` is lowered to ``cap``, then to ``total // len(weights)`` when not every entry can meet it."""
    if len(weights) == 0:
        raise ValueError("scale_to_total needs at least one weight")
    for name, value in (("total", total), ("floor", floor), ("cap", cap)):
        if not is_integer(value) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if not all(isinstance(w, Fraction) or math.isfinite(float(w)) for w in weights):
        raise ValueError(f"weights must be finite, got {list(weights)}")
    exact = [Fraction(w) if isinstance(w, Fraction) else Fraction(float(w)) for w in weights]
    if any(w <= 0 for w in exact):
        raise ValueError(f"weights must be positive, got {[float(w) for w in exact]}")
    n = len(exact)
    if total > n * cap:
        raise ValueError(f"a total of {total} does not fit in {n} shares of at most {cap}")
    low = min(int(floor), int(cap))
    if n * low > total:
        low = total // n
    shares = fill_shares([0] * n, exact, [low] * n, [int(cap)] * n, int(total))
    ties = [0.0] * n if preference is None else [float(p) for p in preference]
    return largest_remainder(shares, exact, ties, int(total))


def _check_subset(layers: Sequence[int], n_layers: int) -> None:
    if not layers or any(not is_integer(i) for i in layers) or list(layers) != sorted(set(layers)):
        raise ValueError(f"compressed layers must be increasing layer indices, got {list(layers)!r}")
    if layers[0] < 0 or layers[-1] >= n_layers:
        raise ValueError(f"compressed layers {list(layers)!r} are not layers of a model of {n_layers} layers")


class BudgetSchedule(ABC):
    """Per-layer budgets of a :class:`BudgetSpec` (``budget`` or ``tokens``): frozen, validated when built."""

    budget: float | None
    tokens: int | None
    uniform: ClassVar[bool] = False
    """True when every layer always keeps the same count (no variable-length attention needed)."""

    @staticmethod
    def _check_call(n_layers: int, floor: int) -> None:
        if not is_integer(n_layers) or n_layers < 1:
            raise ValueError(f"n_layers must be an integer >= 1, got {n_layers!r}")
        if not is_integer(floor) or floor < 0:
            raise ValueError(f"floor must be an integer >= 0, got {floor!r}")

    def _check_budget(self) -> None:
        try:
            spec = BudgetSpec(self.budget, self.tokens)
        except ValueError as error:
            raise ValueError(f"{type(self).__name__}: {error}") from None
        object.__setattr__(self, "budget", spec.budget)
        object.__setattr__(self, "tokens", spec.tokens)

    @cached_property
    def spec(self) -> BudgetSpec:
        """The budget (its average, its kvpress ``compression_ratio``)."""
        return BudgetSpec(self.budget, self.tokens)

    @abstractmethod
    def layer_budgets(self, n_layers: int, prompt_tokens: int, floor: int) -> tuple[int, ...]:
        """Tokens kept by each layer, summing to ``n_layers * average(prompt_tokens)``, each in
        ``[min(floor, prompt_tokens, average), prompt_tokens]``; a per-prompt schedule takes its inputs after these
        three, by keyword (``stats=``)."""

    def check_layers(self, n_layers: int) -> None:
        """Raise ``ValueError`` if the schedule cannot serve a model of ``n_layers`` layers."""
        self._check_call(n_layers, 0)

    def over_layers(self, layers: Sequence[int], n_layers: int) -> BudgetSchedule:
        """The schedule of the compressed ``layers`` (increasing) of an ``n_layers``-layer model, which spreads
        ``len(layers) * average`` over them alone; a profile schedule keeps those layers' scores."""
        self.check_layers(n_layers)
        _check_subset(layers, n_layers)
        return self


DEFAULT_RATIO: float = 4.0
"""Default disparity ``r``, chosen with :data:`DEFAULT_GAMMA` on a needle-retrieval grid (docs/results.md)."""
DEFAULT_GAMMA: float = 3.0


@dataclass(frozen=True)
class AllocationConfig:
    """The RippleKV rule's knobs (paper, 2026): ``ratio``, the ``r`` of ``w_l = r ** s_l`` over the min-max
    normalised sensitivities (``> 0``; ``1`` uniform, ``< 1`` inverted), and ``gamma``, weights clipped to
    ``[1 / gamma, gamma]`` (``>= 1``)."""

    ratio: float = DEFAULT_RATIO
    gamma: float = DEFAULT_GAMMA

    def __post_init__(self) -> None:
        if not is_real(self.ratio) or not math.isfinite(self.ratio) or self.ratio <= 0:
            raise ValueError(f"AllocationConfig.ratio must be a finite number > 0, got {self.ratio!r}")
        if not is_real(self.gamma) or not math.isfinite(self.gamma) or self.gamma < 1:
            raise ValueError(f"AllocationConfig.gamma must be a finite number >= 1, got {self.gamma!r}")


DEFAULT_CONFIG = AllocationConfig()


def validate_scores(scores: Sequence[float]) -> np.ndarray:
    """One finite sensitivity per layer as a 1-D float64 array, or a ``ValueError`` naming the problem."""
    try:
        array = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"sensitivity scores must be a sequence of real numbers: {error}") from error
    if array.ndim != 1:
        raise ValueError(f"sensitivity scores must be one-dimensional (one per layer), got shape {array.shape}")
    if array.size == 0:
        raise ValueError("sensitivity scores are empty: need one score per layer (at least one layer)")
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        kind = "NaN" if np.isnan(array[bad[0]]) else f"{array[bad[0]]} (infinite)"
        raise ValueError(f"sensitivity score for layer {int(bad[0])} is {kind} (non-finite in layers {bad.tolist()})")
    return array


def normalize_scores(scores: Sequence[float]) -> np.ndarray:
    """Scores min-max normalised to ``[0, 1]``; all zeros if all equal."""
    array = validate_scores(scores)
    low, high = float(array.min()), float(array.max())
    if high == low:
        return np.zeros_like(array)
    span = high - low  # that of two huge finite floats can overflow to inf: halving everything keeps it finite
    normalized = (array - low) / span if math.isfinite(span) else (array / 2 - low / 2) / (high / 2 - low / 2)
    return np.clip(normalized, 0.0, 1.0)


def _weights_from_normalized(normalized: np.ndarray, config: AllocationConfig) -> np.ndarray:
    weights = np.power(float(config.ratio), normalized)
    # ``pow`` is not correctly rounded: a running extremum over the sorted exponents keeps the weights in order
    order = np.argsort(normalized, kind="stable")
    accumulate = np.maximum.accumulate if config.ratio >= 1 else np.minimum.accumulate
    weights[order] = accumulate(weights[order])
    return np.clip(weights, 1.0 / float(config.gamma), float(config.gamma))


def layer_weights(scores: Sequence[float], config: AllocationConfig = DEFAULT_CONFIG) -> np.ndarray:
    """RippleKV's multipliers ``clip(ratio ** normalize_scores(scores), 1 / gamma, gamma)``."""
    return _weights_from_normalized(normalize_scores(scores), config)


@dataclass(frozen=True)
class Allocation:
    """A RippleKV allocation and what it came from (``ripplekv allocate`` prints it)."""

    scores: tuple[float, ...]
    normalized: tuple[float, ...]
    weights: tuple[float, ...]
    budgets: tuple[int, ...]
    prompt_tokens: int
    average_budget: int
    total: int

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def allocate(
    scores: Sequence[float],
    prompt_tokens: int,
    floor: int = 1,
    *,
    budget: float | None = None,
    tokens: int | None = None,
    config: AllocationConfig = DEFAULT_CONFIG,
) -> Allocation:
    """The RippleKV rule, in :meth:`BudgetSchedule.layer_budgets`' order (one layer per score): layer ``l`` gets
    ``clip(t * w_l, floor, prompt_tokens)`` of the total ``L * average``, ``w`` = :func:`layer_weights`, by
    :func:`scale_to_total` (rounding ties go to the higher score, the lower for ``ratio < 1``, so a more sensitive
    layer never gets fewer tokens)."""
    array = validate_scores(scores)
    normalized = normalize_scores(array)
    weights = _weights_from_normalized(normalized, config)
    preference = array if config.ratio >= 1 else -array
    if not is_integer(floor) or floor < 0:
        raise ValueError(f"floor must be an integer >= 0, got {floor!r}")
    _check_prompt(prompt_tokens)
    average = BudgetSpec(budget, tokens).average(int(prompt_tokens))
    total = len(weights) * average
    budgets = scale_to_total([float(w) for w in weights], total, int(floor), int(prompt_tokens), preference)
    exact = (tuple(map(float, array)), tuple(map(float, normalized)), tuple(map(float, weights)), tuple(budgets))
    return Allocation(*exact, int(prompt_tokens), average, average * len(budgets))  # type: ignore[arg-type]


@dataclass(frozen=True)
class ProfileSchedule(BudgetSchedule):
    """RippleKV's schedule: :func:`allocate` over per-layer sensitivity ``scores`` (one per model layer, or one
    per compressed layer) with :class:`AllocationConfig`'s ``ratio`` and ``gamma``."""

    budget: float | None = None
    scores: tuple[float, ...] = ()
    ratio: float = DEFAULT_RATIO
    gamma: float = DEFAULT_GAMMA
    tokens: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        self._check_budget()
        object.__setattr__(self, "scores", tuple(float(s) for s in validate_scores(self.scores)))
        AllocationConfig(ratio=self.ratio, gamma=self.gamma)  # validates ratio and gamma

    def check_layers(self, n_layers: int) -> None:
        self._check_call(n_layers, 0)
        if len(self.scores) != n_layers:
            raise ValueError(f"{len(self.scores)} layer scores for a model of {n_layers} layers")

    def over_layers(self, layers: Sequence[int], n_layers: int) -> ProfileSchedule:
        self._check_call(n_layers, 0)
        _check_subset(layers, n_layers)
        if len(self.scores) == len(layers):
            return self
        self.check_layers(n_layers)
        return replace(self, scores=tuple(self.scores[i] for i in layers))

    def layer_budgets(self, n_layers: int, prompt_tokens: int, floor: int) -> tuple[int, ...]:
        self._check_call(n_layers, floor)
        self.check_layers(n_layers)
        return _profile_budgets(self, prompt_tokens, floor)


@lru_cache(maxsize=256)
def _profile_budgets(schedule: ProfileSchedule, prompt_tokens: int, floor: int) -> tuple[int, ...]:
    config = AllocationConfig(ratio=schedule.ratio, gamma=schedule.gamma)
    return allocate(schedule.scores, prompt_tokens, floor, **schedule.spec.kwargs(), config=config).budgets
