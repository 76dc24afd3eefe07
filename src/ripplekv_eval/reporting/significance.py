"""One test per comparison, of the estimand the report prints: the task-stratified macro mean of paired differences.

The reported difference of method A and method B is the macro mean ``T = sum_i w_i d_i`` of the per-prompt
differences ``d_i = A_i - B_i`` (``K`` tasks, each task's ``n_k`` prompts weighted ``w_i = 1 / (K n_k)``).

- **Test** (Fisher's randomization test for paired data, *The Design of Experiments*, 1935, ch. III):
  ``scipy.stats.permutation_test(..., permutation_type="samples")`` of one sample, which flips the sign of each
  prompt's difference independently; ``T`` is recomputed with the same task weights. Exact (all ``2^n`` sign
  vectors) up to ``exact_max`` prompts (or when ``draws >= 2^n``); otherwise ``draws`` random sign vectors from a
  generator seeded by the seed and the prompt ids, with scipy's +1 correction (``p`` is never 0). Two-sided ``p``
  is scipy's: twice the smaller one-sided ``p`` (with an exact enumeration, the share of sign vectors with
  ``|T_s| >= |T|``).
- **Interval**: the inversion of that test, ``{delta : p(delta) >= alpha}``, where ``p(delta)`` tests the shifted
  differences ``d_i - delta`` with the *same* sign vectors. A vector's signed mean moves with ``delta`` by its signed
  weight sum ``v_s``, so each one-sided count changes at one point
  ``(T - T_s) / (1 - v_s)`` and the interval's ends are order statistics of those points: exact, no root search,
  and **raw p < alpha exactly when the interval excludes 0**. With too few sign vectors to reach ``alpha``
  (5 prompts or fewer, exact) it is the whole line.
- **Multiplicity**: :func:`holm` (Holm 1979) over a family the caller names (:data:`FAMILIES`); **significant** =
  Holm-adjusted p < alpha (:func:`~ripplekv_eval.reporting.comparisons.settle`).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
from scipy.stats import permutation_test

__all__ = [
    "DEFAULT_DRAWS",
    "DEFAULT_FAMILY",
    "EXACT_MAX",
    "FAMILIES",
    "MIN_DRAWS",
    "TEST_NAME",
    "FlipTest",
    "SignFlip",
    "holm",
]

TEST_NAME = "stratified sign-flip permutation test of the macro-mean difference (interval: its inversion)"
DEFAULT_DRAWS = 19999  # + the observed: p >= 1e-4 (twice the smaller one-sided p, each >= 1 / 20000)
MIN_DRAWS = 999
EXACT_MAX = 16  # prompts up to which all 2^n sign vectors are enumerated (65,536)
FAMILIES = {
    "budget": "the distinct comparisons of one metric at one budget",
    "metric": "the distinct comparisons of one metric over all budgets",
}
DEFAULT_FAMILY = "budget"
_TIE = 100 * np.finfo(np.float64).eps  # scipy's: signed means this close (relative to |T|) to T count as extreme


@dataclass(frozen=True)
class FlipTest:
    """The sign-flip test of one macro-mean difference and its inverted interval.

    ``low`` / ``high`` are ``-inf`` / ``inf`` when no shift can be rejected. ``method``: ``exact`` or
    ``monte-carlo``; ``vectors``: sign vectors counted (``2^n``, or ``draws + 1`` with the observed).
    """

    mean: float
    low: float
    high: float
    p: float
    method: str
    vectors: int
    samples: int
    tasks: int

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def _signed_sums(weights: np.ndarray, axis: int, columns: np.ndarray) -> np.ndarray:
    """``(..., k)``: the signed weights (``axis``: the prompts) times each column of ``columns`` (``(n, k)``)."""
    return np.moveaxis(weights, axis, -1) @ columns


def _weighted(
    differences: Mapping[str, Mapping[str, float]],
) -> tuple[tuple[tuple[str, str], ...], np.ndarray, np.ndarray, float]:
    """The prompts' (task, id) keys, their differences, their weights ``1 / (K n_k)`` and the macro mean."""
    tasks = sorted(task for task, values in differences.items() if values)
    if not tasks:
        raise ValueError("no paired differences to test")
    keys = tuple((task, sample) for task in tasks for sample in sorted(differences[task]))
    d = np.array([differences[t][s] for t, s in keys], dtype=np.float64)
    if not np.all(np.isfinite(d)):
        raise ValueError("paired differences must be finite")
    w = np.concatenate([np.full(len(differences[t]), 1.0 / (len(tasks) * len(differences[t]))) for t in tasks])
    mean = float(np.mean([np.mean([differences[t][s] for s in sorted(differences[t])]) for t in tasks]))
    return keys, d, w, mean


