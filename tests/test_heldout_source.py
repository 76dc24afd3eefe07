"""The BAMBOO held-out converter (benchmarks/heldout/make_bamboo.py) on a tiny synthetic input in BAMBOO's format."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.heldout.make_bamboo import (
    INSTRUCTION,
    TASKS,
    Selection,
    build,
    dumps,
    interleave,
    parse_options,
)
from ripplekv_eval.suites import load_jsonl

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "heldout" / "make_bamboo.py"
FOUR = ["A. alpha", "B. beta", "C. gamma", "D. delta"]


def _document(words: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(words))


def _record(content: str, question: str, options: list[str], answer: str) -> dict[str, Any]:
    return {"question": question, "evidence": "ev", "options": options, "answer": answer, "content": content}


# (record, kept?) per task: the expected selection, written out by hand.
MEETING: list[tuple[dict[str, Any], bool]] = [
    (_record(_document(40, "m") + "&nbsp;end", "Who spoke?", FOUR, "B"), True),
    (_record(_document(40, "m"), "Who spoke?", ["A. x", "B. y", "C. z"], "A"), False),  # no option D
    (_record(_document(40, "m"), "Who spoke?", [*FOUR, "An evidence sentence."], "D"), True),  # evidence ignored
    (_record(_document(40, "m"), "Who spoke?", [*FOUR, "C.Another C"], "C"), False),  # C labels two entries
    (_record(_document(5, "m"), "Who spoke?", FOUR, "A"), False),  # document below the word range
    (_record(_document(40, "m"), "Who spoke?", FOUR, "E"), False),  # answer is no option
    (_record(_document(40, "m"), "Alpha", FOUR, "A"), False),  # the gold option repeats the question
]
PAPER: list[tuple[dict[str, Any], bool]] = [
    (_record("\n" + _document(30, "p") + "\n", "What is shown?", ["A:one", "B:two", "C:three", "D:four"], "C"), True),
    (_record(_document(30, "p"), "What is\tshown?", FOUR, "A"), True),  # a raw tab: not strict JSON
    (_record(_document(300, "p"), "What is shown?", FOUR, "B"), False),  # document above the word range
    (_record(_document(30, "p"), "What is shown?", ["All of them.", "B. b", "C. c", "D. d"], "A"), False),
]
SELECTION = Selection(min_words=10, max_words=200)


def _line(record: dict[str, Any]) -> str:
    # BAMBOO's paperqa lines hold raw control characters inside strings: write the tab unescaped
    return json.dumps(record).replace("\\t", "\t")


def _checkout(root: Path) -> Path:
    (root / "datasets").mkdir(parents=True)
    for (_, path), rows in zip(TASKS, (MEETING, PAPER), strict=True):
        # blank lines (skipped, not counted in a record's index) between the records
        (root / path).write_text("\n\n".join(_line(r) for r, _ in rows) + "\n", encoding="utf-8")
    return root


def _expected_ids() -> list[str]:
    groups = [
        [f"{task}-{i}" for i, (_, kept) in enumerate(rows) if kept] for (task, _), rows in zip(TASKS, (MEETING, PAPER))
    ]
    return [record["id"] for record in interleave([[{"id": i} for i in group] for group in groups])]


def test_selection_matches_the_rule_written_out(tmp_path: Path) -> None:
    records = build(_checkout(tmp_path / "bamboo"), SELECTION)
    assert [r["id"] for r in records] == _expected_ids() == ["meetingqa-0", "paperqa-0", "meetingqa-2", "paperqa-1"]


def test_records_carry_the_source_gold_and_document(tmp_path: Path) -> None:
    records = {r["id"]: r for r in build(_checkout(tmp_path / "bamboo"), SELECTION)}
    first = records["meetingqa-0"]
    assert first["context"] == _document(40, "m") + "\xa0end"  # &nbsp; unescaped, nothing else changed
    assert first["answers"] == ["B. beta", "beta"]
    assert first["question"] == "Question: Who spoke?\nOptions:\nA. alpha\nB. beta\nC. gamma\nD. delta\n" + INSTRUCTION
    assert "evidence sentence" not in records["meetingqa-2"]["question"]
    assert records["paperqa-0"]["context"] == _document(30, "p")  # outer newlines stripped
    assert records["paperqa-0"]["answers"] == ["C. three", "three"]
    assert records["paperqa-1"]["question"].startswith("Question: What is\tshown?\n")
    assert {r["task"] for r in records.values()} == {"meetingqa", "paperqa"}


def test_output_is_a_valid_jsonl_suite_file_written_identically_twice(tmp_path: Path) -> None:
    source = _checkout(tmp_path / "bamboo")
    outs = [tmp_path / "one.jsonl", tmp_path / "two.jsonl"]
    for out in outs:
        args = [str(source), str(out), "--min-words", "10", "--max-words", "200"]
        subprocess.run([sys.executable, str(SCRIPT), *args], check=True, capture_output=True)
    assert outs[0].read_bytes() == outs[1].read_bytes() == dumps(build(source, SELECTION)).encode("utf-8")
    loaded = load_jsonl(outs[0], "qa_f1_score")
    assert [r.id for r in loaded] == _expected_ids()
    assert all(r.answers[0].endswith(r.answers[1]) and r.answers[1] in r.question for r in loaded)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_bare_git_directory_gives_the_checkout_records(tmp_path: Path) -> None:
    work = _checkout(tmp_path / "work")
    env = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run(["git", *env, "init", "-q", str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "add", "datasets"], check=True)
    subprocess.run(["git", *env, "-C", str(work), "commit", "-q", "-m", "data"], check=True)
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    assert dumps(build(bare, SELECTION)) == dumps(build(work, SELECTION))


def test_per_task_keeps_a_prefix_and_a_wider_word_range_a_superset(tmp_path: Path) -> None:
    source = _checkout(tmp_path / "bamboo")
    full = build(source, SELECTION)
    one = build(source, Selection(SELECTION.min_words, SELECTION.max_words, per_task=1))
    assert [r["id"] for r in one] == ["meetingqa-0", "paperqa-0"]
    assert all(r in full for r in one)
    wide = build(source, Selection(min_words=1, max_words=10_000))
    assert {r["id"] for r in full} < {r["id"] for r in wide}
    assert {"meetingqa-4", "paperqa-2"} <= {r["id"] for r in wide}


def test_parse_options_needs_each_letter_once() -> None:
    assert parse_options(["A: x ", "B.y", "C . z", "D: w", "noise"]) == {"A": "x", "B": "y", "C": "z", "D": "w"}
    assert parse_options(["A. x", "B. y", "C. z"]) is None
    assert parse_options(["A. x", "A. x", "B. y", "C. z", "D. w"]) is None
    assert parse_options("A. x B. y") is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"min_words": 0}, "min_words"), ({"min_words": 9, "max_words": 8}, "max_words"), ({"per_task": 0}, "per_task")],
)
def test_selection_rejects_bad_parameters(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Selection(**kwargs)


HELDOUT = SCRIPT.parent / "bamboo.jsonl"
PROVENANCE = SCRIPT.parent / "PROVENANCE.md"
MIRROR = Path("/work/.mirror/RUCAIBox+BAMBOO/repo")


def test_committed_file_is_the_one_provenance_describes() -> None:
    text = PROVENANCE.read_text(encoding="utf-8")
    digest = hashlib.sha256(HELDOUT.read_bytes()).hexdigest()
    assert f"SHA-256 `{digest}`" in text
    records = load_jsonl(HELDOUT, "qa_f1_score")
    tasks = [r.id.split("-")[0] for r in records]
    assert f"{len(records)} records ({tasks.count('meetingqa')} meetingqa, {tasks.count('paperqa')} paperqa)" in text
    assert tasks[:4] == ["meetingqa", "paperqa", "meetingqa", "paperqa"]  # interleaved


@pytest.mark.skipif(not MIRROR.is_dir(), reason=f"no BAMBOO snapshot at {MIRROR}")
def test_committed_file_rebuilds_from_the_source_snapshot() -> None:
    assert dumps(build(MIRROR, Selection())).encode("utf-8") == HELDOUT.read_bytes()
