"""What a KV-cache budget is (:class:`BudgetSpec`), and how it becomes integer per-layer budgets.

Every schedule splits the global budget ``layers * average`` into integers with :func:`scale_to_total`: exact
rational water-filling, then largest-remainder rounding, so budgets are deterministic and platform-independent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

from ripplekv.validation import is_integer, is_real

__all__ = [
    "BudgetSpec",
    "TokenBudgetError",
    "budget_value",
    "compression_ratio_keeping",
    "largest_remainder",
    "scale_to_total",
]


class TokenBudgetError(ValueError):
    """``compression_ratio`` asked of a token budget, which has none without the prompt length.

    A ``ValueError``, not an ``AttributeError``, so ``getattr(press, "compression_ratio", default)`` does not
    silently swallow it.
    """


_BUDGET_RULE = "budget= is a kept fraction in (0, 1] (0.1 = 10%), tokens= an average token count per layer (>= 1)"


def _budget_problem(budget: object, tokens: object) -> str | None:
    """What is wrong with a ``(budget, tokens)`` pair, or None when exactly one of them is valid."""
    if budget is None and tokens is None:
        return f"no budget given: {_BUDGET_RULE}"
    if budget is not None and tokens is not None:
        return f"give budget= or tokens=, not both (got budget={budget!r}, tokens={tokens!r})"
    if budget is not None:
        if not is_real(budget):
            return f"budget must be a real number, a kept fraction in (0, 1]; got {budget!r}"
        value = float(budget)  # type: ignore[arg-type]
        if math.isnan(value):
            return "budget is NaN; it must be a kept fraction in (0, 1]"
        if math.isinf(value):
            return f"budget is {value} (infinite); it must be a kept fraction in (0, 1]"
        if value <= 0:
            return f"budget must be > 0 (a kept fraction in (0, 1]), got {budget!r}"
        if value > 1:
            hint = f"tokens={int(value)}" if math.isfinite(value) and value.is_integer() else "tokens=N (an integer)"
            return (
                f"budget={budget!r} is above 1, but budget is a kept fraction in (0, 1]; for an average number of "
                f"tokens kept per layer use {hint}"
            )
        return None
    if not is_integer(tokens):
        kind = "a bool" if isinstance(tokens, bool) else repr(tokens)
        return f"tokens must be an integer >= 1 (an average token count per layer), got {kind}"
    if tokens < 1:  # type: ignore[operator]
        return f"tokens must be >= 1 (an average token count per layer), got {tokens!r}"
    return None


def compression_ratio_keeping(kept: int, prompt_tokens: int) -> float:
    """The kvpress ``compression_ratio`` (fraction removed) that keeps exactly ``kept`` of ``prompt_tokens`` tokens.

    ``1 - kept / prompt_tokens``, moved by a few ulps where float rounding would make kvpress's
    ``int(prompt_tokens * (1 - ratio))`` (``kvpress.utils.compute_n_kept``) keep one token fewer or more; 0 when
    every token is kept.

    Raises:
        ValueError: if the counts are not integers with ``1 <= kept <= prompt_tokens``.
    """
    if not is_integer(prompt_tokens) or prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be an integer >= 1, got {prompt_tokens!r}")
    if not is_integer(kept) or not 1 <= kept <= prompt_tokens:
        raise ValueError(f"kept must be an integer in [1, {prompt_tokens}], got {kept!r}")
    if kept == prompt_tokens:
        return 0.0
    ratio = 1.0 - int(kept) / int(prompt_tokens)
    for _ in range(64):
        counted = int(prompt_tokens * (1 - ratio))
        if counted == kept:
            return ratio
        ratio = math.nextafter(ratio, -math.inf if counted < kept else math.inf)
    raise AssertionError(f"no float ratio keeps {kept} of {prompt_tokens} tokens")  # pragma: no cover


@dataclass(frozen=True)
class BudgetSpec:
    """A KV-cache budget: a kept fraction of the prompt, or an average number of kept tokens per layer.

    Exactly one is set, so ``1.0`` (keep everything) and ``tokens=1`` are never confused; an invalid pair is a
    ``ValueError`` naming the problem (a ``budget`` above 1 points to ``tokens=``). A token budget removes a
    fraction that depends on the prompt length, so its ``compression_ratio`` raises :class:`TokenBudgetError`
    rather than return a made-up number (or NaN, which kvpress arithmetic would carry on with).

    Attributes:
        budget: kept fraction of the prompt in ``(0, 1]`` (``0.1`` is 10%), or None.
        tokens: average kept tokens per layer (an integer ``>= 1``; at most the prompt is kept), or None.
    """

    budget: float | None = None
    tokens: int | None = None

    ROW_TOKENS_MIN: ClassVar[int] = 2
    """The smallest token count with a numeric row value (:attr:`value`): 1 would read back as the fraction 1.0."""

    def __post_init__(self) -> None:
        problem = _budget_problem(self.budget, self.tokens)
        if problem is not None:
            raise ValueError(problem)
        if self.budget is not None:
            object.__setattr__(self, "budget", float(self.budget))
        else:
            object.__setattr__(self, "tokens", int(self.tokens))  # type: ignore[arg-type]

    @property
    def is_tokens(self) -> bool:
        """True for a token count, False for a kept fraction."""
        return self.tokens is not None

    def average(self, prompt_tokens: int) -> int:
        """Kept KV entries per layer on average, in ``[1, prompt_tokens]``.

        A fraction keeps ``max(1, int(prompt_tokens * (1 - (1 - budget))))``, kvpress's float expression exactly
        (``1 - 0.9`` is ``0.09999999999999998``, so 10% of 100 tokens is 9, as in kvpress); a token count keeps
        ``min(tokens, prompt_tokens)``.

        Raises:
            ValueError: if ``prompt_tokens`` is not an integer ``>= 1``.
        """
        if not is_integer(prompt_tokens) or prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be an integer >= 1, got {prompt_tokens!r}")
        if self.tokens is not None:
            return min(self.tokens, int(prompt_tokens))
        # kvpress keeps int(k_len * (1 - compression_ratio)) with compression_ratio = 1 - budget; computing the
        # same float expression makes a uniform allocation keep exactly what kvpress's own press keeps.
        return max(1, int(prompt_tokens * (1.0 - (1.0 - float(self.budget)))))  # type: ignore[arg-type]

    @property
    def compression_ratio(self) -> float:
        """``1 - budget`` for a kept fraction (kvpress's convention: the fraction removed).

        Raises:
            TokenBudgetError: for a token budget; use :meth:`compression_ratio_for`.
        """
        if self.tokens is not None:
            raise TokenBudgetError(
                f"a budget of tokens={self.tokens} per layer has no compression_ratio without the prompt length: "
                "use compression_ratio_for(prompt_tokens)"
            )
        return 1.0 - float(self.budget)  # type: ignore[arg-type]

    def compression_ratio_for(self, prompt_tokens: int) -> float:
        """The fraction of a ``prompt_tokens``-token prompt removed, for both kinds, kvpress keeping :meth:`average`.

        It can differ from :attr:`compression_ratio` by the rounding of the kept count (10% of 100 tokens keeps 9:
        0.91, not 0.9).

        Raises:
            ValueError: if ``prompt_tokens`` is not an integer ``>= 1``.
        """
        return compression_ratio_keeping(self.average(prompt_tokens), int(prompt_tokens))

    @property
    def value(self) -> float | int:
        """The budget as one number, as results rows store it: ``<= 1`` a fraction (float), ``> 1`` tokens (int).

        Raises:
            ValueError: for ``tokens=1``, whose number would read back as the fraction 1.0 (keep everything).
        """
        if self.tokens is None:
            return float(self.budget)  # type: ignore[arg-type]
        if self.tokens < self.ROW_TOKENS_MIN:
            raise ValueError(
                f"tokens={self.tokens} has no numeric budget value: {self.tokens} reads back as the kept fraction "
                f"{float(self.tokens)} (the full cache); use tokens >= {self.ROW_TOKENS_MIN}"
            )
        return int(self.tokens)

    @classmethod
    def from_value(cls, value: object) -> BudgetSpec:
        """The budget of a number as results rows store it (:attr:`value`), e.g. ``0.1``, ``512`` or ``512.0``.

        Raises:
            ValueError: for anything else (a value above 1 that is not a whole number, ``<= 0``, NaN, a bool).
        """
        if not is_real(value) or not math.isfinite(float(value)) or float(value) <= 0:  # type: ignore[arg-type]
            raise ValueError(f"a budget value is a kept fraction in (0, 1] or a whole token count >= 2, got {value!r}")
        number = float(value)  # type: ignore[arg-type]
        if number <= 1:
            return cls(budget=number)
        if not number.is_integer():
            raise ValueError(f"budget value {value!r} is above 1, so a token count, but not a whole number")
        return cls(tokens=int(number))

    def kwargs(self) -> dict[str, float | int]:
        """``{"budget": fraction}`` or ``{"tokens": count}``, for ``make_press`` and the schedules."""
        return {"budget": float(self.budget)} if self.tokens is None else {"tokens": int(self.tokens)}  # type: ignore[arg-type]

    @property
    def label(self) -> str:
        """``10%`` for a fraction, ``512 tokens per layer`` for a token count."""
        if self.tokens is not None:
            return f"{self.tokens} token{'s' if self.tokens != 1 else ''} per layer"
        return f"{100 * float(self.budget):g}%"  # type: ignore[arg-type]


def budget_value(value: object) -> float | int:
    """A results row's ``budget`` number normalised: a fraction as a float, a token count as an int.

    Raises:
        ValueError: as :meth:`BudgetSpec.from_value`.
    """
    return BudgetSpec.from_value(value).value


def _water_fill(weights: Sequence[Fraction], total: int, low: int, high: int) -> list[Fraction]:
    """Exact real shares ``x_l = clip(t * w_l, low, high)`` with ``sum(x) == total`` (water-filling).

    Each round fixes at their bound only the side (cap or floor) with the larger total violation, the side whose
    violators stay violators at the final level ``t``; requires ``len(w) * low <= total <= len(w) * high``.
    """
    shares: list[Fraction | None] = [None] * len(weights)
    free = list(range(len(weights)))
    remaining = Fraction(total)
    while free:
        level = remaining / sum(weights[i] for i in free)
        over = [i for i in free if level * weights[i] > high]
        under = [i for i in free if level * weights[i] < low]
        if not over and not under:
            for i in free:
                shares[i] = level * weights[i]
            break
        excess = sum((level * weights[i] - high for i in over), Fraction(0))
        deficit = sum((low - level * weights[i] for i in under), Fraction(0))
        fixed: list[tuple[int, int]] = []
        if excess >= deficit:
            fixed += [(i, high) for i in over]
        if deficit >= excess:
            fixed += [(i, low) for i in under]
        for i, bound in fixed:
            shares[i] = Fraction(bound)
            remaining -= bound
        fixed_ids = {i for i, _ in fixed}
        free = [i for i in free if i not in fixed_ids]
    return [share if share is not None else Fraction(0) for share in shares]


def largest_remainder(
    shares: Sequence[Fraction], weights: Sequence[Fraction], preference: Sequence[float], total: int
) -> list[int]:
    """Round exact shares summing to ``total`` to integers summing to ``total``.

    Leftover units after ``floor(x_l)`` go to the largest remainders, ties to larger weight, then larger
    ``preference``, then lower index. A layer gets at most ``ceil(x_l)``, so integer bounds on the shares hold.
    """
    floors = [math.floor(share) for share in shares]
    leftover = total - sum(floors)
    order = sorted(range(len(shares)), key=lambda i: (-(shares[i] - floors[i]), -weights[i], -preference[i], i))
    budgets = list(floors)
    for i in order[:leftover]:
        budgets[i] += 1
    return budgets


def scale_to_total(
    weights: Sequence[float | Fraction],
    total: int,
    floor: int,
    cap: int,
    preference: Sequence[float] | None = None,
) -> list[int]:
    """Integer shares of ``total`` proportional to ``weights``, within ``[floor, cap]``, summing to ``total``.

    The last step of every offline schedule: :func:`_water_fill` then :func:`largest_remainder`, so shares are
    monotone in the weights. Weights are positive and finite (floats used exactly, as binary fractions);
    ``total <= len(weights) * cap``. ``floor`` is lowered to ``cap`` and, when every entry cannot meet it, to
    ``total // len(weights)``. ``preference`` breaks ties of equal weight and remainder.

    Raises:
        ValueError: on empty or non-positive weights, or a ``total``, ``floor`` or ``cap`` out of range.
    """
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
    shares = _water_fill(exact, int(total), low, int(cap))
    ties = [0.0] * n if preference is None else [float(p) for p in preference]
    return largest_remainder(shares, exact, ties, int(total))