@dataclass(frozen=True)
class SignFlip:
    """The stratified sign-flip test (see the module docstring).

    Args:
        draws: random sign vectors when there are more than ``exact_max`` prompts (at least ``MIN_DRAWS``).
        seed: non-negative seed; the vectors depend only on it and the prompts' (task, id) pairs.
        confidence: level of the inverted interval (``alpha = 1 - confidence``).
        exact_max: enumerate every sign vector up to this many prompts (0 to 20).
    """

    draws: int = DEFAULT_DRAWS
    seed: int = 0
    confidence: float = 0.95
    exact_max: int = EXACT_MAX

    def __post_init__(self) -> None:
        for name, low in (("draws", MIN_DRAWS), ("seed", 0), ("exact_max", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.exact_max > 20:
            raise ValueError(f"exact_max must be at most 20 (2^20 sign vectors), got {self.exact_max}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    def test(self, differences: Sequence[Mapping[str, Mapping[str, float]]]) -> list[FlipTest]:
        """The test and the inverted interval of the macro mean of each of ``differences`` (task -> sample id -> d).

        Differences over the same prompts share their sign vectors (they depend only on the seed and the prompts) and
        one scipy call: grouping changes no p, only the last bits of the intervals' ends (one matrix product or
        several).

        Args:
            differences: the paired differences of each comparison; tasks without any are left out.
        """
        prepared = [_weighted(diff) for diff in differences]
        groups: dict[tuple[tuple[str, str], ...], list[int]] = {}
        for i, (keys, _, _, _) in enumerate(prepared):
            groups.setdefault(keys, []).append(i)
        out: dict[int, FlipTest] = {}
        for keys, members in groups.items():
            w = prepared[members[0]][2]
            columns = np.column_stack([prepared[i][1] for i in members] + [np.ones(len(w))])
            n = len(keys)
            resamples = 2**n if n <= self.exact_max else self.draws
            exact = resamples >= 2**n  # scipy enumerates whenever it can: also draws >= 2^n
            if n == 1:  # scipy needs two; one difference's two sign vectors are equally extreme at every shift
                null, totals, pvalues = np.zeros((0, 2)), w @ columns, np.ones(len(members))
            else:
                digest = zlib.crc32("\x1f".join(f"{t}\x1e{i}" for t, i in keys).encode())
                # scipy flips the signs of the weights w; one matrix product gives every comparison's T_s and,
                # from the column of ones, v_s (how a shift moves T_s)
                result = permutation_test(
                    (w,),
                    partial(_signed_sums, columns=columns),
                    permutation_type="samples",
                    vectorized=True,
                    n_resamples=resamples,
                    batch=max(1, 2**22 // n),  # memory only: the vectors do not depend on it
                    rng=np.random.default_rng([self.seed, digest, n]),
                )
                null, totals, pvalues = result.null_distribution, result.statistic, result.pvalue
            extra = 0 if exact or n == 1 else 1  # scipy's +1: the observed signs count as one vector
            v = null[:, -1]
            identity = v > 1.0 - 0.5 * float(w.min())  # all signs +: T_s(delta) = T(delta) for every delta
            for row, i in enumerate(members):
                total = float(totals[row])
                gamma = _TIE * abs(total)  # scipy's tie tolerance
                # T_s(delta) = u - delta v >= T(delta) - gamma = total - delta - gamma
                #   <=> delta >= (total - u - gamma) / (1 - v); "<= T(delta) + gamma" likewise with + gamma
                with np.errstate(divide="ignore", invalid="ignore"):
                    above = np.where(identity, -np.inf, (total - null[:, row] - gamma) / (1.0 - v))
                    below = np.where(identity, np.inf, (total - null[:, row] + gamma) / (1.0 - v))
                low, high = self._ends(np.sort(above), np.sort(below)[::-1], extra)
                tasks = len({t for t, _ in keys})
                method = "exact" if exact else "monte-carlo"
                mean = prepared[i][3]
                out[i] = FlipTest(mean, low, high, float(pvalues[row]), method, max(2, len(v) + extra), n, tasks)
        return [out[i] for i in range(len(prepared))]

    def _ends(self, above: np.ndarray, below: np.ndarray, extra: int) -> tuple[float, float]:
        """The shifts accepted by both one-sided counts: scipy's ``p = 2 (count + extra) / vectors >= alpha``.

        Args:
            above: ascending: the shift from which each vector counts as "at least as large".
            below: descending: the shift up to which each vector counts as "at most as large".
            extra: scipy's +1 of a Monte Carlo test (0 when exact).
        """
        vectors = max(2, len(above) + extra)
        need = 0
        while 2.0 * ((need + extra) / vectors) < self.alpha - 1e-12:  # 1 - 0.95 is 0.05 + 4e-17: p = 0.05 is kept
            need += 1
        if need == 0 or need > len(above):  # every shift accepted (n = 1: the two vectors tie everywhere)
            return -math.inf, math.inf
        return float(above[need - 1]), float(below[need - 1])


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order (never below the raw p, monotone in it).

    Args:
        pvalues: the raw p-values of the family of comparisons, each in [0, 1].
    """
    p = [float(v) for v in pvalues]
    for v in p:
        if not 0.0 <= v <= 1.0:  # also rejects NaN
            raise ValueError(f"p-values must lie in [0, 1], got {v}")
    m = len(p)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: p[j])):
        running = max(running, min(1.0, (m - rank) * p[i]))  # the cumulative max: step-down, monotone
        adjusted[i] = running
    return adjusted
