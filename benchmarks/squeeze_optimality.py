"""Whether every SqueezeAttention row squeezed the top cluster of a least-squares 3-means split of its statistics.

SqueezeAttention (:mod:`ripplekv.allocation.squeezeattention`) clusters a prompt's layer similarities into 3 groups
and squeezes the highest. For every ``squeezeattention`` row of each run folder (the method name may carry
parameters after a colon, ``squeezeattention:p=0.5``; ``n_clusters=K`` among them changes the cluster count) that
has a ``layer_statistics`` field (one ``[similarity]`` per compressed layer) this

* enumerates every split of the sorted similarities into runs, with exact rational sums of squares (brute force,
  independent of :func:`~ripplekv.allocation.squeezeattention.kmeans_1d`), and keeps the highest clusters of the
  optimal ones (several where splits tie);
* reads the squeezed layers off ``kept_tokens``: SqueezeAttention gives two budget levels, each within one token
  (largest-remainder rounding), so the layers below the one gap of two tokens or more are the squeezed ones; a row
  without such a gap (a uniform row, or levels a token apart) shows no split and is counted apart;
* checks that those layers are the highest cluster of an optimal split, and that ``squeeze_groups`` (what the
  rule computes now) is one too.

Prints per run: rows checked, prompts checked, rows not optimal (listed, with the least sum of squares of a split
with their squeezed layers on top, and the optimum), rows without statistics, rows without a visible split. Exits
with status 1 if any row is not optimal.

    python benchmarks/squeeze_optimality.py benchmarks/results/allocators-ruler-4k [RUN_DIR ...]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from ripplekv.allocation.squeezeattention import squeeze_groups
from ripplekv_eval.running.results import ResultsLog
from ripplekv_eval.sample import row_scorer, scored_methods

METHOD = "squeezeattention"
DEFAULT_CLUSTERS = 3


def method_clusters(method: str) -> int | None:
    """The cluster count of a SqueezeAttention method name (``n_clusters=K`` after the colon, else 3); None if the
    name is not SqueezeAttention's."""
    name, _, parameters = method.partition(":")
    if name != METHOD:
        return None
    for item in parameters.split(","):
        key, _, value = item.partition("=")
        if key.strip() == "n_clusters":
            return int(value)
    return DEFAULT_CLUSTERS


def similarities(row: Mapping[str, Any]) -> list[float] | None:
    """The row's per-layer similarities (``layer_statistics``, each ``[similarity]``), None where it has none."""
    stats = row.get("layer_statistics")
    if stats is None:
        return None
    if any(len(entry) != 1 for entry in stats):
        raise ValueError(f"row {row.get('sample_id')}: a SqueezeAttention statistic is [similarity], got {stats!r}")
    return [float(entry[0]) for entry in stats]


def optimal_tops(values: Sequence[float], n_clusters: int) -> tuple[Fraction, dict[frozenset[int], Fraction]]:
    """Brute force: the least total within-cluster sum of squares over every split of the sorted ``values`` into
    ``min(n_clusters, distinct values)`` runs, and per possible highest cluster (a set of layer indices) the least
    sum of the splits with that highest cluster."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    exact = [Fraction(values[i]) for i in order]
    sums, squares = [Fraction(0)], [Fraction(0)]
    for x in exact:
        sums.append(sums[-1] + x)
        squares.append(squares[-1] + x * x)

    def cost(lo: int, hi: int) -> Fraction:
        total = sums[hi] - sums[lo]
        return squares[hi] - squares[lo] - total * total / (hi - lo)

    k = min(n_clusters, len(set(values)))
    by_top: dict[frozenset[int], Fraction] = {}
    n = len(values)
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        objective = sum((cost(a, b) for a, b in itertools.pairwise(bounds)), Fraction(0))
        top = frozenset(order[bounds[-2] :]) if k > 1 else frozenset()
        by_top[top] = min(objective, by_top.get(top, objective))
    return min(by_top.values()), by_top


def squeezed_layers(kept: Sequence[int]) -> frozenset[int] | None:
    """The layers at the lower of the row's two budget levels; None where no two layers differ by 2 tokens or more.

    Raises:
        ValueError: on more than two levels (two gaps of 2 tokens or more), which SqueezeAttention never gives.
    """
    levels = sorted(set(kept))
    gaps = [low for low, high in itertools.pairwise(levels) if high - low >= 2]
    if not gaps:
        return None
    if len(gaps) > 1:
        raise ValueError(f"kept_tokens {list(kept)} has more than two budget levels")
    return frozenset(i for i, k in enumerate(kept) if k <= gaps[0])


@dataclass
class RunCheck:
    """What one run folder's check found."""

    rows: int = 0
    checked: int = 0
    prompts: set[str] = field(default_factory=set)
    without_statistics: int = 0
    without_split: int = 0
    not_optimal: list[str] = field(default_factory=list)


