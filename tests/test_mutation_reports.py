"""Relations that kill mutants of issue 26's reports modules left alive by its first mutation round.

``ripplekv report``'s statistics and tables (``by_scorer.py``, ``tables.py``, ``run_stats.py``) and a run folder's
bookkeeping (``running/results.py``, ``config.json``), on small synthetic rows. Each test names the
seeded bug it was checked to catch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tqdm

from ripplekv_eval.reporting.report import (
    _p,
    analyse_by_scorer,
    budget_label,
    markdown_sections,
    markdown_significance,
    primary_method,
    row_scorers,
    verdict_lines,
)
from ripplekv_eval.reporting.stats import RunStats, analyse_run
from ripplekv_eval.running.results import (
    CONFIG_FORMAT,
    ConfigMismatchError,
    ResultsLog,
    check_or_write_config,
    complete_samples,
    extends,
    open_results,
    run_pending,
    sha256_json,
)
from ripplekv_eval.sample import FULL_BUDGET

RESAMPLES, DRAWS = 2000, 999  # the smallest the statistics accept (8 prompts: the sign-flip test is exact)
BUDGETS = [0.1, 0.3]
SPEC = "ripplekv:r=16,gamma=12"  # RippleKV under its parameters: its verdict line must find it by this name
METHODS = ["full", "snapkv", "pyramidkv", SPEC]
FACTORS = {"snapkv": 1.0, "pyramidkv": 1.2, SPEC: 0.7}


def _row(sample: str, task: str, method: str, budget: float, kl: float | None, **more: Any) -> dict[str, Any]:
    """A result row with the fields the statistics read."""
    return {"sample_id": sample, "task": task, "method": method, "budget": budget, "fidelity_kl": kl, **more}


def _rows(unscored_at: float | None = None) -> list[dict[str, Any]]:
    """2 tasks x 4 prompts of every configuration of :data:`METHODS`; at budget ``unscored_at`` only SnapKV has a KL
    (so that budget has one compressed method, nothing to compare)."""
    rng = np.random.default_rng(0)
    rows = []
    for t in range(2):
        for i in range(4):
            sample, task = f"t{t}/{i}", f"t{t}"
            rows.append(_row(sample, task, "full", FULL_BUDGET, float(rng.uniform(0.0, 0.01))))
            for budget in BUDGETS:
                base = float(rng.lognormal(-1.0, 0.3)) * (0.1 / budget)
                for method, factor in FACTORS.items():
                    kl = None if budget == unscored_at and method != "snapkv" else base * factor
                    rows.append(_row(sample, task, method, budget, kl if kl is None else kl * rng.uniform(0.9, 1.1)))
    return rows


def _tables(lines: list[str]) -> dict[str, list[list[str]]]:
    """Heading -> the rows of cells (header, separator, body) of the markdown table under it."""
    tables: dict[str, list[list[str]]] = {}
    heading = None
    for line in lines:
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.startswith("|") and heading is not None:
            tables.setdefault(heading, []).append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return tables


def _interval(stats: Any, mean: float, low: float, high: float, sign: bool = False) -> str:
    fmt = stats.metric.fmt
    return f"{fmt(mean, sign)} [{fmt(low, sign)}, {fmt(high, sign)}]"


# ------------------------------------------------------------------------------------- by_scorer: names and scorers


def test_the_primary_method_is_the_plain_name_else_the_first_spec_of_ripplekv() -> None:
    """The plain ``ripplekv`` first; else the first ``ripplekv:...`` spec (not ``ripplekv-local``, not another
    method); else None. Seeded bug caught: the spec matched by ``!=`` (the first method that is not RippleKV)."""
    assert primary_method(["snapkv", SPEC, "ripplekv"]) == "ripplekv"
    assert primary_method(["snapkv", "ripplekv-local", SPEC, "ripplekv:r=8"]) == SPEC
    assert primary_method({"snapkv": 1, SPEC: 2}) == SPEC
    assert primary_method(["snapkv", "ripplekv-local"]) is None
    assert primary_method([]) is None


def test_rows_naming_no_scorer_ran_snapkvs_and_no_rows_have_no_scorer() -> None:
    """The scorers in order of first appearance; rows that name none (the field absent or null everywhere) ran the
    default scorer; no rows, no scorers. Seeded bug caught: ``not rows`` as ``rows`` (no scorer for old-format rows,
    the default one for an empty run)."""
    old = [_row("a", "t", "full", FULL_BUDGET, 0.0), _row("a", "t", "snapkv", 0.1, 0.2)]
    assert row_scorers(old) == ["snapkv"]
    assert row_scorers([{**row, "scorer": None} for row in old]) == ["snapkv"]
    assert row_scorers([]) == []
    tagged = [{**old[0], "scorer": None}, {**old[1], "scorer": "tova"}, {**old[1], "scorer": "snapkv"}]
    assert row_scorers(tagged) == ["tova", "snapkv"]


def test_the_verdict_line_finds_ripplekv_under_its_parameters() -> None:
    """A run whose RippleKV is ``ripplekv:r=16,gamma=12`` gets one verdict line per budget, giving that method's
    difference to its best other schedule. Seeded bug caught: ``primary_method(versus) or PRIMARY`` as ``and`` (the
    plain name looked up, no line)."""
    by_scorer = analyse_by_scorer(_rows(), METHODS, BUDGETS, ["fidelity_kl"], 0, RESAMPLES, DRAWS)
    stats = by_scorer["snapkv"][0].metrics["fidelity_kl"]
    lines = verdict_lines(by_scorer, "fidelity_kl")
    assert len(lines) == len(BUDGETS)
    for line, budget in zip(lines, BUDGETS):
        best = stats.versus[budget][SPEC]["best_other"]
        d = best.difference
        head = f"- budget {100 * budget:g}% (fidelity_kl): snapkv: vs {best.other} "
        assert line.startswith(head + _interval(stats, d.mean, d.low, d.high, sign=True)), line
        assert f"{best.wins}/{best.ties}/{best.losses}" in line and ", better, " in line


def test_a_scorer_without_ripplekv_at_a_budget_leaves_the_next_scorers_verdict() -> None:
    """A first scorer whose run has no RippleKV gives no verdict part; the next scorer's part still follows, one
    line per budget. Seeded bug caught: the skipped scorer's ``continue`` as ``break`` (no line at all)."""
    rows = _rows()
    plain = analyse_run(
        [r for r in rows if r["method"] != SPEC], METHODS[:3], BUDGETS, ["fidelity_kl"], 0, RESAMPLES, DRAWS
    )
    by_scorer = analyse_by_scorer(rows, METHODS, BUDGETS, ["fidelity_kl"], 0, RESAMPLES, DRAWS)
    lines = verdict_lines({"tova": (plain, METHODS[:3]), **by_scorer}, "fidelity_kl")
    assert lines == verdict_lines(by_scorer, "fidelity_kl") and len(lines) == len(BUDGETS)
    assert all(": snapkv: vs " in line and "tova" not in line for line in lines), lines


