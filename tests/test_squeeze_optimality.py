"""benchmarks/squeeze_optimality.py: SqueezeAttention rows checked against the brute-force 3-means split."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from benchmarks.squeeze_optimality import main, method_clusters, optimal_tops, squeezed_layers
from ripplekv.allocation.squeezeattention import SqueezeAttentionRule

# 0, 0.3, 0.5, 0.6: the optimum is {0}, {0.3}, {0.5, 0.6} (sum of squares 0.005), so layers 2 and 3 are squeezed;
# Lloyd from the sorted start stopped at {0, 0.3}, {0.5}, {0.6} (0.045) and squeezed layer 3 alone, whose best
# split, {0}, {0.3, 0.5}, {0.6}, has 0.02.
SIMILARITIES = [0.0, 0.3, 0.5, 0.6]
EXACT_KEPT = list(
    SqueezeAttentionRule(p=0.5).layer_budgets(4, 100, 0, stats=[(s,) for s in SIMILARITIES], total=120, window_size=0)
)
LLOYD_KEPT = [35, 35, 35, 15]


def row(sample: str, method: str, kept: list[int], stats: list[float] | None, scorer: str = "snapkv") -> dict:
    out: dict = {"sample_id": sample, "method": method, "scorer": scorer, "budget": 0.3, "kept_tokens": kept}
    if stats is not None:
        out["layer_statistics"] = [[s] for s in stats]
    return out


def write(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_the_rule_squeezes_the_two_highest_layers_here() -> None:
    assert EXACT_KEPT == [45, 45, 15, 15]


def test_squeezed_layers_are_those_below_the_one_gap() -> None:
    assert squeezed_layers([458, 459, 4126, 458]) == frozenset({0, 1, 3})
    assert squeezed_layers([10, 12, 12]) == frozenset({0})
    assert squeezed_layers([21, 20, 20, 21]) is None  # within one token: no visible split
    assert squeezed_layers([10, 11, 12]) is None  # {10} | {11, 12} or {10, 11} | {12}: no gap of 2 tells which
    with pytest.raises(ValueError, match="more than two budget levels"):
        squeezed_layers([5, 9, 20])


def test_method_names_with_parameters() -> None:
    assert method_clusters("squeezeattention") == 3
    assert method_clusters("squeezeattention:p=0.5") == 3
    assert method_clusters("squeezeattention:p=0.5,n_clusters=2") == 2
    assert method_clusters("cake") is None
    assert method_clusters("squeezeattention-local") is None


def test_optimal_tops_keep_every_tied_highest_cluster() -> None:
    # 0, 1, 2, 18, 19, 20: four splits of sum 2.5, with highest clusters {18, 19, 20}, {19, 20} and {20}
    optimum, by_top = optimal_tops([0.0, 1.0, 2.0, 18.0, 19.0, 20.0], 3)
    assert optimum == Fraction(5, 2)
    assert {top for top, value in by_top.items() if value == optimum} == {
        frozenset({3, 4, 5}),
        frozenset({4, 5}),
        frozenset({5}),
    }
    assert by_top[frozenset({2, 3, 4, 5})] == Fraction(875, 4)  # {0}, {1}, {2, 18, 19, 20}: 12.75^2 + 3.25^2 + ...


def test_a_run_with_a_lloyd_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        row("vt/0", "squeezeattention", EXACT_KEPT, SIMILARITIES),
        row("vt/0", "squeezeattention:p=0.5", EXACT_KEPT, SIMILARITIES, scorer="tova"),
        row("vt/1", "squeezeattention", LLOYD_KEPT, SIMILARITIES),
        row("vt/2", "squeezeattention", [30, 30, 30, 30], SIMILARITIES),  # uniform: no visible split
        row("vt/3", "squeezeattention", EXACT_KEPT, None),  # written before the statistics
        row("vt/0", "cake", LLOYD_KEPT, SIMILARITIES),  # not SqueezeAttention: not read
    ]
    run = write(tmp_path / "run", rows)
    assert main([str(run)]) == 1
    out = capsys.readouterr().out
    assert (
        f"{run}: 5 squeezeattention rows; checked 3 rows of 2 prompts; not optimal 1; without statistics 1; "
        "without a visible split 1"
    ) in out
    assert (
        "not optimal: vt/1 squeezeattention snapkv 30%: squeezed [3] (at best 0.02); optimum 0.005 squeezes [2, 3]"
        in out
    )
    assert out.count("not optimal: ") == 1


def test_runs_of_optimal_rows_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path / "good", [row("vt/0", "squeezeattention", EXACT_KEPT, SIMILARITIES)])
    old = write(tmp_path / "old", [row("vt/0", "squeezeattention", LLOYD_KEPT, None)])  # no statistics: unchecked
    assert main([str(good), str(old)]) == 0
    out = capsys.readouterr().out
    assert f"{good}: 1 squeezeattention rows; checked 1 rows of 1 prompts; not optimal 0;" in out
    assert f"{old}: 1 squeezeattention rows; checked 0 rows of 0 prompts; not optimal 0; without statistics 1;" in out


def test_a_row_squeezing_layers_that_no_split_into_runs_tops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write(tmp_path / "run", [row("vt/0", "squeezeattention", [15, 45, 45, 15], SIMILARITIES)])
    assert main([str(run)]) == 1
    assert "squeezed [0, 3] (not a top run of the sorted values)" in capsys.readouterr().out


def test_fewer_distinct_values_than_clusters_take_fewer_clusters() -> None:
    # 0.1, 0.9, 0.9 make two clusters (equal values are never cut apart): only {0.9, 0.9} can be on top
    optimum, by_top = optimal_tops([0.1, 0.9, 0.9], 3)
    assert optimum == 0
    assert {top for top, value in by_top.items() if value == optimum} == {frozenset({1, 2})}


def test_a_tied_optimum_is_named_with_its_alternatives(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 0, 1, 2, 18, 19, 20: three optimal highest clusters (test_optimal_tops_keep_every_tied_highest_cluster); a row
    # squeezing 2, 18, 19, 20 is at best 218.75
    values = [0.0, 1.0, 2.0, 18.0, 19.0, 20.0]
    run = write(tmp_path / "run", [row("vt/0", "squeezeattention", [40, 40, 10, 10, 10, 10], values)])
    assert main([str(run)]) == 1
    out = capsys.readouterr().out
    assert "squeezed [2, 3, 4, 5] (at best 218.75); optimum 2.5 squeezes [3, 4, 5] (or 2 more)" in out


def test_a_rule_split_off_the_optimum_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check of what the rule computes now, with the old Lloyd grouping standing in for ``squeeze_groups``."""
    import benchmarks.squeeze_optimality as script

    monkeypatch.setattr(script, "squeeze_groups", lambda values, n_clusters: (False, False, False, True))
    problems, checked = script.row_problems(SIMILARITIES, EXACT_KEPT, 3)
    assert problems == ["squeeze_groups squeezes [3], the optimum [2, 3]"]
    assert checked is True
