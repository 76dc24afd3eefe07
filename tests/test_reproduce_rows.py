"""benchmarks/reproduce_rows.py: what the reference run is left to compute, and how the verdict counts."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.reproduce_rows import (
    Key,
    by_sample,
    collect,
    compare,
    relative_error,
    replace_option,
    row_key,
    seed_rows,
)

RUN = "some-run"


def row(sample: str, method: str, budget: float, kl: float, **extra: object) -> dict[str, object]:
    return {
        "sample_id": sample,
        "task": "t",
        "method": method,
        "scorer": None,
        "budget": budget,
        "fidelity_kl": kl,
        **extra,
    }


def test_seed_rows_leave_only_the_pending_rows_and_keep_the_full_answers() -> None:
    rows = [
        row("a", "full", 1.0, 0.0, answer_ids=[5, 6]),
        row("a", "snapkv", 0.1, 0.5),
        row("a", "snapkv", 0.2, 0.4),
        row("b", "full", 1.0, 0.0, answer_ids=[7]),
        row("b", "snapkv", 0.1, 0.3),
    ]
    pending = {row_key(RUN, rows[2])}
    seeded = seed_rows(RUN, rows, pending)
    assert {row_key(RUN, r) for r in seeded} == {row_key(RUN, r) for r in rows} - pending
    assert [r.get("answer_ids") for r in seeded if r["method"] == "full"] == [[5, 6], [7]]
    assert all("fidelity_kl" not in r for r in seeded)  # a placeholder: the reference run's value cannot leak in


def test_by_sample_groups_every_row_of_a_sample_together() -> None:
    rows = [row("a", "snapkv", 0.1, 0.5), row("b", "snapkv", 0.1, 0.3), row("a", "pyramidkv", 0.2, 0.4)]
    assert {s: [r["method"] for r in group] for s, group in by_sample(rows).items()} == {
        "a": ["snapkv", "pyramidkv"],
        "b": ["snapkv"],
    }


def test_compare_fails_a_row_over_the_tolerance_and_counts_missing_ones() -> None:
    keys = [(RUN, "a", "snapkv", 0.1), (RUN, "a", "snapkv", 0.2), (RUN, "b", "snapkv", 0.1)]
    committed = dict(zip(keys, [1.0, 2.0, 3.0]))
    current = {keys[0]: 1.0 + 2e-6, keys[1]: 2.0 * (1 + 5e-7)}
    reference = {keys[0]: 1.0, keys[1]: 2.0, keys[2]: 3.0}
    verdict = compare(keys, committed, current, reference, tolerance=1e-6)
    assert (verdict.failed, verdict.missing, len(verdict.against), len(verdict.committed)) == (1, 1, 2, 2)
    assert "FAIL" in verdict.lines[0] and "FAIL" not in verdict.lines[1] and "MISSING" in verdict.lines[2]
    assert verdict.against[0] == relative_error(1.0, 1.0 + 2e-6)


def test_compare_passes_identical_values_whatever_the_committed_ones() -> None:
    keys = [(RUN, "a", "snapkv", 0.1)]
    verdict = compare(keys, {keys[0]: 1.1}, {keys[0]: 1.0}, {keys[0]: 1.0}, tolerance=1e-6)
    assert (verdict.failed, verdict.missing, verdict.against) == (0, 0, [0.0])
    assert verdict.committed[0] > 1e-6


def test_replace_option_replaces_both_spellings_and_nothing_else() -> None:
    argv = ["eval", "--data-dir", "x", "--out", "o", "--data-dir=y"]
    assert replace_option(argv, "--data-dir", "z") == ["eval", "--data-dir", "z", "--out", "o", "--data-dir=z"]


def test_collect_takes_the_computed_pending_rows_once_and_never_a_placeholder(tmp_path: Path) -> None:
    rows = [row("a", "snapkv", 0.1, 0.5), row("a", "snapkv", 0.2, 0.4), row("b", "snapkv", 0.1, 0.3)]
    pending = {row_key(RUN, r) for r in rows[:2]}
    with (tmp_path / "results.jsonl").open("w") as handle:  # an earlier work folder: rows[0] was pending there
        for line in [*seed_rows(RUN, rows, {row_key(RUN, rows[0])}), rows[0]]:
            handle.write(json.dumps(line) + "\n")
    known: set[Key] = set()
    assert collect(tmp_path, RUN, pending, known) == [rows[0]]
    assert known == {row_key(RUN, rows[0])} and collect(tmp_path, RUN, pending, known) == []
