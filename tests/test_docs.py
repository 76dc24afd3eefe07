"""The README and docs/ link only to files that exist, and name only result files that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
RESULT_PATH = re.compile(r"(?<![\w./-])(benchmarks/results/[\w./-]*[\w/])")
README_LINES = 250


def _relative_links(text: str) -> list[str]:
    links = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # absolute URL or an anchor within the page
        links.append(target.split("#", 1)[0])
    return links


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_exist(doc: Path) -> None:
    missing = [link for link in _relative_links(doc.read_text()) if not (doc.parent / link).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} links to missing files: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_named_result_paths_exist(doc: Path) -> None:
    named = set(RESULT_PATH.findall(doc.read_text()))
    # a path names a file or folder, or the output prefix of a command (``--out benchmarks/results/x`` -> x.txt)
    missing = sorted(path for path in named if not (ROOT / path).exists() and not list(ROOT.glob(path + ".*")))
    assert not missing, f"{doc.relative_to(ROOT)} names result paths that do not exist: {missing}"


def test_link_checker_sees_a_broken_link(tmp_path: Path) -> None:
    text = "see [a](docs/nowhere.md), [b](https://example.com), [c](#anchor) and benchmarks/results/none.json"
    assert _relative_links(text) == ["docs/nowhere.md"]
    assert RESULT_PATH.findall(text) == ["benchmarks/results/none.json"]


def test_readme_reads_in_ten_minutes() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines; reference and results belong in docs/"


def test_the_cli_reference_is_generated_from_the_parser() -> None:
    from ripplekv.cli.reference import BEGIN, END, options_reference

    text = (ROOT / "docs" / "cli.md").read_text()
    section = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert section == options_reference().strip(), "run `python -m ripplekv.cli.reference docs/cli.md`"
    for flag in ("--strict-profile", "--budgets", "--score"):
        assert f"`{flag}`" in section


def test_the_method_tables_of_the_cli_doc_follow_the_method_table() -> None:
    """docs/cli.md describes every method of ``METHOD_TABLE`` and lists each one's parameters in declared order
    (the canonical order), with their kinds and defaults (a default derived when the press is built: described)."""
    from ripplekv.presses.method_spec import METHOD_TABLE, format_value

    text = (ROOT / "docs" / "cli.md").read_text()
    methods, params = text.split("### Methods\n", 1)[1].split("\n## ", 1)[0].split("### Method parameters\n", 1)
    assert re.findall(r"^\| `([\w-]+)` \|", methods, re.MULTILINE) == list(METHOD_TABLE)
    rows = dict(re.findall(r"^\| `([\w-]+)` \| (.*) \|$", params, re.MULTILINE))
    assert list(rows) == [name for name, method in METHOD_TABLE.items() if method.params]
    for name, row in rows.items():
        listed = re.findall(r"`(\w+)` \((\w+), default:? ([^):]+)", row)
        declared = METHOD_TABLE[name].params
        assert [(key, kind) for key, kind, _ in listed] == [(p.name, p.kind.__name__) for p in declared], name
        for (key, _, default), param in zip(listed, declared):
            assert param.default is None or default == format_value(param.default), (name, key, default)
