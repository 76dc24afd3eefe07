"""The significance of a comparison: the sign-flip test of the macro-mean difference, its interval, Holm.

No model needed. Each property test names the bug it was checked against (planted once in the code, seen to fail).
"""

from __future__ import annotations

import ast
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import wilcoxon

from ripplekv_eval.reporting.stats import (
    METRICS,
    Bootstrap,
    FlipTest,
    SignFlip,
    analyse_metric,
    collect,
    holm,
    paired_differences,
)

ROOT = Path(__file__).resolve().parents[1]
KL = METRICS["fidelity_kl"]
FAMILY = ("budget", "metric")


def _samples(values: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {task: {f"{task}/{i}": float(v) for i, v in enumerate(vs)} for task, vs in values.items()}


def _test(flip: SignFlip, differences: dict[str, dict[str, float]]) -> FlipTest:
    return flip.test([differences])[0]


def _compare(differences: dict[str, dict[str, float]]):  # noqa: ANN202 - a Comparison
    zero = {t: dict.fromkeys(v, 0.0) for t, v in differences.items()}
    values = {("x", 0.1): differences, ("snapkv", 0.1): zero}
    return analyse_metric(KL, values, ["x", "snapkv"], [0.1], Bootstrap(4000, seed=0)).versus[0.1]["x"]["baseline"]


# ------------------------------------------------------------------------------------- the test and its estimand


def test_exact_p_is_the_share_of_sign_vectors_whose_macro_mean_is_as_extreme() -> None:
    """Brute force: every sign vector, the macro mean recomputed task by task (strata of 3 and 9 prompts).

    Fails with the pooled mean as the statistic (each prompt weighted 1/n instead of 1/(K n_k)) and with one sign
    per task instead of one per prompt.
    """
    rng = np.random.default_rng(4)
    data = {"small": [2.0, 1.5, 2.5], "big": list(rng.normal(-0.3, 0.5, 9))}
    flat = [(task, v) for task, vs in data.items() for v in vs]
    observed = np.mean([np.mean(vs) for vs in data.values()])
    extreme = 0
    for signs in itertools.product((1.0, -1.0), repeat=len(flat)):
        flipped: dict[str, list[float]] = {task: [] for task in data}
        for s, (task, v) in zip(signs, flat):
            flipped[task].append(s * v)
        extreme += abs(np.mean([np.mean(vs) for vs in flipped.values()])) >= abs(observed) - 1e-12
    result = _test(SignFlip(), _samples(data))
    assert result.method == "exact" and result.vectors == 2**12
    assert result.p == pytest.approx(extreme / 2**12, abs=1e-12)
    assert result.mean == pytest.approx(observed)


def test_exact_enumeration_matches_monte_carlo() -> None:
    rng = np.random.default_rng(11)
    data = _samples({"a": list(rng.normal(0.25, 1.0, 9)), "b": list(rng.normal(0.1, 0.3, 5))})
    exact = _test(SignFlip(), data)
    sampled = _test(SignFlip(draws=19999, exact_max=0), data)
    assert (exact.method, sampled.method) == ("exact", "monte-carlo") and sampled.vectors == 20000
    assert 0.04 < exact.p < 0.06  # near alpha, where the two could disagree
    assert abs(sampled.p - exact.p) < 4 * math.sqrt(exact.p * (1 - exact.p) / 20000) + 1e-4
    width = exact.high - exact.low
    assert abs(sampled.low - exact.low) < 0.05 * width and abs(sampled.high - exact.high) < 0.05 * width


def test_monte_carlo_p_counts_the_observed_signs() -> None:
    """p = (1 + #as extreme) / (draws + 1): never 0. Fails without the +1 (p = #as extreme / draws)."""
    data = _samples({"t": list(np.linspace(1.0, 2.0, 40))})  # every flip moves the mean below the observed one
    result = _test(SignFlip(draws=999), data)
    assert result.p == 1 / 1000 and result.vectors == 1000


def test_p_is_uniform_under_the_null() -> None:
    """Symmetric differences (tasks of 4 to 20 prompts, unequal spreads): p is roughly uniform, exact or sampled
    (exact over 10 prompts: scipy enumerates the 2^n sign vectors in Python, 1,024 here)."""
    flip_mc, flip_exact = SignFlip(draws=999), SignFlip()
    sampled, exact = [], []
    for seed in range(300):
        rng = np.random.default_rng(seed)
        data = {"a": rng.normal(0, 1, 4), "b": rng.normal(0, 3, 20), "c": rng.laplace(0, 0.2, 9)}
        sampled.append(_test(flip_mc, _samples(data)).p)
        small = {"a": rng.normal(0, 1, 4), "b": rng.standard_t(3, 6)}
        exact.append(_test(flip_exact, _samples(small)).p)
    for ps in (np.array(sampled), np.array(exact)):
        assert 0.02 <= np.mean(ps <= 0.05) <= 0.09
        assert 0.42 <= np.mean(ps <= 0.5) <= 0.58
        assert 0.17 <= np.mean(ps <= 0.25) <= 0.33


# ------------------------------------------------------------------------------- the interval: the test inverted


@pytest.mark.parametrize("seed", range(6))
def test_the_interval_is_the_set_of_shifts_the_test_does_not_reject(seed: int) -> None:
    """p(delta) >= 0.05 inside the interval, < 0.05 just outside; raw p < 0.05 exactly when it excludes 0.

    Fails when the interval is not the test's (e.g. the percentile bootstrap of the difference).
    """
    rng = np.random.default_rng(seed)
    data = _samples({"a": list(rng.normal(0.4, 1.0, 25)), "b": list(rng.exponential(0.5, 7) - 0.2)})
    flip = SignFlip(draws=1999)
    result = _test(flip, data)
    assert (result.p < 0.05) == result.excludes_zero()
    assert result.low < result.mean < result.high
    width = result.high - result.low
    for end, outward in ((result.low, -1.0), (result.high, 1.0)):
        for step, rejected in ((-1e-6, False), (1e-6, True)):
            delta = end + outward * step * width
            shifted = {t: {s: v - delta for s, v in vs.items()} for t, vs in data.items()}
            assert (_test(flip, shifted).p < 0.05) == rejected


def test_few_prompts_cannot_be_rejected_and_give_the_whole_line() -> None:
    result = _test(SignFlip(), _samples({"t": [1.0, 1.1, 0.9, 1.2, 1.05]}))  # 2 of 32 sign vectors: p = 0.0625
    assert (result.p, result.low, result.high) == (0.0625, -math.inf, math.inf)
    result = _test(SignFlip(), _samples({"t": [1.0, 1.1, 0.9, 1.2, 1.05, 1.0]}))  # 2 of 64: p = 0.03125
    assert result.p == 0.03125 and 0 < result.low < result.mean < result.high


def test_ties_and_zero_differences() -> None:
    zero = _test(SignFlip(), _samples({"t": [0.0] * 30}))
    assert (zero.p, zero.low, zero.high, zero.mean) == (1.0, 0.0, 0.0, 0.0)
    ties = _test(SignFlip(), _samples({"t": [0.0] * 20 + [1.0, -1.0] * 3}))  # discrete differences, many ties
    assert ties.p == 1.0 and ties.low < 0 < ties.high


# ------------------------------------------------------------------------ the two old estimands that disagreed


def test_pooled_wilcoxon_significant_while_the_macro_mean_is_not() -> None:
    """One large task, a tiny consistent gain; five small tasks, large differences of either sign around 0.

    The pooled Wilcoxon test calls it (p ~ 1e-21); the verdict is the test of the macro mean and follows its interval.
    """
    rng = np.random.default_rng(0)
    data = {"big": list(0.01 + rng.uniform(0, 0.002, 200))}
    data |= {f"small{k}": list(rng.normal(-0.02, 1.0, 6)) for k in range(5)}
    differences = _samples(data)
    pooled = [v for vs in data.values() for v in vs]
    assert wilcoxon(pooled).pvalue < 1e-10
    c = _compare(differences)
    assert c.difference.low < 0 < c.difference.high and c.p > 0.5 and not c.significant


def test_macro_mean_significant_while_the_pooled_wilcoxon_is_not() -> None:
    """The reverse: small tasks with a large consistent gain, one large task of tiny mostly negative differences."""
    rng = np.random.default_rng(0)
    big = rng.uniform(0.001, 0.01, 200) * np.where(np.arange(200) < 140, -1.0, 1.0)
    data = {"big": list(big)} | {f"small{k}": list(0.5 + rng.normal(0, 0.1, 6)) for k in range(5)}
    differences = _samples(data)
    assert wilcoxon([v for vs in data.values() for v in vs]).pvalue > 0.3
    c = _compare(differences)
    assert c.significant and c.difference.low > 0.3 and c.p == 1 / 20000
    mean = np.mean([np.mean(vs) for vs in data.values()])
    assert c.difference.mean == pytest.approx(mean) and c.difference.low < mean < c.difference.high


# --------------------------------------------------------------------------------------------------------- Holm


def test_holm_never_lowers_a_p_and_keeps_their_order() -> None:
    """Fails without the cumulative maximum (the adjusted p of a larger raw p can fall below a smaller one's)."""
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.01, 0.011, 0.5]) == pytest.approx([0.03, 0.03, 0.5])  # 2 x 0.011 = 0.022 < 0.03: the max holds
    rng = np.random.default_rng(0)
    for _ in range(500):
        m = int(rng.integers(1, 12))
        p = list(rng.uniform(0, 1, m) ** rng.uniform(1, 6))
        adjusted = holm(p)
        assert all(a >= q for a, q in zip(adjusted, p))
        assert all(a <= min(1.0, m * q) + 1e-15 for a, q in zip(adjusted, p))  # at most Bonferroni
        order = np.argsort(p, kind="stable")
        assert all(adjusted[i] <= adjusted[j] for i, j in zip(order, order[1:]))


