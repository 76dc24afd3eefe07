"""A held-out ``--suite jsonl`` file from BAMBOO's 4K question-answering sets (MeetingQA and PaperQA).

BAMBOO (Dong et al., 2024, "BAMBOO: A Comprehensive Benchmark for Evaluating Long Text Modeling Capacities of Large
Language Models", LREC-COLING; https://github.com/RUCAIBox/BAMBOO) asks multiple-choice questions about one long
document: a Welsh Parliament (Senedd) meeting transcript (``datasets/meetingqa_4k.jsonl``) or a 2023 NLP paper
(``datasets/paperqa_4k.jsonl``). The 4K sets are built to fit a 4,096-token window, the project's evaluation length,
so no record needs truncating. Each source line holds ``content`` (the document), ``question``, ``options`` (labelled
``"A. ..."`` or ``"A:..."``), ``answer`` (a letter) and ``evidence``; some lines are not valid strict JSON (raw
control characters inside strings), so they are read with ``json.loads(strict=False)``.

Selection rule (deterministic; nothing random, nothing from a model):

1. Every line of both files in file order; the record's index is its 0-based position among the file's non-blank
   lines.
2. Its options are parsed: an entry whose text starts with a letter A-D followed by ``.`` or ``:`` is that option
   (label stripped); other entries (evidence sentences pasted into the options list in the source) are dropped. A
   record is kept only when it has exactly one option for each of A, B, C, D, its ``answer`` is one of them, the
   gold option's text is not empty and differs from the question (normalised: lower case, spaces collapsed), and
   its document has between ``--min-words`` and ``--max-words`` words (default 1,000-3,200: 4,096 SmolLM2 tokens
   with the question).
3. Kept records are interleaved round-robin, meetingqa first (meetingqa #1, paperqa #1, meetingqa #2, ...), so that
   ``--limit N`` takes both tasks evenly; ``--per-task N`` keeps the first N kept records of each task.

Each output line is ``{"id", "task", "context", "question", "answers"}``: ``id`` is ``"<task>-<index>"``; ``task``
is ``meetingqa`` or ``paperqa`` (the jsonl suite reads ``id``, ``context``, ``question``, ``answers`` and ignores
``task``); ``context`` is the document (HTML entities such as ``&nbsp;`` unescaped, outer whitespace stripped);
``question`` is ``"Question: <q>\\nOptions:\\nA. ...\\nB. ...\\nC. ...\\nD. ...\\nAnswer with the letter and the text
of the correct option."``; ``answers`` is ``["<letter>. <gold option>", "<gold option>"]`` (scored with
``qa_f1_score``, the best of the two).

The source is a checkout of the repository or its bare git directory (as the ``fetch`` tool leaves it, read with
``git show <rev>:<path>``); no network is used.

    python benchmarks/heldout/make_bamboo.py /work/.mirror/RUCAIBox+BAMBOO/repo benchmarks/heldout/bamboo.jsonl
"""

from __future__ import annotations

import argparse
import html
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TASKS: tuple[tuple[str, str], ...] = (
    ("meetingqa", "datasets/meetingqa_4k.jsonl"),
    ("paperqa", "datasets/paperqa_4k.jsonl"),
)
LETTERS = ("A", "B", "C", "D")
LABEL = re.compile(r"^\s*([A-D])\s*[.:]\s*")
INSTRUCTION = "Answer with the letter and the text of the correct option."
DEFAULT_MIN_WORDS = 1000
DEFAULT_MAX_WORDS = 3200


@dataclass(frozen=True)
class Selection:
    """Which source records are kept.

    Args:
        min_words: fewest whitespace-separated words a document may have (at least 1).
        max_words: most words a document may have (at least ``min_words``).
        per_task: most records kept per task (the first in file order), or None for all.
    """

    min_words: int = DEFAULT_MIN_WORDS
    max_words: int = DEFAULT_MAX_WORDS
    per_task: int | None = None

    def __post_init__(self) -> None:
        if self.min_words < 1:
            raise ValueError(f"min_words must be at least 1, got {self.min_words}")
        if self.max_words < self.min_words:
            raise ValueError(f"max_words ({self.max_words}) must be at least min_words ({self.min_words})")
        if self.per_task is not None and self.per_task < 1:
            raise ValueError(f"per_task must be at least 1 or None, got {self.per_task}")


def read_source(source: Path, path: str, rev: str = "HEAD") -> str:
    """The text of ``path`` in ``source``: a checkout (the file itself) or a bare git directory (``git show``).

    Args:
        source: a checkout of the BAMBOO repository or its git directory.
        path: the file's path inside the repository.
        rev: the revision read from a git directory (ignored for a checkout).

    Raises:
        FileNotFoundError: neither a checkout holding ``path`` nor a git directory.
    """
    file = source / path
    if file.is_file():
        return file.read_text(encoding="utf-8")
    if (source / "HEAD").is_file() and (source / "objects").is_dir():
        shown = subprocess.run(["git", f"--git-dir={source}", "show", f"{rev}:{path}"], capture_output=True, check=True)
        return shown.stdout.decode("utf-8")
    raise FileNotFoundError(f"{source} is neither a checkout holding {path} nor a git directory")