def describe(top: frozenset[int]) -> str:
    return "[" + ", ".join(str(i) for i in sorted(top)) + "]"


def row_problems(values: Sequence[float], kept: Sequence[int], n_clusters: int) -> tuple[list[str], bool | None]:
    """What is wrong with one row (empty if nothing), and whether its squeezed layers were checked (None: its
    kept_tokens show no split)."""
    if len(values) != len(kept):
        return [f"{len(values)} statistics for {len(kept)} layers of kept_tokens"], False
    optimum, by_top = optimal_tops(values, n_clusters)
    best = sorted(describe(t) for t, v in by_top.items() if v == optimum)
    either = best[0] + (f" (or {len(best) - 1} more)" if len(best) > 1 else "")
    problems = []
    recomputed = frozenset(i for i, flag in enumerate(squeeze_groups(values, n_clusters)) if flag)
    if by_top.get(recomputed) != optimum:
        problems.append(f"squeeze_groups squeezes {describe(recomputed)}, the optimum {either}")
    try:
        observed = squeezed_layers(kept)
    except ValueError as error:
        return [*problems, str(error)], False
    if observed is None:
        return problems, None
    objective = by_top.get(observed)
    if objective != optimum:
        value = "not a top run of the sorted values" if objective is None else f"at best {float(objective):.6g}"
        problems.append(f"squeezed {describe(observed)} ({value}); optimum {float(optimum):.6g} squeezes {either}")
    return problems, True


def check_run(run: Path) -> RunCheck:
    """Check every SqueezeAttention row of ``run/results.jsonl``."""
    rows = ResultsLog(run / "results.jsonl").read()
    scored = scored_methods(rows)
    result = RunCheck()
    for row in rows:
        n_clusters = method_clusters(str(row["method"]))
        if n_clusters is None:
            continue
        result.rows += 1
        values = similarities(row)
        if values is None:
            result.without_statistics += 1
            continue
        problems, checked = row_problems(values, row["kept_tokens"], n_clusters)
        if checked:
            result.checked += 1
            result.prompts.add(str(row["sample_id"]))
        elif checked is None:
            result.without_split += 1
        if problems:
            label = f"{row['sample_id']} {row['method']} {row_scorer(row, scored)} {100 * float(row['budget']):g}%"
            result.not_optimal.append(f"{label}: " + "; ".join(problems))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="evaluation folders (each with a results.jsonl)")
    args = parser.parse_args(argv)
    failed = False
    for run in args.runs:
        result = check_run(run)
        print(
            f"{run}: {result.rows} {METHOD} rows; checked {result.checked} rows of {len(result.prompts)} prompts; "
            f"not optimal {len(result.not_optimal)}; without statistics {result.without_statistics}; "
            f"without a visible split {result.without_split}"
        )
        for line in result.not_optimal:
            print(f"  not optimal: {line}")
        failed = failed or bool(result.not_optimal)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
