"""Regenerate every committed ``report.md`` with ``ripplekv report`` and compare it with the committed one (issue 45).

Each committed run folder under ``benchmarks/results`` that holds a ``report.md`` beside its ``results.jsonl`` was
reported with ``ripplekv report DIR > DIR/report.md`` (its ``COMMAND.sh``); this runs the same command again and says
whether the text is identical, else the first lines that differ. The p-values, intervals and verdicts are all in the
text, so identical text means the statistics are unchanged.

    python benchmarks/check_reports.py [--out benchmarks/results/report-regeneration.txt]
"""

from __future__ import annotations

import argparse
import difflib
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


TUNE_HEADER = "# ripplekv tune"
"""``ripplekv tune`` writes its own report.md (not ``ripplekv report``'s)."""


def committed_reports() -> list[Path]:
    """The run folders whose ``report.md`` the report command wrote (a ``results.jsonl`` beside it)."""
    return sorted(
        path.parent
        for path in RESULTS.rglob("report.md")
        if (path.parent / "results.jsonl").is_file() and not path.read_text().startswith(TUNE_HEADER)
    )


def committed_text(run: Path) -> str:
    """The committed report, without the ``$ ripplekv report <run>`` line the earliest runs put before it."""
    text = (run / "report.md").read_text()
    header = f"$ ripplekv report {run.resolve().relative_to(ROOT)}"
    return text[len(header) :].lstrip("\n") if text.startswith(header) else text


def regenerate(run: Path) -> tuple[bool, str, float]:
    """``(identical, first differences, seconds)`` of ``ripplekv report run`` against ``run/report.md``."""
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "ripplekv.cli.main", "report", str(run)],
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    if out.returncode != 0:
        return False, out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}", seconds
    committed = committed_text(run)
    if out.stdout == committed:
        return True, "", seconds
    diff = difflib.unified_diff(committed.splitlines(), out.stdout.splitlines(), "committed", "regenerated", n=0)
    return False, "\n".join(list(diff)[2:8]), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args()
    lines, same = [], 0
    runs = committed_reports()
    for run in runs:
        identical, difference, seconds = regenerate(run)
        same += identical
        name = run.resolve().relative_to(ROOT)
        lines.append(f"{'identical' if identical else 'DIFFERENT'}  {name}  ({seconds:.0f} s)")
        if difference:
            lines.extend(f"    {line}" for line in difference.splitlines())
        print(lines[-1] if identical else "\n".join(lines[-1 - len(difference.splitlines()) :]), flush=True)
    lines.append(f"{same} of {len(runs)} committed reports regenerate identically")
    print(lines[-1])
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    if same != len(runs):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
