"""The statistics of ``ripplekv report`` and ``ripplekv tune``: macro means, paired comparisons, Holm.

A metric's value for one (method, budget) is the macro mean (each task's mean over its samples, averaged over tasks),
with the stratified BCa bootstrap interval of ``scipy.stats.bootstrap`` (each task one sample, seeded by the seed and
the sample ids). A paired difference ``a - b`` over the samples both have is tested by the stratified sign-flip
permutation test of its macro mean (Fisher 1935; exact, by ``scipy.stats.permutation_test``, up to ``exact_max``
prompts, else ``draws`` seeded sign vectors plus the identity, by ``scipy.stats.monte_carlo_test``) and given the
interval inverting that test with the same vectors, so raw p < alpha exactly when it excludes 0; :func:`holm` adjusts
over a family (:data:`FAMILIES`). The report's ``rule_text`` says all this to its readers.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from typing import Any

import numpy as np

from ripplekv.validation import check_int
from ripplekv_eval.running.results import complete_samples
from ripplekv_eval.sample import FULL_BUDGET, row_configuration

Samples = dict[str, dict[str, float]]
"""Stratum (task) -> sample id -> value."""

CONFIDENCE = 0.95
ALPHA = 0.05
DEFAULT_RESAMPLES = 4000
MIN_RESAMPLES = 2000
TEST_NAME = "stratified sign-flip permutation test of the macro-mean difference (interval: its inversion)"
DEFAULT_DRAWS = 19999  # + the identity: 20000 sign vectors, p >= 5e-5
MIN_DRAWS = 999
EXACT_MAX = 16  # prompts up to which all 2^n sign vectors are enumerated (65,536)
FAMILIES = {
    "budget": "the distinct comparisons of one metric at one budget",
    "metric": "the distinct comparisons of one metric over all budgets",
}
DEFAULT_FAMILY = "budget"
BASELINE = "snapkv"
REFERENCE = "full"
TIE_TOLERANCE = 1e-12  # relative: paired differences this small are ties (exact zeros)
_TIE = 1e-9  # relative to sum |w_i d_i|: sign vectors this close to the observed |T| are ties (count as extreme)
_FLIPS = (np.arange(256)[:, None] >> np.arange(8)[None, :]) & 1  # byte b flips the prompts of its set bits


@dataclass(frozen=True)
class Metric:
    """A per-sample field of the result rows: its direction, ``scale`` (100 for task scores), decimals printed."""

    name: str
    higher_is_better: bool
    scale: float
    decimals: int
    description: str

    def __post_init__(self) -> None:
        if not math.isfinite(self.scale) or self.scale <= 0:
            raise ValueError(f"metric {self.name}: scale must be a positive number, got {self.scale}")
        if self.decimals < 0:
            raise ValueError(f"metric {self.name}: decimals must be >= 0, got {self.decimals}")

    @property
    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"

    def fmt(self, value: float | None, sign: bool = False) -> str:
        """``value`` with the metric's decimals (``+`` before positives with ``sign``; ``nan``; never ``-0.00``)."""
        if value is None or math.isnan(value):
            return "nan"
        if math.isinf(value):
            return ("+inf" if sign else "inf") if value > 0 else "-inf"
        text = f"{value:+.{self.decimals}f}" if sign else f"{value:.{self.decimals}f}"
        return f"{0.0:.{self.decimals}f}" if float(text) == 0.0 else text  # no "-0.00"


METRICS: dict[str, Metric] = {
    "score": Metric(
        "score", True, 100.0, 2, "task score: 100 x the mean sample score of each task, averaged over tasks"
    ),
    "fidelity_kl": Metric(
        "fidelity_kl",
        False,
        1.0,
        4,
        "KL(full || method) in nats per token of the full cache's greedy answer, teacher-forced over the method's "
        "cache",
    ),
    "top1_agreement": Metric(
        "top1_agreement",
        True,
        1.0,
        3,
        "fraction of the full cache's answer tokens that are the method's argmax (teacher-forced)",
    ),
    "gold_nll_delta": Metric(
        "gold_nll_delta",
        False,
        1.0,
        4,
        "mean NLL (nats) of the gold answer over the method's cache minus the full cache's",
    ),
}
"""The metrics of the results contract, in report order."""


