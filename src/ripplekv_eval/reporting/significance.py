"""One test per comparison, of the estimand the report prints: the task-stratified macro mean of paired differences.

The reported difference of method A and method B is the macro mean ``T = sum_i w_i d_i`` of the per-prompt
differences ``d_i = A_i - B_i`` (``K`` tasks, each task's ``n_k`` prompts weighted ``w_i = 1 / (K n_k)``).

- **Test** (Fisher's randomization test for paired data, *The Design of Experiments*, 1935, ch. III): under the null
  that A and B are exchangeable on every prompt, each ``d_i`` is as likely as ``-d_i``; the sign of each prompt's
  difference is flipped independently and ``T`` recomputed with the same task weights. Two-sided p: the share of
  sign vectors with ``|T_s| >= |T|``. Exact up to ``exact_max`` prompts: ``scipy.stats.permutation_test``
  (``permutation_type="samples"``) enumerates all ``2^n`` sign vectors. Above that, the identity plus ``draws``
  random sign vectors from a generator seeded by the seed and the prompt ids, so
  ``p = (1 + #{|T_b| >= |T|}) / (draws + 1)`` (never 0). Both feed one statistic, :func:`_signed_sums`.
- **Interval**: the inversion of that test, ``{delta : p(delta) >= alpha}``, where ``p(delta)`` tests the shifted
  differences ``d_i - delta`` with the *same* sign vectors. For each vector the set of ``delta`` where it is at
  least as extreme is an interval around ``T`` (closed form in :meth:`SignFlip.test`), so the ends are order
  statistics: exact, no root search, and **raw p < alpha exactly when the interval excludes 0** (ties within
  rounding count as extreme on both sides). With ``2^n * alpha < 2`` (5 prompts or fewer) it is the whole line.
- **Multiplicity**: :func:`holm` (Holm 1979) over a family the caller names (:data:`FAMILIES`); **significant** =
  Holm-adjusted p < alpha (:func:`~ripplekv_eval.reporting.comparisons.settle`).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

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
DEFAULT_DRAWS = 19999  # + the identity: 20000 sign vectors, p >= 5e-5
MIN_DRAWS = 999
EXACT_MAX = 16  # prompts up to which all 2^n sign vectors are enumerated (65,536)
FAMILIES = {
    "budget": "the distinct comparisons of one metric at one budget",
    "metric": "the distinct comparisons of one metric over all budgets",
}
DEFAULT_FAMILY = "budget"
_TIE = 1e-9  # relative to sum |w_i d_i|: sign vectors this close to the observed |T| are ties (count as extreme)
_FLIPS = (np.arange(256)[:, None] >> np.arange(8)[None, :]) & 1  # byte b flips the prompts of its set bits


@dataclass(frozen=True)
class FlipTest:
    """The sign-flip test of one macro-mean difference and its inverted interval.

    ``low`` / ``high`` are ``-inf`` / ``inf`` when no shift can be rejected. ``method``: ``exact`` or
    ``monte-carlo``; ``vectors``: sign vectors used (``2^n``, or ``draws + 1``).
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


