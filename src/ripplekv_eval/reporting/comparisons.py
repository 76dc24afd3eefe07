"""Paired comparisons of ``ripplekv report`` and ``ripplekv tune``: differences of two configurations, one test each,
Holm.

- **Paired difference** of method A and method B: per sample ``A - B`` over the samples both have; its estimate is
  the macro mean of the differences (:mod:`~ripplekv_eval.reporting.stats`). Wins / ties / losses count the
  samples where A is better / equal / worse by the metric's direction.
- **Test and interval of a difference** (:mod:`~ripplekv_eval.reporting.significance`): the stratified sign-flip
  permutation test of that macro mean and the interval that inverts it, so the raw p is below ``ALPHA`` exactly
  when the interval excludes 0.
- **Multiplicity** (:func:`settle`): Holm's step-down adjustment over a family (``FAMILIES``; default ``budget``:
  the distinct comparisons, unordered pairs, of one budget and metric; ``metric``: those of one metric over all its
  budgets). A difference is *significant* when its Holm-adjusted p is below ``ALPHA`` -- and then its interval
  excludes 0. An interval that excludes 0 with a Holm p >= ``ALPHA`` is a raw result that does not survive the family.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ripplekv_eval.reporting.significance import DEFAULT_FAMILY, FAMILIES, SignFlip, holm
from ripplekv_eval.reporting.stats import ALPHA, Bootstrap, Estimate, Metric, Samples

__all__ = [
    "BASELINE",
    "REFERENCE",
    "Comparison",
    "MetricStats",
    "analyse_metric",
    "compare",
    "paired_differences",
    "settle",
]

BASELINE = "snapkv"
REFERENCE = "full"
TIE_TOLERANCE = 1e-12  # relative: differences this small are ties (exact zeros)


def paired_differences(a: Samples, b: Samples) -> Samples:
    """Per task, ``a - b`` over the samples present in both (differences within rounding noise are exact 0).

    Args:
        a: task -> sample id -> value of the first method.
        b: the same for the method it is compared with.
    """
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
    """``method`` against ``other`` at one budget: the paired difference ``method - other`` and its test.

    ``difference``: the macro mean of the differences with the interval inverting the sign-flip test (``method``
    ``sign-flip inversion``). ``p``: the raw
    sign-flip p; ``test``: ``exact`` or ``monte-carlo``; ``vectors``: sign vectors used. ``p_holm`` and
    ``significant`` (``p_holm < ALPHA``) are set by :func:`settle` over the comparison's family.
    """

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
    """Everything the report prints for one metric.

    ``estimates``: (method, budget) -> macro mean and interval (``full`` at its own budget). ``versus``: budget ->
    method -> ``{"baseline": Comparison, "best_other": Comparison}`` (either absent when there is nothing to compare
    with). ``tests``: budget -> the distinct comparisons (unordered pairs) of that budget: every method against the
    baseline, then the best-other comparisons not already among them. ``family``: what Holm adjusts over
    (:data:`FAMILIES`).
    """

    metric: Metric
    estimates: dict[tuple[str, float], Estimate]
    versus: dict[float, dict[str, dict[str, Comparison]]] = field(default_factory=dict)
    tests: dict[float, list[Comparison]] = field(default_factory=dict)
    family: str = DEFAULT_FAMILY


def compare(
    metric: Metric, pairs: Sequence[tuple[str, str, Samples, Samples]], flip: SignFlip
) -> list[Comparison | None]:
    """Each ``(method, other, a, b)``: ``method - other`` over the samples both have: estimate, inverted interval,
    raw p, W/T/L (None: no sample in common). The tests run together (:meth:`SignFlip.test`).

    Args:
        metric: orients wins and losses.
        pairs: the first method's name, the other's, the first method's samples, the other's.
        flip: the sign-flip test (draws, seed, level).
    """
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
    """The family ``comparisons`` with their Holm-adjusted p and verdicts (``significant``: ``p_holm < alpha``).

    Args:
        comparisons: one family of distinct comparisons.
        alpha: the family's level.
    """
    adjusted = holm([c.p for c in comparisons])
    return [replace(c, p_holm=p, significant=p < alpha) for c, p in zip(comparisons, adjusted)]


def analyse_metric(
    metric: Metric,
    values: Mapping[tuple[str, float], Samples],
    methods: Sequence[str],
    budgets: Sequence[float],
    bootstrap: Bootstrap,
    baseline: str = BASELINE,
    reference: str = REFERENCE,
    flip: SignFlip | None = None,
    family: str = DEFAULT_FAMILY,
) -> MetricStats:
    """Intervals, paired comparisons and Holm-adjusted significance of one metric.

    Args:
        metric: the metric (its direction picks the best other method and orients wins and losses).
        values: (method, budget) -> samples, as :func:`collect` returns them.
        methods: method names in report order; ``reference`` (the full cache) gets an interval but is never
            compared.
        budgets: the compression budgets compared.
        bootstrap: the resampler of the means' intervals (its seed and resample count).
        baseline: the method every other method is compared with (SnapKV).
        reference: the uncompressed method, excluded from comparisons.
        flip: the sign-flip test of the differences (default: ``SignFlip(seed=bootstrap.seed)`` at the bootstrap's
            level).
        family: Holm's family, one of :data:`FAMILIES` (default ``budget``).
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    if flip is None:
        flip = SignFlip(seed=bootstrap.seed, confidence=bootstrap.confidence)
    present = [key for key, samples in values.items() if samples]
    estimates = dict(zip(present, bootstrap.estimates([values[key] for key in present])))
    targets: dict[float, dict[str, dict[str, str]]] = {}  # budget -> method -> kind -> other
    for budget in budgets:
        present = [m for m in methods if m != reference and (m, budget) in estimates]
        for method in present:
            others = [m for m in present if m != method]
            kinds = targets.setdefault(budget, {}).setdefault(method, {})
            if baseline in others:
                kinds["baseline"] = baseline
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
                m: {k: _settled(c, settled[b, c.pair]) for k, c in kinds.items()} for m, kinds in per_method.items()
            }
    return result


def _negated(e: Estimate) -> Estimate:
    return replace(e, mean=-e.mean, low=-e.high, high=-e.low)


def _settled(c: Comparison, family_member: Comparison) -> Comparison:
    """``c`` (either direction of a pair) with the Holm p and verdict of its pair's family member."""
    return replace(c, p_holm=family_member.p_holm, significant=family_member.significant)