@dataclass(frozen=True)
class Estimate:
    """A macro mean with its interval: ``method`` says which (``bca`` or ``sign-flip inversion``)."""

    mean: float
    low: float
    high: float
    samples: int
    tasks: int
    method: str = "bca"

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


@dataclass(frozen=True)
class Bootstrap:
    """Stratified BCa intervals of macro means (see the module docstring); the draws depend only on ``seed`` and the
    sample ids."""

    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0
    confidence: float = CONFIDENCE

    def __post_init__(self) -> None:
        check_int("resamples", self.resamples, MIN_RESAMPLES)
        check_int("seed", self.seed, 0)
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")

    def estimate(self, samples: Samples) -> Estimate:
        """The macro mean of ``samples`` with its BCa interval."""
        return self.estimates([samples])[0]

    def estimates(self, many: Sequence[Samples]) -> list[Estimate]:
        """The macro mean of each of ``many`` with its BCa interval. Those holding the same samples share one
        vectorized ``scipy.stats.bootstrap`` call (resampled identically); a one-sample task is a constant; with
        nothing that varies the interval is the point."""
        groups: dict[tuple[tuple[str, tuple[str, ...]], ...], list[int]] = {}
        for i, samples in enumerate(many):
            tasks = sorted(task for task, values in samples.items() if values)
            if not tasks:
                raise ValueError("no samples to estimate from")
            groups.setdefault(tuple((t, tuple(sorted(samples[t]))) for t in tasks), []).append(i)
        out: dict[int, Estimate] = {}
        for ids, members in groups.items():
            values = [np.array([[many[i][t][s] for s in names] for i in members], dtype=np.float64) for t, names in ids]
            out.update(zip(members, self._intervals(ids, values)))
        return [out[i] for i in range(len(many))]

    def _intervals(self, ids: tuple[tuple[str, tuple[str, ...]], ...], values: list[np.ndarray]) -> list[Estimate]:
        rows = values[0].shape[0]
        count = sum(len(names) for _, names in ids)
        points = [sum(float(v[row].mean()) for v in values) / len(ids) for row in range(rows)]
        resampled = [v for v in values if v.shape[1] > 1]
        fixed = sum((v[:, 0] for v in values if v.shape[1] == 1), np.zeros(rows))
        varying = np.flatnonzero(np.any([np.ptp(v, axis=1) > 0 for v in resampled], axis=0)) if resampled else []
        lows, highs = list(points), list(points)
        if len(varying):
            from scipy.stats import bootstrap  # imported here: scipy.stats takes seconds to import

            key = "\x1f".join(f"{t}\x1e{s}" for t, names in ids for s in names)
            interval = bootstrap(
                [v[varying] for v in resampled],
                partial(_macro, constant=fixed[varying], tasks=len(ids)),
                n_resamples=self.resamples,
                vectorized=True,
                axis=-1,
                confidence_level=self.confidence,
                method="BCa",
                rng=np.random.default_rng([self.seed, zlib.crc32(key.encode())]),
            ).confidence_interval
            for j, row in enumerate(varying):
                lows[row], highs[row] = float(interval.low[j]), float(interval.high[j])
        return [Estimate(points[row], lows[row], highs[row], count, len(ids)) for row in range(rows)]


def _macro(*data: np.ndarray, axis: int, constant: np.ndarray, tasks: int) -> np.ndarray:
    total = sum(np.mean(r, axis=axis) for r in data)
    return (total + constant.reshape(constant.shape + (1,) * (total.ndim - 1))) / tasks