# ------------------------------------------------------------------------------------------- run_stats: defaults


def test_the_default_seed_is_zero_and_another_seed_moves_the_intervals() -> None:
    """``analyse_run`` and ``analyse_by_scorer`` without a seed are the analyses at seed 0 (the same intervals, the
    seed recorded as 0); at seed 1 the means' intervals differ. Seeded bugs caught: either function's default
    seed 1."""
    rows = _rows()
    default = analyse_run(rows, METHODS, BUDGETS, ["fidelity_kl"], resamples=RESAMPLES, draws=DRAWS)
    zero = analyse_run(rows, METHODS, BUDGETS, ["fidelity_kl"], seed=0, resamples=RESAMPLES, draws=DRAWS)
    one = analyse_run(rows, METHODS, BUDGETS, ["fidelity_kl"], seed=1, resamples=RESAMPLES, draws=DRAWS)
    assert default.seed == 0
    assert default.metrics["fidelity_kl"].estimates == zero.metrics["fidelity_kl"].estimates
    assert one.metrics["fidelity_kl"].estimates != zero.metrics["fidelity_kl"].estimates
    by_default = analyse_by_scorer(rows, METHODS, BUDGETS, ["fidelity_kl"], resamples=RESAMPLES, draws=DRAWS)
    (stats, names) = by_default["snapkv"]
    assert stats.seed == 0 and names == METHODS
    assert stats.metrics["fidelity_kl"].estimates == zero.metrics["fidelity_kl"].estimates


