"""One test per comparison, of the estimand the report prints: the task-stratified macro mean of paired differences.

The reported difference of method A and method B is the macro mean ``T = (1/K) sum_k mean_{i in task k} d_i`` of the
per-prompt differences ``d_i = A_i - B_i`` (``K`` tasks, each task's prompts weighted ``1 / (K n_k)``). This module
tests it, gives its interval from the same test, and adjusts for multiplicity:

- **Test** (Fisher's randomization test for paired data, *The Design of Experiments*, 1935, ch. III): under the null
  that A and B are exchangeable on every prompt, each ``d_i`` is as likely as ``-d_i``. The sign of each prompt's
  difference is flipped independently and ``T`` recomputed with the same task weights, so the strata and their
  weights are those of the estimate. Two-sided p: the share of sign vectors with ``|T_s| >= |T|``. Exact (all
  ``2^n`` sign vectors) up to ``exact_max`` prompts; otherwise the identity plus ``draws`` random sign vectors,
  seeded by the seed and the prompt ids, so ``p = (1 + #{|T_b| >= |T|}) / (draws + 1)`` (the +1 correction: the
  observed signs are one of the vectors; p is never 0). The flips' distribution has variance
  ``sum_i w_i^2 d_i^2``, the uncentred variance estimate of ``T``: without symmetry the test is still
  asymptotically valid for "macro mean = 0", and conservative when prompt means differ.
- **Interval**: the inversion of that test, ``{delta : p(delta) >= alpha}``, where ``p(delta)`` is the test of the
  shifted differences ``d_i - delta`` with the *same* sign vectors. For each sign vector the set of ``delta`` where
  it is at least as extreme is an interval around ``T`` (closed form below), so the accepted set is an interval and
  its ends are order statistics of those ends: exact, no root search. By construction **raw p < alpha exactly when
  the interval excludes 0** (ties within rounding count as at least as extreme, on both sides). It is exact for a
  common shift with symmetric errors and conservative otherwise; it never leans on resampling a task of 5 prompts,
  where percentile bootstrap intervals are too narrow. With ``2^n * alpha < 2`` (5 prompts or fewer, exact) no shift
  can be rejected and the interval is the whole line.
- **Multiplicity**: Holm's step-down adjustment (Holm 1979, with the cumulative maximum that keeps it monotone)
  over a family the caller names (:data:`FAMILIES`). **Significant** = Holm-adjusted p < alpha. Because
  ``p_holm >= p``, a significant difference always has an interval excluding 0; the one case where they differ is
  an interval excluding 0 whose p does not survive Holm (the interval is per comparison, the verdict per family).

The BCa bootstrap (:func:`bca_interval`) of the same macro mean is kept alongside for reference
(:class:`ripplekv_eval.reporting.stats.Bootstrap`); the verdict never depends on it.

Only numpy, scipy.special (BCa's normal quantiles) and the standard library: no torch.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
    "bca_interval",
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


class SignFlip:
    """The stratified sign-flip test (see the module docstring).

    Args:
        draws: random sign vectors when there are more than ``exact_max`` prompts (at least ``MIN_DRAWS``).
        seed: non-negative seed; the vectors depend only on it and the prompts' (task, id) pairs.
        confidence: level of the inverted interval (``alpha = 1 - confidence``).
        exact_max: enumerate every sign vector up to this many prompts (0 to 20).
    """

    def __init__(
        self, draws: int = DEFAULT_DRAWS, seed: int = 0, confidence: float = 0.95, exact_max: int = EXACT_MAX
    ) -> None:
        for name, value, low in (("draws", draws, MIN_DRAWS), ("seed", seed, 0), ("exact_max", exact_max, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if exact_max > 20:
            raise ValueError(f"exact_max must be at most 20 (2^20 sign vectors), got {exact_max}")
        if not 0.0 < confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {confidence}")
        self.draws, self.seed, self.confidence, self.exact_max = draws, seed, confidence, exact_max
        self._signs: dict[tuple[tuple[str, str], ...], tuple[np.ndarray, np.ndarray]] = {}

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    def signs(self, keys: Sequence[tuple[str, str]]) -> np.ndarray:
        """``(vectors, n)`` of +-1 (int8): every sign vector (``n <= exact_max``) or the identity + ``draws`` random.

        Args:
            keys: the prompts' (task, sample id), in the order of the values they will sign (part of the seed).
        """
        bits = self._cached(keys)[0].T
        flips = np.unpackbits(bits, axis=1, count=len(keys), bitorder="little")
        return (1 - 2 * flips.astype(np.int8)).astype(np.int8)

    def _cached(self, keys: Sequence[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray]:
        """``(bytes, vectors)``: the sign vectors, 8 prompts a byte (bit set: flipped); and which are all equal."""
        key = tuple(keys)
        cached = self._signs.get(key)
        if cached is not None:
            return cached
        n = len(key)
        if n == 0:
            raise ValueError("no paired differences to test")
        groups = (n + 7) // 8
        if n <= self.exact_max:  # vector c flips the prompts of c's set bits; c = 0 is the identity
            codes = np.arange(2**n, dtype=np.int64)
            bits = np.stack([(codes >> (8 * g)) & 0xFF for g in range(groups)], axis=1).astype(np.uint8)
        else:
            digest = zlib.crc32("\x1f".join(f"{t}\x1e{i}" for t, i in key).encode())
            rng = np.random.default_rng([self.seed, digest, n])
            bits = np.zeros((self.draws + 1, groups), dtype=np.uint8)
            bits[1:] = rng.integers(0, 256, size=(self.draws, groups), dtype=np.uint8)
        last = np.uint8((1 << (n - 8 * (groups - 1))) - 1)  # the bits of the last byte that are prompts
        bits[:, -1] &= last
        none = np.all(bits[:, :-1] == 0, axis=1) & (bits[:, -1] == 0)
        every = np.all(bits[:, :-1] == 0xFF, axis=1) & (bits[:, -1] == last)
        if len(self._signs) >= 8:  # a run's comparisons share few prompt sets; keep memory bounded
            self._signs.pop(next(iter(self._signs)))
        bits = np.ascontiguousarray(bits.T)  # (bytes, vectors): one contiguous row per byte for the look-ups
        self._signs[key] = (bits, none | every)  # all signs equal: |T_s(delta)| = |T(delta)| for every delta
        return bits, none | every

    @staticmethod
    def _signed_sums(bits: np.ndarray, columns: np.ndarray) -> np.ndarray:
        """``(vectors, k)``: each sign vector (``bits``: ``(bytes, vectors)``) applied to each column of ``(n, k)``.

        Per byte of 8 prompts a table of its 256 signed sums, then one look-up per byte and vector.
        """
        groups = bits.shape[0]
        padded = np.zeros((8 * groups, columns.shape[1]))
        padded[: columns.shape[0]] = columns
        flips = (np.arange(256)[:, None] >> np.arange(8)[None, :]) & 1
        table = (1.0 - 2.0 * flips) @ padded.reshape(groups, 8, -1)  # (groups, 256, k)
        out = np.zeros((columns.shape[1], bits.shape[1]))
        for g in range(groups):
            index = bits[g].astype(np.intp)
            for k in range(columns.shape[1]):
                out[k] += table[g, :, k].take(index)
        return out.T

    def test(self, differences: Mapping[str, Mapping[str, float]]) -> FlipTest:
        """The test and the inverted interval of the macro mean of ``differences`` (task -> sample id -> d).

        Args:
            differences: the paired differences; tasks without any are left out.
        """
        tasks = sorted(task for task, values in differences.items() if values)
        if not tasks:
            raise ValueError("no paired differences to test")
        keys = [(task, sample) for task in tasks for sample in sorted(differences[task])]
        d = np.array([differences[t][s] for t, s in keys], dtype=np.float64)
        if not np.all(np.isfinite(d)):
            raise ValueError("paired differences must be finite")
        w = np.concatenate([np.full(len(differences[t]), 1.0 / (len(tasks) * len(differences[t]))) for t in tasks])
        bits, whole = self._cached(keys)
        x = w * d
        observed = float(np.mean([np.mean([differences[t][s] for s in sorted(differences[t])]) for t in tasks]))
        total = float(x.sum())
        tol = _TIE * float(np.abs(x).sum())
        # u = T_s, the macro mean under each sign vector; v: that of all-ones, how a shift delta moves T_s
        sums = self._signed_sums(bits, np.column_stack([x, w]))
        u, v = sums[:, 0], sums[:, 1]
        # |u - delta v| >= |total - delta| with e = delta - total, r = u - total v: |r - e v| >= |e|, |v| < 1, holds
        # for e between -r / (1 - v) and r / (1 + v) (the two roots, on either side of 0).
        r = u - total * v
        with np.errstate(divide="ignore", invalid="ignore"):
            one, two = r / (1.0 + v), -r / (1.0 - v)
        lo = np.where(whole, -np.inf, np.minimum(one, two)) - tol
        hi = np.where(whole, np.inf, np.maximum(one, two)) + tol
        vectors = bits.shape[1]
        extreme = int(np.count_nonzero((lo <= -total) & (-total <= hi)))  # sign vectors with |T_s| >= |T| (ties in)
        p = extreme / vectors
        need = max(1, math.ceil(self.alpha * vectors - 1e-9))  # delta is accepted when >= need vectors cover it
        low = float(total + np.sort(lo)[need - 1]) if need <= vectors else math.inf
        high = float(total + np.sort(hi)[::-1][need - 1]) if need <= vectors else -math.inf
        return FlipTest(
            mean=observed,
            low=low,
            high=high,
            p=min(1.0, p),
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


def bca_interval(point: float, replicates: np.ndarray, jackknife: np.ndarray, confidence: float) -> tuple[float, float]:
    """The BCa interval (Efron 1987; Efron & Tibshirani 1993, ch. 14) from bootstrap replicates and jackknife values.

    ``z0`` (bias correction) is the normal quantile of the share of replicates below ``point`` (ties within rounding
    count half); the acceleration is ``a = sum U^3 / (6 (sum U^2)^1.5)`` with ``U`` the jackknife influence values
    ``theta - theta_(i)``. With ``z0 = a = 0`` it is the percentile interval. Degenerate replicates (all equal)
    give ``(point, point)``.

    Args:
        point: the estimate.
        replicates: its bootstrap replicates.
        jackknife: the leave-one-out estimates (an empty array: no acceleration).
        confidence: the two-sided level.
    """
    from scipy.special import ndtr, ndtri

    reps = np.asarray(replicates, dtype=np.float64)
    scale = max(1.0, abs(point), float(np.max(np.abs(reps))) if reps.size else 0.0)
    tie = 1e-12 * scale
    if reps.size == 0 or float(np.ptp(reps)) <= tie:
        return point, point
    below = float(np.count_nonzero(reps < point - tie)) + 0.5 * float(np.count_nonzero(np.abs(reps - point) <= tie))
    share = min(max(below / reps.size, 0.5 / reps.size), 1.0 - 0.5 / reps.size)
    z0 = float(ndtri(share))
    influence = float(np.mean(jackknife)) - np.asarray(jackknife, dtype=np.float64) if len(jackknife) else np.zeros(1)
    # a is scale-free: computed on U / 2^k (exact, a power of two) with |U / 2^k| < 2, so that U^3 and
    # (sum U^2)^1.5 neither overflow nor underflow at any magnitude of the data
    peak = float(np.max(np.abs(influence)))
    if peak > 0 and math.isfinite(peak):
        unit = influence / 2.0 ** math.floor(math.log2(peak))
        a = float(np.sum(unit**3)) / (6.0 * float(np.sum(unit**2)) ** 1.5)
    else:
        a = 0.0
    tail = (1.0 - confidence) / 2.0
    levels = []
    for z in (float(ndtri(tail)), float(ndtri(1.0 - tail))):
        denominator = 1.0 - a * (z0 + z)
        level = float(ndtr(z0 + (z0 + z) / denominator)) if denominator > 0 else (1.0 if z > 0 else 0.0)
        levels.append(level)
    low, high = np.quantile(reps, levels)
    return float(min(low, point)), float(max(high, point))