def collect(
    rows: Iterable[Mapping[str, Any]], metric: Metric, task_of: Callable[[Mapping[str, Any]], str]
) -> dict[tuple[str, float], Samples]:
    """(configuration, budget) -> task (``task_of``) -> sample id -> ``scale x value``; rows where the field is
    absent or null (a ``--score fidelity`` run's compressed scores, older runs) are skipped."""
    values: dict[tuple[str, float], Samples] = {}
    for row in rows:
        value = row.get(metric.name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"row {row.get('sample_id')!r}: {metric.name} must be a finite number, got {value!r}")
        key = (row_configuration(row), float(row["budget"]))
        task = values.setdefault(key, {}).setdefault(task_of(row), {})
        task[str(row["sample_id"])] = metric.scale * float(value)
    return values


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


def _oriented(sums: np.ndarray) -> np.ndarray:
    """``(..., 2)`` pairs ``(T_s, V_s)``, each negated where ``T_s < 0`` (which changes no ``|T_s - delta V_s|``)."""
    return np.where(sums[..., :1] < 0, -sums, sums)


def _tied(total: np.ndarray, grid: float) -> np.ndarray:
    """``|T_s|`` in units of ``grid``, rounded: sums equal but for rounding tie exactly (scipy's own tolerance,
    relative to ``|T|``, is too tight for a ``T`` that is 0 but for rounding)."""
    return np.round(np.abs(total) / grid)