def test_run_stats_are_frozen_and_count_no_incomplete_samples_unless_told() -> None:
    """A ``RunStats`` built without ``incomplete`` left no sample out (its significance section says nothing of
    incomplete samples); one built with it says how many; neither can be changed. Seeded bugs caught: the default
    ``incomplete = 1``; the dataclass not frozen."""
    plain = RunStats(RESAMPLES, 0, 0.95, {}, {}, {})
    assert plain.incomplete == 0
    assert not any("without a row" in line for line in markdown_significance(plain))
    told = dataclasses.replace(plain, incomplete=3)
    assert "3 sample(s) without a row for every configuration are left out of the statistics." in (
        markdown_significance(told)
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        plain.seed = 1  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------- tables: markdown


@pytest.fixture(scope="module")
def sectioned() -> RunStats:
    """The analysis of a run where 10% has one scored compressed method (each test prints its tables itself, so
    the mutation tool's trace credits the tables' lines to every test that checks them)."""
    return analyse_run(_rows(unscored_at=0.1), METHODS, BUDGETS, ["fidelity_kl"], 0, RESAMPLES, DRAWS)


def test_the_table_of_means_holds_each_estimate_and_the_full_cache_in_every_column(sectioned: RunStats) -> None:
    """Each cell of the means table is its (method, budget)'s interval, ``–`` where it has none; the full cache's
    row repeats its own estimate under every budget; every row has the header's cell count. Seeded bugs caught:
    ``method == REFERENCE and estimate is None`` as ``is not None`` (the full cache's row dropped); a cell's
    ``estimate is None`` as ``is not None``."""
    run = sectioned
    tables = _tables(markdown_sections(run, METHODS, BUDGETS))
    stats = run.metrics["fidelity_kl"]
    table = next(t for h, t in tables.items() if h.startswith("fidelity_kl (lower is better): mean"))
    header, separator, body = table[0], table[1], table[2:]
    assert header == ["method", "budget 0.1", "budget 0.3"] and len(separator) == len(header)
    assert [row[0] for row in body] == METHODS
    full = stats.estimates["full", FULL_BUDGET]
    for row in body:
        assert len(row) == len(header), row
        for budget, cell in zip(BUDGETS, row[1:]):
            e = full if row[0] == "full" else stats.estimates.get((row[0], budget))
            want = "–" if e is None else _interval(stats, e.mean, e.low, e.high)
            assert cell == want, (row[0], budget)
    assert body[2][1] == "–" and body[1][1] != "–"  # at 10% only SnapKV was scored


def test_paired_difference_tables_exist_for_budgets_with_comparisons_and_match_their_header(
    sectioned: RunStats,
) -> None:
    """A budget with nothing to compare (10%) gets no paired-difference table, the next one (30%) does, with a row
    per compared method; the header, the separator and every row have the same cell count, SnapKV's row showing
    ``–`` in its four baseline cells. Seeded bugs caught: ``if not versus`` as ``if versus``; its ``continue`` as
    ``break``; four dashes as five; a separator of ten columns after the first."""
    run = sectioned
    tables = _tables(markdown_sections(run, METHODS, BUDGETS))
    stats = run.metrics["fidelity_kl"]
    paired = {h: t for h, t in tables.items() if "paired differences" in h}
    assert list(paired) == ["fidelity_kl at budget 0.3: paired differences (`method - other`; * significant)"]
    (table,) = paired.values()
    header, separator, body = table[0], table[1], table[2:]
    assert len(header) == 10 and len(separator) == len(header)
    assert all(len(row) == len(header) for row in body), body
    assert [row[0] for row in body] == [m for m in METHODS if m in stats.versus[0.3]] == METHODS[1:]
    snapkv = body[0]
    best = stats.versus[0.3]["snapkv"]["best_other"]
    assert snapkv[1:6] == ["–", "–", "–", "–", best.other]
    assert snapkv[7] == f"{best.wins}/{best.ties}/{best.losses}"


def _p_text(p: float) -> str:
    """A p value as the tables print it: ``nan`` unless finite, two digits from 1e-3, else one (``2e-5``)."""
    text = "nan" if not math.isfinite(p) else f"{p:.2g}" if p >= 1e-3 else f"{p:.1g}"
    return f"{text.split('e')[0]}e{int(text.split('e')[1])}" if "e" in text else text


def test_the_paired_cells_are_signed_intervals_and_their_p_values(sectioned: RunStats) -> None:
    """Each compared row's best-other cells are the difference's interval with ``+`` on positive numbers (a star if
    significant), W/T/L, p and Holm p as ``_p`` prints them; PyramidKV, worse than SnapKV, shows a ``+``. Seeded
    bugs caught: the interval's ``sign=True`` as ``False``; ``not math.isfinite(p)`` as ``isfinite`` (every p nan)."""
    run = sectioned
    stats = run.metrics["fidelity_kl"]
    (table,) = (t for h, t in _tables(markdown_sections(run, METHODS, BUDGETS)).items() if "budget 0.3: paired" in h)
    for row in table[2:]:
        best = stats.versus[0.3][row[0]]["best_other"]
        d = best.difference
        star = " *" if best.significant else ""
        wtl = f"{best.wins}/{best.ties}/{best.losses}"
        want = [_interval(stats, d.mean, d.low, d.high, sign=True) + star, wtl, _p_text(best.p), _p_text(best.p_holm)]
        assert row[6:] == want and "nan" not in want
    assert table[3][0] == "pyramidkv" and table[3][6].startswith("+")


def test_p_values_print_two_digits_a_short_exponent_and_nan_when_not_finite() -> None:
    """``0.0123`` is ``0.012``, ``1e-3`` ``0.001``, below it one digit and an exponent without its zeros
    (``2e-5``), a NaN or infinite p ``nan``. Seeded bug caught: ``not math.isfinite(p)`` as ``isfinite``."""
    assert [_p(0.0123), _p(1e-3), _p(2e-5), _p(1.0), _p(3e-12)] == ["0.012", "0.001", "2e-5", "1", "3e-12"]
    assert all(_p(p) == _p_text(p) for p in (0.0123, 1e-3, 9.9e-4, 2e-5, 1.0, 3e-12))
    assert [_p(math.nan), _p(math.inf)] == ["nan", "nan"]


def test_a_budget_up_to_1_is_a_fraction_and_above_it_a_token_count() -> None:
    """``0.1`` is ``10%`` and ``1`` (the whole cache) ``100%``; ``1.5``, ``2`` and ``512`` are tokens per layer.
    Seeded bugs caught: ``budget <= 1`` as ``< 1``; the boundary 1 as 2."""
    assert [budget_label(b) for b in (0.1, 1, 1.0)] == ["10%", "100%", "100%"]
    assert [budget_label(b) for b in (1.5, 2, 512)] == [
        "1.5 tokens per layer",
        "2 tokens per layer",
        "512 tokens per layer",
    ]


# ------------------------------------------------------------------------------------ running/results: the folder


def test_complete_samples_keep_a_sample_holding_exactly_or_more_than_every_configuration() -> None:
    """A sample with exactly the run's configurations is complete, one with an extra row too, one missing a
    configuration (here: a scorer's) is left out and counted. Seeded bug caught: ``expected <= have`` as ``<``."""
    configurations = [("full", FULL_BUDGET), ("snapkv", 0.1), ("snapkv@tova", 0.1)]
    exact = [_row("a", "t", m, b, 0.0, scorer=s) for m, b, s in (("full", 1.0, None), ("snapkv", 0.1, "snapkv"))]
    exact.append(_row("a", "t", "snapkv", 0.1, 0.0, scorer="tova"))
    extra = [{**row, "sample_id": "b"} for row in exact] + [_row("b", "t", "snapkv", 0.5, 0.0)]
    missing = [{**row, "sample_id": "c"} for row in exact[:2]]
    kept, incomplete = complete_samples(missing + exact + extra, configurations)
    assert kept == exact + extra and incomplete == 1


def _write_rows(path: Path, rows: list[dict[str, Any]], tail: str) -> bytes:
    """Rows as lines with a blank line after the first, then ``tail`` (an interrupted write); the file's bytes."""
    lines = [json.dumps(row) + "\n" for row in rows]
    path.write_text(lines[0] + "\n" + "".join(lines[1:]) + tail)
    return path.read_bytes()


def test_reading_skips_blank_lines_and_cuts_an_interrupted_last_line_only_when_asked(tmp_path: Path) -> None:
    """Every row after a blank line is read; a truncated last line is left in the file by a plain ``read`` and cut
    (the file ends after the last whole row) by ``read(repair=True)``. Seeded bugs caught: the default
    ``repair=True``; a blank line's ``continue`` as ``break``."""
    rows = [_row(f"s{i}", "t", "snapkv", 0.1, 0.1 * i) for i in range(3)]
    log = ResultsLog(tmp_path / "results.jsonl")
    before = _write_rows(log.path, rows, '{"sample_id": "s3", "met')
    assert log.read() == rows
    assert log.path.read_bytes() == before
    assert log.read(repair=True) == rows
    assert log.path.read_bytes() == before[: before.rindex(b"\n") + 1]
    assert log.read() == rows


def test_rows_after_a_leading_blank_line_are_read_and_repair_keeps_them(tmp_path: Path) -> None:
    """A file that starts with a blank line holds every row after it, and a repair cuts nothing. Seeded bugs
    caught: ``newline < 0`` as ``<= 0``; as ``< 1`` (the whole file taken for one broken last line: no rows, and
    the repair empties the file)."""
    rows = [_row(f"s{i}", "t", "snapkv", 0.1, 0.1 * i) for i in range(2)]
    log = ResultsLog(tmp_path / "results.jsonl")
    log.path.write_text("\n" + "".join(json.dumps(row) + "\n" for row in rows))
    before = log.path.read_bytes()
    assert log.read() == rows
    assert log.read(repair=True) == rows and log.path.read_bytes() == before


def test_a_row_is_saved_as_utf8_json_read_back_as_written_and_nan_is_refused(tmp_path: Path) -> None:
    """An appended row is one line of UTF-8 JSON with its non-ASCII text as itself, read back equal; a row holding
    NaN is refused, the file unchanged. Seeded bugs caught: ``ensure_ascii=False`` as ``True`` (``\\u00e9`` escapes);
    ``allow_nan=False`` as ``True`` (a ``NaN`` token no strict JSON reader takes)."""
    log = ResultsLog(tmp_path / "results.jsonl")
    row = {**_row("t/é", "t", "snapkv", 0.1, 0.25), "answer": "naïve café — 東京"}
    log.append(row)
    written = log.path.read_bytes()
    assert written == (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8") and "東京".encode() in written
    assert log.read() == [row]
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        log.append({**row, "fidelity_kl": math.nan})
    assert log.path.read_bytes() == written


def test_a_run_folder_is_created_with_its_parents_and_cannot_be_changed(tmp_path: Path) -> None:
    """``open_results`` creates a nested folder that does not exist yet; the folder it returns is frozen. Seeded
    bugs caught: ``mkdir(parents=False)``; ``RunFolder`` not frozen."""
    out = tmp_path / "runs" / "model" / "run"
    with open_results(out, {"x": 1}, {}) as folder:
        assert (out / "config.json").is_file() and folder.out == out
        with pytest.raises(dataclasses.FrozenInstanceError):
            folder.done = set()  # type: ignore[misc]


class _Bar:
    """Records what ``run_pending`` tells its progress bar (in place of ``tqdm.tqdm``)."""

    made: list[_Bar] = []

    def __init__(self, total: int, initial: int, desc: str, unit: str, disable: bool) -> None:
        self.total, self.initial, self.disable = total, initial, disable
        self.postfix: list[str] = []
        self.updates = 0
        _Bar.made.append(self)

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix.append(text)

    def update(self, n: int = 1) -> None:
        self.updates += n


@dataclasses.dataclass(frozen=True)
class _Sample:
    id: str


def test_a_resumed_runs_progress_bar_starts_at_the_rows_already_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three samples of three configurations, four rows written before: the bar counts 9, starts at 4, is updated
    once per new row, shows the last 40 characters of each sample it runs (not of the complete one), and is
    disabled exactly when no progress is asked for. Seeded bugs caught: ``total - written`` as ``total + ...``;
    ``disable=not progress`` as ``progress``; ``id[-40:]`` as ``id[40:]``."""
    monkeypatch.setattr(tqdm, "tqdm", _Bar)
    monkeypatch.setattr(_Bar, "made", [])
    configurations = [("full", 1.0), ("snapkv", 0.1), ("snapkv", 0.2)]
    ids = ["a", "task/" + "b" * 36 + "0123456789", "c" * 39 + "Z"]
    samples = [_Sample(i) for i in ids]

    def run_sample(sample: _Sample, pending: list[tuple[str, float]], answer: list[int] | None) -> Any:
        return ({"sample_id": sample.id, "method": m, "budget": b} for m, b in pending)

    with open_results(tmp_path, {"x": 1}, {}) as folder:
        for m, b in configurations:
            folder.log.append({"sample_id": "a", "method": m, "budget": b})
        folder.log.append({"sample_id": ids[1], "method": "full", "budget": 1.0})
    with open_results(tmp_path, {"x": 1}, {}) as folder:
        assert run_pending(samples, configurations, folder, run_sample, "t", progress=True) == 5
    with open_results(tmp_path, {"x": 1}, {}) as folder:
        assert run_pending(samples, configurations, folder, run_sample, "t", progress=False) == 0
    resumed, done = _Bar.made
    assert (resumed.total, resumed.initial, resumed.updates, resumed.disable) == (9, 4, 5, False)
    assert resumed.postfix == ["b" * 30 + "0123456789", "c" * 39 + "Z"]
    assert (done.total, done.initial, done.updates, done.disable) == (9, 9, 0, True)


# ---------------------------------------------------------------------------------- folder_config: the config


EXTENDABLE = {"scorers": ["snapkv"], "budgets": [], "methods": []}
SAVED = {"suite": "needle", "methods": ["full", "snapkv"], "budgets": [0.2], "window_size": 8}


def test_a_config_extends_another_only_by_growing_its_extendable_lists() -> None:
    """More values (in any order) in extendable lists extend; a list that loses a value, an extendable key that is
    not a list, or an added or dropped fixed key does not; an absent extendable key holds its default. Seeded bugs
    caught: the fixed keys as the keys in both (``&``); the list check's ``or`` as ``and``."""
    assert extends(SAVED, {**SAVED, "methods": ["snapkv", "pyramidkv", "full"], "budgets": [0.5, 0.2]}, EXTENDABLE)
    assert extends(SAVED, {**SAVED, "scorers": ["tova", "snapkv"]}, EXTENDABLE)  # absent: ["snapkv"]
    assert not extends(SAVED, {**SAVED, "scorers": ["tova"]}, EXTENDABLE)
    assert not extends(SAVED, {**SAVED, "methods": ["full", "pyramidkv"]}, EXTENDABLE)
    assert not extends({**SAVED, "scorers": "snapkv"}, {**SAVED, "scorers": ["snapkv", "tova"]}, EXTENDABLE)
    assert not extends(SAVED, {**SAVED, "protocol": "question-agnostic"}, EXTENDABLE)
    assert not extends(SAVED, {k: v for k, v in SAVED.items() if k != "window_size"}, EXTENDABLE)


def test_a_folder_refuses_a_config_that_drops_a_saved_value(tmp_path: Path) -> None:
    """A resumed run with fewer budgets is refused by name, the saved config left as it was. Seeded bug caught:
    the list check's ``or`` as ``and`` (the shrink accepted, the config rewritten)."""
    check_or_write_config(tmp_path, {**SAVED, "budgets": [0.2, 0.5]}, {}, extendable=EXTENDABLE)
    before = (tmp_path / "config.json").read_text()
    with pytest.raises(ConfigMismatchError, match=r"budgets: saved \[0.2, 0.5\] vs now \[0.2\]"):
        check_or_write_config(tmp_path, SAVED, {}, extendable=EXTENDABLE)
    assert (tmp_path / "config.json").read_text() == before


def test_the_config_digest_is_the_sha256_of_sorted_compact_json() -> None:
    """The digest does not depend on key order at any depth and is SHA-256 of the sorted, space-free JSON; another
    value, another digest. Seeded bug caught: ``sort_keys=False``."""
    data = {"b": [1, {"y": 2, "x": 1}], "a": "é"}
    same = {"a": "é", "b": [1, {"x": 1, "y": 2}]}
    canonical = '{"a":"\\u00e9","b":[1,{"x":1,"y":2}]}'
    assert sha256_json(data) == sha256_json(same) == hashlib.sha256(canonical.encode()).hexdigest()
    assert sha256_json({**same, "a": "e"}) != sha256_json(same)


@pytest.mark.parametrize("saved", [{"format": "ripplekv-tune/1", "config": SAVED}, {"config": SAVED}, [SAVED]], ids=str)
def test_a_folder_refuses_a_config_file_of_another_format(tmp_path: Path, saved: Any) -> None:
    """A ``config.json`` of another format, of none, or not an object, is refused by name even when it holds the
    same configuration, and left as it was. Seeded bug caught: ``not isinstance(saved, dict) or ...`` as ``and``
    (a dict of another format resumed into; a list read with ``.get``)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(saved))
    with pytest.raises(ConfigMismatchError, match=f"^{path} is not a ripplekv eval config: cannot resume into "):
        check_or_write_config(tmp_path, SAVED, {})
    assert json.loads(path.read_text()) == saved
    check_or_write_config(tmp_path / "new", SAVED, {})
    assert json.loads((tmp_path / "new" / "config.json").read_text())["format"] == CONFIG_FORMAT