def _signed_sums(bits: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """``(vectors, k)``: each sign vector (``bits``: ``(bytes, vectors)``, bit set: flipped) applied to each column
    of ``columns`` (``(n, k)``): per byte of 8 prompts a table of its 256 signed sums, then one look-up per byte.
    """
    groups = bits.shape[0]
    padded = np.zeros((8 * groups, columns.shape[1]))
    padded[: columns.shape[0]] = columns
    table = (1.0 - 2.0 * _FLIPS) @ padded.reshape(groups, 8, -1)  # (groups, 256, k)
    out = np.zeros((columns.shape[1], bits.shape[1]))
    for g in range(groups):
        index = bits[g].astype(np.intp)
        for k in range(columns.shape[1]):
            out[k] += table[g, :, k].take(index)
    return out.T


@lru_cache(maxsize=4)
def _enumerated(n: int) -> np.ndarray:
    """``(bytes, 2^n)``: every sign vector of ``n`` prompts (bit set: flipped), enumerated by
    ``scipy.stats.permutation_test`` (``permutation_type="samples"`` flips the signs of ones); the order changes no
    count.
    """
    if n == 1:  # scipy needs two observations
        return np.array([[0, 1]], dtype=np.uint8)
    from scipy.stats import permutation_test  # imported here: scipy.stats takes seconds to import

    flipped = permutation_test(
        (np.ones(n),),
        lambda signs, axis: np.moveaxis(signs, axis, -1) < 0,
        permutation_type="samples",
        vectorized=True,
        n_resamples=2**n,
    ).null_distribution
    return np.ascontiguousarray(np.packbits(flipped, axis=-1, bitorder="little").T)


@lru_cache(maxsize=8)  # a run's comparisons share few prompt sets
def _drawn(seed: int, draws: int, keys: tuple[tuple[str, str], ...]) -> np.ndarray:
    """``(bytes, draws + 1)``: the identity, then ``draws`` random sign vectors seeded by ``seed`` and the prompts."""
    n = len(keys)
    groups = (n + 7) // 8
    digest = zlib.crc32("\x1f".join(f"{t}\x1e{i}" for t, i in keys).encode())
    bits = np.zeros((draws + 1, groups), dtype=np.uint8)
    bits[1:] = np.random.default_rng([seed, digest, n]).integers(0, 256, size=(draws, groups), dtype=np.uint8)
    bits[:, -1] &= np.uint8((1 << (n - 8 * (groups - 1))) - 1)  # the bits of the last byte that are prompts
    return np.ascontiguousarray(bits.T)


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

    def null(self, keys: tuple[tuple[str, str], ...], columns: np.ndarray) -> np.ndarray:
        """``(vectors, k)``: the signed sums of ``columns`` (``(n, k)``) under every sign vector of the test.

        Args:
            keys: the prompts' (task, sample id), in the order of the rows of ``columns`` (part of the seed).
            columns: the values to sign, one row per prompt.
        """
        n = len(keys)
        bits = _enumerated(n) if n <= self.exact_max else _drawn(self.seed, self.draws, keys)
        return _signed_sums(bits, columns)

    def test(self, differences: Sequence[Mapping[str, Mapping[str, float]]]) -> list[FlipTest]:
        """The test and the inverted interval of the macro mean of each of ``differences`` (task -> sample id -> d).

        Args:
            differences: the paired differences of each comparison; tasks without any are left out.
        """
        return [self._one(diff) for diff in differences]

    def _one(self, differences: Mapping[str, Mapping[str, float]]) -> FlipTest:
        tasks = sorted(task for task, values in differences.items() if values)
        if not tasks:
            raise ValueError("no paired differences to test")
        keys = tuple((task, sample) for task in tasks for sample in sorted(differences[task]))
        d = np.array([differences[t][s] for t, s in keys], dtype=np.float64)
        if not np.all(np.isfinite(d)):
            raise ValueError("paired differences must be finite")
        w = np.concatenate([np.full(len(differences[t]), 1.0 / (len(tasks) * len(differences[t]))) for t in tasks])
        x = w * d
        observed = float(np.mean([np.mean([differences[t][s] for s in sorted(differences[t])]) for t in tasks]))
        total = float(x.sum())
        tol = _TIE * float(np.abs(x).sum())
        # u = T_s, the macro mean under each sign vector; v: that of all-ones, how a shift delta moves T_s
        sums = self.null(keys, np.column_stack([x, w]))
        u, v = sums[:, 0], sums[:, 1]
        whole = np.abs(v) > 1.0 - float(w.min())  # all signs equal (|v| = 1): |T_s(delta)| = |T(delta)| everywhere
        # |u - delta v| >= |total - delta| with e = delta - total, r = u - total v: |r - e v| >= |e|, |v| < 1, holds
        # for e between -r / (1 - v) and r / (1 + v) (the two roots, on either side of 0).
        r = u - total * v
        with np.errstate(divide="ignore", invalid="ignore"):
            one, two = r / (1.0 + v), -r / (1.0 - v)
        lo = np.where(whole, -np.inf, np.minimum(one, two)) - tol
        hi = np.where(whole, np.inf, np.maximum(one, two)) + tol
        vectors = len(sums)
        extreme = int(np.count_nonzero((lo <= -total) & (-total <= hi)))  # sign vectors with |T_s| >= |T| (ties in)
        need = max(1, math.ceil(self.alpha * vectors - 1e-9))  # delta is accepted when >= need vectors cover it
        low = float(total + np.sort(lo)[need - 1]) if need <= vectors else math.inf
        high = float(total + np.sort(hi)[::-1][need - 1]) if need <= vectors else -math.inf
        return FlipTest(
            mean=observed,
            low=low,
            high=high,
            p=min(1.0, extreme / vectors),
            method="exact" if len(keys) <= self.exact_max else "monte-carlo",
            vectors=vectors,
            samples=len(keys),
            tasks=len(tasks),
        )


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
