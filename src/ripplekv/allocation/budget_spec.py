"""What a KV-cache budget is: a kept fraction of the prompt or an average token count per layer.

One concern: a budget as the schedules, presses and results rows give it. ``budget=`` is a kept fraction in
``(0, 1]``, ``tokens=`` an average number of kept tokens per layer (an integer ``>= 1``), exactly one of them, never
read from the size of one number (:class:`BudgetSpec`, validated by :func:`check_budget`). A budget resolves to the
kept entries per layer of a prompt exactly as kvpress counts them (:meth:`BudgetSpec.average`,
:func:`resolve_average_budget`), and :func:`kept_ratio` gives the kvpress ``compression_ratio`` that keeps a given
count. How the RippleKV rule (paper, 2026) shares a budget among layers is :mod:`ripplekv.allocation.budgets`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ripplekv.validation import is_integer, is_real

__all__ = [
    "BudgetSpec",
    "TokenBudgetError",
    "budget_value",
    "check_budget",
    "kept_ratio",
    "resolve_average_budget",
]


class TokenBudgetError(ValueError):
    """``compression_ratio`` asked of a token budget, which has none without the prompt length.

    Use ``compression_ratio_for(prompt_tokens)``. A ``ValueError``, not an ``AttributeError``: ``getattr(press,
    "compression_ratio", default)`` does not silently swallow it.
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


def check_budget(budget: object = None, tokens: object = None, owner: str | None = None) -> BudgetSpec:
    """Validate a budget given as a kept fraction (``budget``) or as an average token count (``tokens``).

    Args:
        budget: kept fraction of the prompt, in ``(0, 1]``; None when ``tokens`` is given.
        tokens: average number of kept tokens per layer, an integer ``>= 1``; None when ``budget`` is given.
        owner: named at the start of the error message (e.g. ``"UniformSchedule"``).

    Returns:
        The :class:`BudgetSpec`.

    Raises:
        ValueError: unless exactly one of ``budget`` and ``tokens`` is given and valid; the message names the
            problem (a ``budget`` above 1 points to ``tokens=``).
    """
    problem = _budget_problem(budget, tokens)
    if problem is not None:
        raise ValueError(f"{owner}: {problem}" if owner else problem)
    return BudgetSpec(budget, tokens)  # type: ignore[arg-type]


def kept_ratio(kept: int, prompt_tokens: int) -> float:
    """The compression ratio that keeps ``kept`` of ``prompt_tokens`` tokens, as kvpress counts them.

    ``1 - kept / prompt_tokens``, moved by a few ulps where float rounding would otherwise make kvpress's
    ``int(prompt_tokens * (1 - ratio))`` (``kvpress.utils.compute_n_kept``) keep one token fewer or more: a
    kvpress press configured with this ratio keeps exactly ``kept`` tokens.

    Args:
        kept: tokens kept, in ``[1, prompt_tokens]``.
        prompt_tokens: tokens of the prompt (``>= 1``).

    Returns:
        A ratio in ``[0, 1)``; 0 when every token is kept.

    Raises:
        ValueError: if the counts are not integers in range.
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

    Exactly one of the two is set, so ``1.0`` (keep everything) and ``tokens=1`` (one token per layer) can never
    be confused. Schedules and presses take the same two arguments (``budget=``, ``tokens=``) and build one.

    ``compression_ratio`` follows kvpress (the fraction removed) for a fraction only: ``1 - budget``. A token
    budget removes a fraction that depends on the prompt length, so its ``compression_ratio`` raises
    :class:`TokenBudgetError` rather than return a made-up number (or NaN, which kvpress arithmetic would carry
    on with); :meth:`compression_ratio_for` gives the ratio for a known prompt length, for both kinds.

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
        """Kept KV entries per layer on average for a prompt of ``prompt_tokens`` tokens (``>= 1``).

        A fraction keeps ``max(1, int(prompt_tokens * (1 - (1 - budget))))``: exactly kvpress's
        ``int(k_len * (1 - compression_ratio))`` with ``compression_ratio = 1 - budget``, float rounding included
        (``1 - 0.9`` is ``0.09999999999999998``, so 10% of 100 tokens is 9, as in kvpress). A token count keeps
        ``min(tokens, prompt_tokens)``. The result is always in ``[1, prompt_tokens]``.

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
            TokenBudgetError: for a token budget, which removes a different fraction of every prompt length; use
                :meth:`compression_ratio_for` with the prompt length.
        """
        if self.tokens is not None:
            raise TokenBudgetError(
                f"a budget of tokens={self.tokens} per layer has no compression_ratio without the prompt length: "
                "use compression_ratio_for(prompt_tokens)"
            )
        return 1.0 - float(self.budget)  # type: ignore[arg-type]

    def compression_ratio_for(self, prompt_tokens: int) -> float:
        """The fraction of a ``prompt_tokens``-token prompt removed: ``1 - average(prompt_tokens) / prompt_tokens``.

        Defined for both kinds; it is :func:`kept_ratio` of the kept count, so a kvpress press given this ratio
        keeps exactly :meth:`average` tokens. For a fraction it can differ from :attr:`compression_ratio` by the
        rounding of the kept count (10% of 100 tokens keeps 9: 0.91, not 0.9).

        Raises:
            ValueError: if ``prompt_tokens`` is not an integer ``>= 1``.
        """
        return kept_ratio(self.average(prompt_tokens), int(prompt_tokens))

    @property
    def value(self) -> float | int:
        """The budget as one number, as results rows store it: the fraction (a float), or the token count (an int).

        Rows written before token budgets had their own argument hold the same numbers, so a value ``<= 1`` is a
        fraction and a value ``> 1`` a token count (:meth:`from_value`).

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
        """The budget of a number as results rows store it (:attr:`value`): ``<= 1`` a fraction, ``> 1`` tokens.

        Args:
            value: a kept fraction in ``(0, 1]``, or an integer-valued token count ``>= 2`` (``512`` or ``512.0``).

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

    Args:
        value: a kept fraction in ``(0, 1]`` or an integer-valued token count ``>= 2``.

    Raises:
        ValueError: as :meth:`BudgetSpec.from_value`.
    """
    return BudgetSpec.from_value(value).value


def resolve_average_budget(
    budget: float | None = None, prompt_tokens: int | None = None, *, tokens: int | None = None
) -> int:
    """The average number of kept KV entries per layer of a budget (:meth:`BudgetSpec.average`).

    Args:
        budget: a kept *fraction* of the prompt, ``0 < budget <= 1`` (``0.1`` is the 10% budget of the RippleKV
            paper, 2026); a value above 1 is an error (use ``tokens``).
        prompt_tokens: the number of prompt tokens whose KV entries are being compressed (``>= 1``; required).
        tokens: instead of ``budget``, an average number of tokens per layer (an integer ``>= 1``).

    Returns:
        For a fraction, ``max(1, int(prompt_tokens * (1 - (1 - budget))))``, kvpress's count; for a token count,
        ``min(tokens, prompt_tokens)``. Always in ``[1, prompt_tokens]``.

    Raises:
        ValueError: if ``prompt_tokens`` is not an integer ``>= 1``, or unless exactly one of ``budget`` and
            ``tokens`` is given and valid.
    """
    if not is_integer(prompt_tokens) or prompt_tokens < 1:  # type: ignore[operator]
        raise ValueError(f"prompt_tokens must be an integer >= 1, got {prompt_tokens!r}")
    return check_budget(budget, tokens).average(int(prompt_tokens))  # type: ignore[arg-type]