def test_family_across_budgets_adjusts_over_every_budget() -> None:
    rng = np.random.default_rng(2)
    values = {
        (m, b): _samples({"t": list(rng.normal(shift, 1.0, 30)), "u": list(rng.normal(shift, 1.0, 30))})
        for m, shift in (("snapkv", 0.0), ("x", 0.5), ("y", 0.2))
        for b in (0.1, 0.2)
    }
    by = {f: analyse_metric(KL, values, ["x", "y", "snapkv"], [0.1, 0.2], Bootstrap(), family=f) for f in FAMILY}
    per_budget, per_metric = by["budget"], by["metric"]
    everything = [c for b in (0.1, 0.2) for c in per_metric.tests[b]]
    assert len(everything) == sum(len(per_budget.tests[b]) for b in (0.1, 0.2)) >= 4
    assert [c.p_holm for c in everything] == holm([c.p for c in everything])
    for b in (0.1, 0.2):
        tests = per_budget.tests[b]
        assert [c.p_holm for c in tests] == holm([c.p for c in tests])
        assert all(w.p_holm >= n.p_holm for w, n in zip(per_metric.tests[b], tests))
        for c in tests:
            assert c.significant == (c.p_holm < 0.05) and (not c.significant or c.difference.excludes_zero())
    with pytest.raises(ValueError, match="family"):
        analyse_metric(KL, values, ["x", "snapkv"], [0.1], Bootstrap(), family="run")