def _flip_statistic(data: np.ndarray, axis: int, grid: float) -> np.ndarray:
    """``(..., 3)`` per sign vector, ``data`` holding ``w d`` and ``w`` in its last but one axis: :func:`_tied`
    ``|T_s|``, then :func:`_oriented` ``(T_s, V_s)``, the sums of the signed ``w_i d_i`` (the macro mean) and ``w_i``
    (how a shift of the differences moves it)."""
    sums = np.sum(data, axis=axis)
    return np.concatenate([_tied(sums[..., :1], grid), _oriented(sums)], axis=-1)


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
    """The stratified sign-flip test (module docstring): ``draws`` random sign vectors, seeded by ``seed`` and the
    prompt ids, beyond ``exact_max`` prompts (at most 20); the interval at ``confidence``."""

    draws: int = DEFAULT_DRAWS
    seed: int = 0
    confidence: float = 0.95
    exact_max: int = EXACT_MAX

    def __post_init__(self) -> None:
        for name, low in (("draws", MIN_DRAWS), ("seed", 0), ("exact_max", 0)):
            check_int(name, getattr(self, name), low)
        if self.exact_max > 20:
            raise ValueError(f"exact_max must be at most 20 (2^20 sign vectors), got {self.exact_max}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")

    def test(self, differences: Sequence[Mapping[str, Mapping[str, float]]]) -> list[FlipTest]:
        """The test and inverted interval of the macro mean of each of ``differences`` (task -> sample id -> d)."""
        return [self._one(diff) for diff in differences]

    def _null(self, x: np.ndarray, w: np.ndarray, keys: tuple[tuple[str, str], ...], grid: float) -> tuple:
        """Per sign vector ``(T_s, V_s)`` of ``x = w d`` (a pair may be negated, see :func:`_oriented`), and the
        p-value, the share of vectors with :func:`_tied` ``|T_s| >= |T|``: all ``2^n`` by
        ``scipy.stats.permutation_test`` up to ``exact_max`` prompts, else the identity and ``draws`` seeded ones
        (:func:`_drawn`, the committed engine's: scipy's own draws would change every committed p) by
        ``scipy.stats.monte_carlo_test``."""
        from scipy.stats import monte_carlo_test, permutation_test  # imported here: scipy.stats takes seconds

        if len(keys) == 1:  # scipy's test needs two prompts; the two sign vectors are equally extreme
            return np.array([[x[0], w[0]], [-x[0], -w[0]]]), 1.0
        if len(keys) <= self.exact_max:
            exact = permutation_test(
                (np.stack([x, w]),),
                partial(_flip_statistic, grid=grid),
                permutation_type="samples",
                vectorized=True,
                n_resamples=2 ** len(keys),
                alternative="greater",
                axis=-1,
            )
            return exact.null_distribution[:, 1:], float(exact.pvalue[0])
        sums = _signed_sums(_drawn(self.seed, self.draws, keys), np.column_stack([x, w]))  # the identity first
        sampled = monte_carlo_test(  # T, one observation, against the drawn vectors' T_s
            sums[0, :1],
            lambda size: sums[1 : 1 + size[0], :1],
            lambda total, axis: _tied(np.sum(total, axis=axis), grid),
            vectorized=True,
            n_resamples=self.draws,
            alternative="greater",
        )
        return sums, float(sampled.pvalue)

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
        # u = T_s, the macro mean under each sign vector; v: that of all-ones, how a shift delta moves T_s (both
        # negated where T_s < 0, which changes no |T_s(delta)|)
        sums, p = self._null(x, w, keys, tol or 1.0)  # 1.0: every difference is 0
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
        # delta is accepted when at least `need` vectors cover it
        need = max(1, math.ceil((1.0 - self.confidence) * vectors - 1e-9))
        low = float(total + np.sort(lo)[need - 1]) if need <= vectors else math.inf
        high = float(total + np.sort(hi)[::-1][need - 1]) if need <= vectors else -math.inf
        return FlipTest(
            mean=observed,
            low=low,
            high=high,
            p=p,
            method="exact" if len(keys) <= self.exact_max else "monte-carlo",
            vectors=vectors,
            samples=len(keys),
            tasks=len(tasks),
        )


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values of one family, in the input order."""
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


def paired_differences(a: Samples, b: Samples) -> Samples:
    """Per task, ``a - b`` over the samples present in both (differences within rounding noise are exact 0)."""
    out: Samples = {}
    for task in sorted(a.keys() & b.keys()):
        common = a[task].keys() & b[task].keys()
        diffs = {}
        for sample in sorted(common):  # sorted: sums in a fixed order, the same digits on every run
            x, y = a[task][sample], b[task][sample]
            d = x - y
            diffs[sample] = 0.0 if abs(d) <= TIE_TOLERANCE * max(1.0, abs(x), abs(y)) else d
        if diffs:
            out[task] = diffs
    return out


@dataclass(frozen=True)
class Comparison:
    """``method - other`` at one budget: the macro mean with the sign-flip inversion interval, the raw p (``test``
    ``exact`` or ``monte-carlo`` over ``vectors`` sign vectors); :func:`settle` sets ``p_holm`` and ``significant``."""

    method: str
    other: str
    difference: Estimate
    wins: int
    ties: int
    losses: int
    p: float
    p_holm: float = math.nan
    significant: bool = False
    test: str = ""
    vectors: int = 0

    @property
    def pair(self) -> frozenset[str]:
        return frozenset((self.method, self.other))


@dataclass(frozen=True)
class MetricStats:
    """One metric's analysis: ``estimates`` (method, budget) -> mean; ``versus`` budget -> method ->
    ``{"baseline": ..., "best_other": ...}``; ``tests`` budget -> its distinct comparisons (unordered pairs)."""

    metric: Metric
    estimates: dict[tuple[str, float], Estimate]
    versus: dict[float, dict[str, dict[str, Comparison]]] = field(default_factory=dict)
    tests: dict[float, list[Comparison]] = field(default_factory=dict)
    family: str = DEFAULT_FAMILY


def compare(
    metric: Metric, pairs: Sequence[tuple[str, str, Samples, Samples]], flip: SignFlip
) -> list[Comparison | None]:
    """Each ``(method, other, a, b)`` as ``method - other`` over the samples both have (None: no sample in common);
    ``metric`` orients wins and losses."""
    diffs = [paired_differences(a, b) for _, _, a, b in pairs]
    tests = iter(flip.test([d for d in diffs if d]))
    out: list[Comparison | None] = []
    for (method, other, _, _), d in zip(pairs, diffs):
        if not d:
            out.append(None)
            continue
        result = next(tests)
        flat = np.array([x for task in d.values() for x in task.values()])
        better = flat > 0 if metric.higher_is_better else flat < 0
        worse = flat < 0 if metric.higher_is_better else flat > 0
        out.append(
            Comparison(
                method=method,
                other=other,
                difference=Estimate(
                    result.mean, result.low, result.high, result.samples, result.tasks, "sign-flip inversion"
                ),
                wins=int(better.sum()),
                ties=int((flat == 0).sum()),
                losses=int(worse.sum()),
                p=result.p,
                test=result.method,
                vectors=result.vectors,
            )
        )
    return out


def settle(comparisons: Sequence[Comparison], alpha: float = ALPHA) -> list[Comparison]:
    """One family of comparisons with their Holm-adjusted p and verdicts (``significant``: ``p_holm < alpha``)."""
    adjusted = holm([c.p for c in comparisons])
    return [replace(c, p_holm=p, significant=p < alpha) for c, p in zip(comparisons, adjusted)]


def analyse_metric(
    metric: Metric,
    values: Mapping[tuple[str, float], Samples],
    methods: Sequence[str],
    budgets: Sequence[float],
    bootstrap: Bootstrap,
    flip: SignFlip | None = None,
    family: str = DEFAULT_FAMILY,
) -> MetricStats:
    """Intervals, paired comparisons (each method against :data:`BASELINE` and the best other method; the full cache
    gets an interval only) and Holm-adjusted significance of one metric's ``values`` (:func:`collect`)."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    if flip is None:
        flip = SignFlip(seed=bootstrap.seed, confidence=bootstrap.confidence)
    present = [key for key, samples in values.items() if samples]
    estimates = dict(zip(present, bootstrap.estimates([values[key] for key in present])))
    targets: dict[float, dict[str, dict[str, str]]] = {}  # budget -> method -> kind -> other
    for budget in budgets:
        present = [m for m in methods if m != REFERENCE and (m, budget) in estimates]
        for method in present:
            others = [m for m in present if m != method]
            kinds = targets.setdefault(budget, {}).setdefault(method, {})
            if BASELINE in others:
                kinds["baseline"] = BASELINE
            if others:
                sign = 1.0 if metric.higher_is_better else -1.0
                kinds["best_other"] = max(others, key=lambda m: sign * estimates[m, budget].mean)
    forward: list[tuple[float, str, str]] = []  # each unordered pair once, in the direction first asked
    for budget, per_method in targets.items():
        for method, kinds in per_method.items():
            for other in kinds.values():
                if (budget, method, other) not in forward and (budget, other, method) not in forward:
                    forward.append((budget, method, other))
    pairs = [(m, o, values[m, b], values[o, b]) for b, m, o in forward]
    done = dict(zip(forward, compare(metric, pairs, flip)))

    def pair(budget: float, method: str, other: str) -> Comparison | None:
        """``method - other``; the reverse of a pair computed is that one negated (same test, same p)."""
        if (budget, method, other) in done:
            return done[budget, method, other]
        back = done[budget, other, method]
        if back is None:
            return None
        return replace(
            back,
            method=method,
            other=other,
            difference=_negated(back.difference),
            wins=back.losses,
            losses=back.wins,
        )

    result = MetricStats(metric, estimates, family=family)
    raw: dict[float, tuple[dict[str, dict[str, Comparison]], list[Comparison]]] = {}
    for budget in budgets:
        per_method: dict[str, dict[str, Comparison]] = {}
        unique: dict[frozenset[str], Comparison] = {}
        for method, kinds in targets.get(budget, {}).items():
            for kind, other in kinds.items():
                comparison = pair(budget, method, other)
                if comparison is not None:
                    per_method.setdefault(method, {})[kind] = comparison
        for kind in ("baseline", "best_other"):  # pairs with the baseline read "method vs snapkv"
            for kinds in per_method.values():
                if kind in kinds:
                    unique.setdefault(kinds[kind].pair, kinds[kind])
        raw[budget] = (per_method, list(unique.values()))
    families = [[b] for b in raw] if family == "budget" else [list(raw)]
    for members in families:
        keys = [(b, c.pair) for b in members for c in raw[b][1]]
        settled = dict(zip(keys, settle([c for b in members for c in raw[b][1]], 1.0 - flip.confidence)))
        for b in members:
            per_method, tests = raw[b]
            result.tests[b] = [settled[b, c.pair] for c in tests]
            result.versus[b] = {
                m: {
                    k: replace(c, p_holm=settled[b, c.pair].p_holm, significant=settled[b, c.pair].significant)
                    for k, c in kinds.items()
                }
                for m, kinds in per_method.items()
            }
    return result