def source_commit(source: Path, rev: str = "HEAD") -> str | None:
    """The commit ``rev`` names in ``source`` (a git directory or a checkout), or None when git cannot tell.

    Args:
        source: the BAMBOO checkout or git directory.
        rev: the revision.
    """
    for flag in (f"--git-dir={source}", f"--git-dir={source / '.git'}"):
        done = subprocess.run(["git", flag, "rev-parse", f"{rev}^{{commit}}"], capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout.strip()
    return None


def parse_options(options: Any) -> dict[str, str] | None:
    """The options A-D of a source record, labels stripped, or None unless each letter labels exactly one entry.

    Entries without a label (evidence sentences in some source records) are ignored.

    Args:
        options: the record's ``options`` field.
    """
    if not isinstance(options, list):
        return None
    found: dict[str, list[str]] = {letter: [] for letter in LETTERS}
    for entry in options:
        if not isinstance(entry, str):
            return None
        match = LABEL.match(entry)
        if match:
            found[match.group(1)].append(_clean(entry[match.end() :]))
    if any(len(texts) != 1 for texts in found.values()):
        return None
    return {letter: texts[0] for letter, texts in found.items()}


def _clean(text: str) -> str:
    return html.unescape(text).strip()


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


def convert(task: str, index: int, raw: Any, selection: Selection) -> dict[str, Any] | None:
    """The output record of one source record, or None when the selection rule drops it.

    Args:
        task: ``meetingqa`` or ``paperqa``.
        index: the record's position among its file's non-blank lines.
        raw: the parsed source line.
        selection: the word range.
    """
    if not isinstance(raw, dict):
        return None
    content, question, answer = raw.get("content"), raw.get("question"), raw.get("answer")
    if not isinstance(content, str) or not isinstance(question, str) or not isinstance(answer, str):
        return None
    options = parse_options(raw.get("options"))
    letter = answer.strip()
    if options is None or letter not in options:
        return None
    context, question, gold = _clean(content), _clean(question), options[letter]
    if not gold or _normal(gold) == _normal(question) or not question:
        return None
    if not selection.min_words <= len(context.split()) <= selection.max_words:
        return None
    listed = "\n".join(f"{name}. {text}" for name, text in options.items())
    return {
        "id": f"{task}-{index}",
        "task": task,
        "context": context,
        "question": f"Question: {question}\nOptions:\n{listed}\n{INSTRUCTION}",
        "answers": [f"{letter}. {gold}", gold],
    }


def task_records(task: str, text: str, selection: Selection) -> list[dict[str, Any]]:
    """The kept records of one source file's text, in file order (at most ``selection.per_task``).

    Args:
        task: the task name.
        text: the file's text, one JSON object a line.
        selection: the selection rule's parameters.
    """
    lines = [line for line in text.split("\n") if line.strip()]
    kept = []
    for index, line in enumerate(lines):
        record = convert(task, index, json.loads(line, strict=False), selection)
        if record is not None:
            kept.append(record)
        if selection.per_task is not None and len(kept) == selection.per_task:
            break
    return kept


def interleave(groups: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Round-robin over ``groups``: the first of each, then the second of each, ...

    Args:
        groups: the records of each task, in task order.
    """
    out = []
    for rank in range(max((len(group) for group in groups), default=0)):
        out.extend(group[rank] for group in groups if rank < len(group))
    return out


def build(source: Path, selection: Selection, rev: str = "HEAD") -> list[dict[str, Any]]:
    """Every output record from a BAMBOO checkout or git directory, in output order.

    Args:
        source: the checkout or git directory.
        selection: the selection rule's parameters.
        rev: the revision read from a git directory.
    """
    return interleave([task_records(task, read_source(source, path, rev), selection) for task, path in TASKS])


def dumps(records: list[dict[str, Any]]) -> str:
    """The JSONL text of ``records`` (keys in a fixed order, UTF-8 kept, one record a line)."""
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="BAMBOO checkout or bare git directory")
    parser.add_argument("out", type=Path, help="the JSONL file to write")
    parser.add_argument("--rev", default="HEAD", help="revision read from a git directory (default HEAD)")
    parser.add_argument("--min-words", type=int, default=DEFAULT_MIN_WORDS, help="fewest document words")
    parser.add_argument("--max-words", type=int, default=DEFAULT_MAX_WORDS, help="most document words")
    parser.add_argument("--per-task", type=int, default=None, help="most records per task (default all)")
    args = parser.parse_args()
    selection = Selection(args.min_words, args.max_words, args.per_task)
    records = build(args.source, selection, args.rev)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dumps(records), encoding="utf-8")
    counts = {task: sum(r["task"] == task for r in records) for task, _ in TASKS}
    print(f"{len(records)} records {counts} from commit {source_commit(args.source, args.rev)} -> {args.out}")


if __name__ == "__main__":
    main()