# --------------------------------------------------------------------------------------- seeds, checks, imports


def test_sign_vectors_are_seeded_by_the_seed_and_the_prompts() -> None:
    """Fails when the generator ignores the seed or the prompts' ids (every comparison then shares one draw)."""
    data = _samples({"t": list(np.random.default_rng(0).normal(0.3, 1.0, 30))})
    renamed = {"u": dict(zip((f"u/{i}" for i in range(30)), data["t"].values()))}
    first = _test(SignFlip(draws=999, seed=3), data)
    assert first == _test(SignFlip(draws=999, seed=3), data)
    assert first != _test(SignFlip(draws=999, seed=4), data)
    assert first != _test(SignFlip(draws=999, seed=3), renamed)
    for bad in ({"draws": 10}, {"seed": -1}, {"confidence": 1.0}, {"exact_max": 30}, {"draws": 999.0}):
        with pytest.raises(ValueError, match="draws|seed|confidence|exact_max"):
            SignFlip(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no paired differences"):
        _test(SignFlip(), {"t": {}})
    with pytest.raises(ValueError, match="finite"):
        _test(SignFlip(), {"t": {"a": math.nan}})


def test_monte_carlo_reproduces_the_committed_reports() -> None:
    """The random sign vectors are the committed engine's (its seeded generator, 8 prompts a byte), so a committed
    report's Monte Carlo p and interval come back bit for bit.

    Fails with other vectors (scipy's ``permutation_test`` draws, another packing or seed) or another p (scipy's
    twice the smaller one-sided p).
    """
    run = ROOT / "benchmarks" / "results" / "longbench-fidelity"
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    committed = json.loads((run / "report.json").read_text())["statistics"]["metrics"]["gold_nll_delta"]
    values = collect(rows, METRICS["gold_nll_delta"], lambda row: row["task"])
    cases = [c for c in committed["comparisons"] if c["budget"] == 0.3]
    results = SignFlip().test([paired_differences(values[c["method"], 0.3], values[c["other"], 0.3]) for c in cases])
    assert len(cases) >= 6 and {c["test"] for c in cases} == {"monte-carlo"}
    for case, result in zip(cases, results):
        assert (result.p, result.low, result.high, result.mean) == (
            case["p"],
            case["difference"]["low"],
            case["difference"]["high"],
            case["difference"]["mean"],
        )


@pytest.mark.parametrize("exact_max", [0, 16])
def test_a_difference_zero_but_for_rounding_ties_every_vector_as_the_committed_engine_did(exact_max: int) -> None:
    """Differences that cancel (0.1 + 0.2 - 0.3) leave a macro mean of rounding noise, as extreme as every sign
    vector's: p = 1 (the committed oracle-fidelity report's top-1 comparisons). Seeded bug caught: scipy's own
    tolerance (relative to ``|T|``) instead of ties within 1e-9 of ``sum |w d|``, which gives p < 1."""
    data = _samples({"t": [0.1, 0.2, -0.3] * 5})
    result = _test(SignFlip(draws=999, exact_max=exact_max), data)
    assert result.method == ("exact" if exact_max else "monte-carlo")
    assert abs(result.mean) < 1e-15 and result.p == 1.0


def test_exact_enumeration_is_scipys_and_matches_a_brute_force_count() -> None:
    """Up to ``exact_max`` prompts every sign vector counts once: p and the interval's ends from a brute-force
    enumeration (ties included), with and without ties in the data.

    Fails when the enumeration misses or repeats vectors, or scipy's draws replace it.
    """
    rng = np.random.default_rng(4)
    for n_a, n_b, decimals in ((7, 6, 1), (9, 7, 6), (3, 2, 0)):
        data = _samples({"a": list(np.round(rng.normal(0.3, 1.0, n_a), decimals)), "b": list(rng.normal(0, 1, n_b))})
        keys = [(t, s) for t in sorted(data) for s in sorted(data[t])]
        d = np.array([data[t][s] for t, s in keys])
        w = np.array([1.0 / (2 * len(data[t])) for t, _ in keys])
        signs = 1 - 2 * ((np.arange(2 ** len(d))[:, None] >> np.arange(len(d))) & 1)
        tsum = (signs * w) @ d
        tol = 1e-9 * float(np.abs(w * d).sum())
        result = _test(SignFlip(), data)
        assert result.method == "exact" and result.vectors == 2 ** len(d)
        assert result.p == np.count_nonzero(np.abs(tsum) >= abs(float(w @ d)) - tol) / 2 ** len(d)
        if math.isfinite(result.low):
            for end, outward in ((result.low, -1.0), (result.high, 1.0)):
                for step, rejected in ((-1e-7, False), (1e-7, True)):
                    delta = end + outward * step * (result.high - result.low)
                    shifted = (signs * w) @ (d - delta)
                    share = np.count_nonzero(np.abs(shifted) >= abs(float(w @ (d - delta))) - tol) / 2 ** len(d)
                    assert (share < 0.05) == rejected


ALLOWED = {
    "__future__",
    "math",
    "zlib",
    "collections",
    "dataclasses",
    "functools",
    "typing",
    "numpy",
    "scipy",
    "ripplekv",
    "ripplekv_eval",
}


def test_the_statistics_module_imports_no_torch() -> None:
    """Only numpy, scipy and the standard library; of ripplekv_eval, the results log and the rows' naming rule of
    :mod:`ripplekv_eval.sample`, of ripplekv the integer check of its leaf :mod:`ripplekv.validation` (numpy only;
    ``test_imports`` checks that importing them loads no torch)."""
    tree = ast.parse((ROOT / "src" / "ripplekv_eval" / "reporting" / "stats.py").read_text())
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert {name.split(".")[0] for name in imported} <= ALLOWED
    own = {"ripplekv_eval.running.results", "ripplekv_eval.sample", "ripplekv.validation"}
    assert {name for name in imported if name.startswith("ripplekv")} <= own