def _negated(e: Estimate) -> Estimate:
    return replace(e, mean=-e.mean, low=-e.high, high=-e.low)


@dataclass(frozen=True)
class RunStats:
    """The statistics of one run: ``metrics`` in :data:`METRICS` order, ``skipped`` metric -> why, ``strata`` task ->
    samples (the most any configuration has), ``incomplete`` samples left out for lacking a configuration."""

    resamples: int
    seed: int
    confidence: float
    metrics: dict[str, MetricStats]
    skipped: dict[str, str]
    strata: dict[str, int]
    incomplete: int = 0
    draws: int = DEFAULT_DRAWS
    family: str = DEFAULT_FAMILY
    exact_max: int = EXACT_MAX


def analyse_run(
    rows: Sequence[Mapping[str, Any]],
    methods: Sequence[str],
    budgets: Sequence[float],
    metrics: Sequence[str] | None = None,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
    draws: int = DEFAULT_DRAWS,
    family: str = DEFAULT_FAMILY,
) -> RunStats:
    """Every requested metric's analysis (None: every metric the rows hold), on the samples that hold every
    configuration; ``methods`` in report order, ``full`` first."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    if metrics is not None:
        unknown = [m for m in metrics if m not in METRICS]
        if unknown:
            raise ValueError(f"unknown metric(s) {', '.join(unknown)}: choose from {', '.join(METRICS)}")
    bootstrap = Bootstrap(resamples=resamples, seed=seed, confidence=CONFIDENCE)
    flip = SignFlip(draws=draws, seed=seed, confidence=CONFIDENCE)
    configurations = [(m, FULL_BUDGET) if m == REFERENCE else (m, float(b)) for m in methods for b in budgets]
    rows, incomplete = complete_samples(rows, configurations)
    analysed: dict[str, MetricStats] = {}
    skipped: dict[str, str] = {}
    strata: dict[str, int] = {}
    for name, metric in METRICS.items():
        if metrics is not None and name not in metrics:
            continue
        values = collect(rows, metric, lambda row: str(row.get("task", "")))
        compressed = {key: v for key, v in values.items() if key[0] != REFERENCE}
        if not compressed:
            skipped[name] = (
                "only the full cache has values (compressed configurations were not scored)"
                if values
                else "no row has a value (not recorded by this run)"
            )
            continue
        analysed[name] = analyse_metric(metric, values, methods, budgets, bootstrap, flip=flip, family=family)
        for samples in values.values():
            for task, per_sample in samples.items():
                strata[task] = max(strata.get(task, 0), len(per_sample))
    return RunStats(resamples, seed, CONFIDENCE, analysed, skipped, strata, incomplete, draws, family, flip.exact_max)
