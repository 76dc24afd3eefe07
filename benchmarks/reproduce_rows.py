"""Recompute random committed result rows with the current code and with the code of a reference revision.

For each run of :data:`RUNS` (folders of ``benchmarks/results/``), ``--rows`` rows of its compressed configurations
are drawn at random (``random.Random(seed)``, the first ``--rows`` of a fixed draw of :data:`DRAW` rows, so a smaller
check is a subset of the full one; ``OUT/draw.json``), and each drawn row's ``fidelity_kl`` is computed twice on this
machine, exactly as the committed run computed it (its ``COMMAND.sh``: every configuration's press built, one shared
prefill per sample, the committed ``full`` row's answer teacher-forced):

- **current**: this checkout's code, in this process (the run's configuration rebuilt from ``COMMAND.sh`` with
  ``ripplekv eval``'s own parser and checked against its ``config.json``; the harness's per-sample path,
  :class:`~ripplekv_eval.running.rows.SampleRunner`), appended to ``OUT/rows.jsonl``;
- **reference**: the code of ``--reference`` (default :data:`REFERENCE`, the code before the house rework), run as
  its own ``ripplekv eval`` on the run's ``COMMAND.sh`` in a subprocess (``git archive REV src``, ``PYTHONPATH`` its
  ``src``) into a work folder that holds the run's ``config.json`` (so that revision checks that the command resolves
  to the committed configuration) and a row for every (sample, configuration) but the drawn ones (so it runs only
  those; the drawn samples' ``full`` rows carry the committed answers), appended to ``OUT/reference.jsonl``.

The verdict (``--against reference``, default) compares current with reference values at ``--tolerance`` (1e-6
relative; expected: bit-identical) and reports committed vs current separately, for information: the committed runs
were made on other hardware, whose floating-point rounding differs (see README.md). ``--against committed`` makes
the committed values the verdict's. Both sides use ``--threads`` torch threads (the thread count changes rounding).
Rows are appended as soon as they are known; a rerun skips the rows found (an interrupted check resumes). The exit
status is 1 when a compared row differs by more than the tolerance or a drawn row lacks a value.

    python benchmarks/reproduce_rows.py                             # 20 rows of each of the four runs, both codes
    python benchmarks/reproduce_rows.py --rows 5 --compute current  # the current code alone, 5 rows per run
    python benchmarks/reproduce_rows.py --compute none              # the verdict from the rows already computed
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
RUNS = ("longbench-fidelity", "allocators-longbench-tuned", "allocators-ruler-4k-tuned", "heldout-bamboo")
DRAW = 20
"""Rows drawn per run; ``--rows`` takes the first of them."""
DEFAULT_OUT = RESULTS / "reproduce-rows"
REFERENCE = "52de83c"
"""The reference revision: the code before the house rework (issue 32) began."""
THREADS = 2
"""Torch threads of both sides unless ``--threads`` says otherwise."""
POLL_SECONDS = 10.0
"""How often the reference run's rows are collected while it runs."""
WORK = Path(tempfile.gettempdir()) / "reproduce-rows"
"""Where the reference revision's source and its runs' work folders go (kept: a rerun collects what an interrupted
reference run wrote there)."""
SEEDED_FIELDS = ("sample_id", "task", "method", "scorer", "budget")
"""What a work folder's placeholder row keeps of a committed row (its key); ``full`` rows keep ``answer_ids`` too."""
# The reference revision's CLI, after a check that ``ripplekv`` comes from the extracted source (argv[1]).
DRIVER = """import pathlib, sys
import ripplekv
src = pathlib.Path(sys.argv[1]).resolve()
if src not in pathlib.Path(ripplekv.__file__).resolve().parents:
    sys.exit(f"ripplekv imported from {ripplekv.__file__}, not from {src}")
from ripplekv.cli.main import main
sys.exit(main(sys.argv[2:]))
"""

Key = tuple[str, str, str, float]
"""A drawn row: the run, then its results key (sample, configuration, budget)."""


def command_argv(run: Path) -> list[str]:
    """The ``ripplekv eval`` arguments of a run's ``COMMAND.sh`` (its continuation lines joined, ``"$@"`` dropped).

    Args:
        run: the run folder.
    """
    text = (run / "COMMAND.sh").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words[:2] == ["ripplekv", "eval"]:
            return [w for w in words[1:] if w != "$@"]
    raise ValueError(f"{run / 'COMMAND.sh'} runs no `ripplekv eval`")


def replace_option(argv: Sequence[str], option: str, value: str) -> list[str]:
    """``argv`` with the value of ``option`` (``--opt V`` or ``--opt=V``) replaced by ``value`` where it is given.

    Args:
        argv: command-line words.
        option: the option, e.g. ``--data-dir``.
        value: its new value.
    """
    out = list(argv)
    for index, word in enumerate(out):
        if word == option and index + 1 < len(out):
            out[index + 1] = value
        elif word.startswith(option + "="):
            out[index] = f"{option}={value}"
    return out


def run_argv(run: Path, data_dir: str | None) -> list[str]:
    """The run's ``ripplekv eval`` arguments, ``--data-dir`` replaced by ``data_dir`` where given."""
    argv = command_argv(run)
    return argv if data_dir is None else replace_option(argv, "--data-dir", data_dir)


def rebuild_config(run: Path, data_dir: str | None) -> Any:
    """The run's :class:`~ripplekv_eval.running.config.EvalConfig`, from ``COMMAND.sh`` parsed as ``ripplekv eval``
    parses it (paths relative to the repository, as the script runs them); ``data_dir`` replaces ``--data-dir``.

    Args:
        run: the run folder.
        data_dir: the LongBench folder to read instead of the command's (None: the command's).
    """
    from ripplekv.cli.main import build_parser
    from ripplekv_eval.cli.eval import eval_config

    return eval_config(build_parser(["eval"]).parse_args(run_argv(run, data_dir)))


def draw_rows(rows: Sequence[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """:data:`DRAW` rows drawn at random from a run's compressed rows (``method != "full"``), in the draw's order.

    Args:
        rows: the run's rows, in file order.
        seed: the draw's seed.
    """
    compressed = [row for row in rows if row["method"] != "full"]
    return random.Random(seed).sample(compressed, min(DRAW, len(compressed)))


def row_key(run: str, row: Mapping[str, Any]) -> Key:
    """What identifies a row of a run: the run, then the row's results key (sample, configuration, budget)."""
    from ripplekv_eval.running.results import row_key as results_key

    return (run, *results_key(row))


def relative_error(committed: float, recomputed: float) -> float:
    """``|recomputed - committed| / |committed|`` (the absolute difference where the committed value is 0)."""
    difference = abs(recomputed - committed)
    return difference / abs(committed) if committed else difference


def seed_rows(run: str, rows: Sequence[Mapping[str, Any]], pending: set[Key]) -> list[dict[str, Any]]:
    """The rows a reference work folder starts with: every committed row but the ``pending`` ones, cut to its key
    (:data:`SEEDED_FIELDS`), the ``full`` rows with their ``answer_ids`` (the answer a resumed run teacher-forces).

    Args:
        run: the run's name.
        rows: the run's committed rows.
        pending: the drawn rows the reference run is to compute.
    """
    seeded = []
    for row in rows:
        if row_key(run, row) in pending:
            continue
        kept = [*SEEDED_FIELDS, "answer_ids"] if row["method"] == "full" else SEEDED_FIELDS
        seeded.append({name: row[name] for name in kept if name in row})
    return seeded


def by_sample(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """``rows`` grouped by sample (first-seen order): one prefill serves a sample's rows."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(str(row["sample_id"]), []).append(row)
    return groups


def recompute_run(
    name: str,
    config: Any,
    picked: Sequence[dict[str, Any]],
    rows: Sequence[dict[str, Any]],
    model: Any,
    tokenizer: Any,
) -> Iterator[dict[str, Any]]:
    """The current code's ``fidelity_kl`` of the ``picked`` rows of run ``name`` (its rebuilt ``config``; ``rows``:
    all its rows, for the full cache's answers), one sample (one prefill) at a time, each sample's configurations in
    the run's order (as ``ripplekv eval`` runs them).

    Raises:
        SystemExit: if the rebuilt configuration does not resolve to the run's ``config.json``.
    """
    from ripplekv_eval.running.rows import SampleRunner
    from ripplekv_eval.running.runner import build_presses, build_samples, load_run_profiles, resolve_config
    from ripplekv_eval.sample import row_configuration

    run = RESULTS / name
    profiles = load_run_profiles(config)
    samples = {s.id: s for s in build_samples(config, tokenizer, model)}
    resolved = resolve_config(config, model, list(samples.values()), profiles.profile, profiles.oracles)
    committed = json.loads((run / "config.json").read_text())["config"]
    if resolved != committed:
        changed = sorted(k for k in committed.keys() | resolved.keys() if committed.get(k) != resolved.get(k))
        raise SystemExit(f"{name}: the rebuilt configuration differs from config.json in {', '.join(changed)}")
    presses = build_presses(config, profiles.profile, model, profiles.oracles)
    runner = SampleRunner(config, model, tokenizer, presses)
    answers = {row["sample_id"]: row["answer_ids"] for row in rows if row["method"] == "full"}
    order = {(method, float(budget)): index for index, (method, budget) in enumerate(config.configurations)}
    for sample_id, wanted in by_sample(picked).items():
        expected = {(row_configuration(row), float(row["budget"])): row for row in wanted}
        started = time.perf_counter()
        for new in runner.run_sample(samples[sample_id], sorted(expected, key=order.__getitem__), answers[sample_id]):
            old = expected[row_configuration(new), float(new["budget"])]
            yield {
                "run": name,
                "sample_id": sample_id,
                "method": old["method"],
                "scorer": old.get("scorer"),
                "budget": float(old["budget"]),
                "committed": old["fidelity_kl"],
                "recomputed": new["fidelity_kl"],
                "relative_error": relative_error(old["fidelity_kl"], new["fidelity_kl"]),
                "sample_seconds": round(time.perf_counter() - started, 2),
            }


def extract_source(revision: str) -> tuple[str, Path]:
    """The full commit of ``revision`` and its ``src`` folder, extracted under :data:`WORK` (``git archive``)."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{revision}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    root = WORK / commit[:12]
    shutil.rmtree(root / "src", ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    return commit, root / "src"


def collect(work: Path, name: str, pending: set[Key], known: set[Key]) -> list[dict[str, Any]]:
    """The rows of ``pending`` that the reference run wrote into ``work`` and ``known`` lacks (added to it); the
    placeholders a work folder was seeded with (:func:`seed_rows`, no ``fidelity_kl``) are not rows it wrote."""
    from ripplekv_eval.running.results import ResultsLog

    found = []
    for row in ResultsLog(work / "results.jsonl").read():  # an interrupted last line is left alone
        key = row_key(name, row)
        if "fidelity_kl" in row and key in pending and key not in known:
            known.add(key)
            found.append(row)
    return found


def reference_run(
    name: str,
    commit: str,
    src: Path,
    picked: Sequence[dict[str, Any]],
    rows: Sequence[dict[str, Any]],
    data_dir: str | None,
    threads: int,
) -> Iterator[dict[str, Any]]:
    """The reference revision's ``fidelity_kl`` of the ``picked`` rows of run ``name``: its own ``ripplekv eval``
    on the run's command, in a subprocess, into a work folder seeded to leave only ``picked`` to run (see the
    module docstring). Rows are yielded as the subprocess writes them; a work folder an interrupted call left is
    collected first.

    Raises:
        SystemExit: if the subprocess fails.
    """
    from ripplekv_eval.running.results import ResultsLog

    run = RESULTS / name
    committed = {row_key(name, row): row for row in picked}
    pending = set(committed)
    work = src.parent / f"{name}-threads{threads}"
    known: set[Key] = set()
    leftover = collect(work, name, pending, known) if (work / "results.jsonl").exists() else []
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shutil.copyfile(run / "config.json", work / "config.json")
    log = ResultsLog(work / "results.jsonl")
    for row in seed_rows(name, rows, pending - known):
        log.append(row)

    def result(row: dict[str, Any]) -> dict[str, Any]:
        old = committed[row_key(name, row)]
        return {
            "run": name,
            "sample_id": old["sample_id"],
            "method": old["method"],
            "scorer": old.get("scorer"),
            "budget": float(old["budget"]),
            "revision": commit,
            "threads": threads,
            "committed": old["fidelity_kl"],
            "reference": row["fidelity_kl"],
            "seconds": row.get("seconds"),
        }

    yield from (result(row) for row in leftover)
    if not pending - known:
        return
    argv = [*replace_option(run_argv(run, data_dir), "--out", str(work)), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    process = subprocess.Popen([sys.executable, "-c", DRIVER, str(src), *argv], cwd=REPO, env=env)
    while True:
        try:
            code = process.wait(timeout=POLL_SECONDS)
        except subprocess.TimeoutExpired:
            code = None
        yield from (result(row) for row in collect(work, name, pending, known))
        if code is not None:
            break
    if code != 0 or pending - known:
        raise SystemExit(
            f"{name}: the reference run ({commit[:12]}) exited with status {code}, "
            f"{len(pending - known)} of its {len(pending)} rows missing"
        )


@dataclass
class Verdict:
    """The drawn rows compared: current vs reference (the verdict's) and current vs committed (information)."""

    lines: list[str] = field(default_factory=list)
    """One printed line per drawn row."""
    against: list[float] = field(default_factory=list)
    """Relative errors of current vs the verdict's values, one per compared row."""
    committed: list[float] = field(default_factory=list)
    """Relative errors of current vs committed, one per row with a current value."""
    failed: int = 0
    """Compared rows over the tolerance."""
    missing: int = 0
    """Drawn rows lacking the current or the verdict's value."""


def compare(
    drawn: Sequence[Key],
    committed: Mapping[Key, float],
    current: Mapping[Key, float],
    reference: Mapping[Key, float],
    tolerance: float,
    label: str = "reference",
) -> Verdict:
    """Each drawn row's current ``fidelity_kl`` against ``reference`` (over ``tolerance`` relative: failed; either
    missing: missing), and against ``committed`` for information.

    Args:
        drawn: the drawn rows, in order.
        committed: their committed values.
        current: the current code's values, where computed.
        reference: the verdict's values (the reference revision's, or the committed ones), where computed.
        tolerance: the largest relative error that passes.
        label: what the printed lines call the verdict's values (``committed``: they are not printed twice).
    """
    verdict = Verdict()
    for key in drawn:
        run, sample, configuration, budget = key
        new, old = current.get(key), reference.get(key)
        cells = [f"{run:27s} {configuration:36s} {budget:<4}", f"committed {committed[key]:.17g}"]
        if label != "committed":
            cells.append(f"{label} " + ("-" if old is None else f"{old:.17g}"))
        cells.append("current " + ("-" if new is None else f"{new:.17g}"))
        if new is not None:
            verdict.committed.append(relative_error(committed[key], new))
            if label != "committed":
                cells.append(f"vs committed {verdict.committed[-1]:.2e}")
        if new is None or old is None:
            verdict.missing += 1
            cells.append("MISSING")
        else:
            verdict.against.append(relative_error(old, new))
            verdict.failed += verdict.against[-1] > tolerance
            cells.append(f"vs {label} {verdict.against[-1]:.2e}" + (" FAIL" if verdict.against[-1] > tolerance else ""))
        verdict.lines.append("  ".join(cells))
    return verdict


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default=",".join(RUNS), help=f"run folders of benchmarks/results (default {RUNS})")
    parser.add_argument("--rows", type=int, default=DRAW, help=f"rows per run, the first of the draw (<= {DRAW})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    parser.add_argument("--tolerance", type=float, default=1e-6, help="largest relative error (default 1e-6)")
    parser.add_argument("--reference", default=REFERENCE, help=f"the reference git revision (default {REFERENCE})")
    parser.add_argument(
        "--against",
        choices=("reference", "committed"),
        default="reference",
        help="what the current values must equal: the reference revision's (default) or the committed ones",
    )
    parser.add_argument(
        "--compute",
        choices=("both", "current", "reference", "none"),
        default="both",
        help="which code computes the rows still missing (default both; none: the verdict from the rows stored)",
    )
    parser.add_argument("--data-dir", default=None, help="LongBench folder replacing the runs' --data-dir")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (rows.jsonl, reference.jsonl, ...)")
    parser.add_argument("--threads", type=int, default=THREADS, help=f"torch threads of both codes (default {THREADS})")
    args = parser.parse_args(argv)
    if not 1 <= args.rows <= DRAW:
        parser.error(f"--rows must be in [1, {DRAW}]")
    if args.threads < 1:
        parser.error("--threads must be >= 1")

    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # as the reference subprocess gets it
    import torch
    from transformers.utils import logging as hf_logging

    from ripplekv.models.attention import enable_varlen_attention
    from ripplekv.models.loading import load_model
    from ripplekv_eval.running.results import ResultsLog
    from ripplekv_eval.sample import row_configuration

    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    out = Path(args.out).resolve()
    args.data_dir = None if args.data_dir is None else str(Path(args.data_dir).resolve())
    os.chdir(REPO)  # the runs' commands name their files relative to the repository, as their COMMAND.sh does
    out.mkdir(parents=True, exist_ok=True)
    commit, src = extract_source(args.reference)
    current_log = ResultsLog(out / "rows.jsonl")  # durable row by row; an interrupted last line is cut off
    reference_log = ResultsLog(out / "reference.jsonl")
    current = {
        row_key(r["run"], r): r["recomputed"] for r in current_log.read(repair=True) if r["threads"] == args.threads
    }
    reference = {
        row_key(r["run"], r): r["reference"]
        for r in reference_log.read(repair=True)
        if r["revision"] == commit and r["threads"] == args.threads
    }
    runs = [name.strip() for name in args.runs.split(",") if name.strip()]
    draws = {}
    for name in runs:
        rows = ResultsLog(RESULTS / name / "results.jsonl").read()
        draws[name] = (rows, draw_rows(rows, args.seed))
    drawn = {name: [list(row_key(name, row)[1:]) for row in draw] for name, (_, draw) in draws.items()}
    (out / "draw.json").write_text(json.dumps({"seed": args.seed, "rows": drawn}, indent=1) + "\n")

    loaded: dict[tuple[str, str | None], Any] = {}
    committed: dict[Key, float] = {}
    for name, (rows, draw) in draws.items():
        picked = draw[: args.rows]
        committed.update((row_key(name, row), row["fidelity_kl"]) for row in picked)
        todo = [row for row in picked if row_key(name, row) not in reference]
        if todo and args.compute in ("both", "reference"):
            for result in reference_run(name, commit, src, todo, rows, args.data_dir, args.threads):
                reference_log.append(result)
                reference[row_key(name, result)] = result["reference"]
                print(
                    f"reference {name} {result['sample_id']} {row_configuration(result)} {result['budget']}: "
                    f"{result['reference']:.17g}",
                    flush=True,
                )
        todo = [row for row in picked if row_key(name, row) not in current]
        if todo and args.compute in ("both", "current"):
            config = rebuild_config(RESULTS / name, args.data_dir)
            if (config.model, config.dtype) not in loaded:
                model, tokenizer = load_model(config.model, dtype=config.dtype, device=config.device)
                loaded[config.model, config.dtype] = (enable_varlen_attention(model), tokenizer)
            model, tokenizer = loaded[config.model, config.dtype]
            for result in recompute_run(name, config, todo, rows, model, tokenizer):
                current_log.append({**result, "threads": args.threads})
                current[row_key(name, result)] = result["recomputed"]
                print(
                    f"current {name} {result['sample_id']} {row_configuration(result)} {result['budget']}: "
                    f"{result['recomputed']:.17g}",
                    flush=True,
                )

    keys = [row_key(name, row) for name, (_, draw) in draws.items() for row in draw[: args.rows]]
    verdict = compare(
        keys, committed, current, committed if args.against == "committed" else reference, args.tolerance, args.against
    )
    print("\n".join(verdict.lines))
    against = f"{args.against} ({commit[:12]})" if args.against == "reference" else args.against
    summary = {
        "against": args.against,
        "reference": commit,
        "threads": args.threads,
        "tolerance": args.tolerance,
        "drawn": len(keys),
        "compared": len(verdict.against),
        "failed": verdict.failed,
        "missing": verdict.missing,
        "largest_relative_error": max(verdict.against, default=None),
        "committed_vs_current": {
            "rows": len(verdict.committed),
            "median_relative_error": statistics.median(verdict.committed) if verdict.committed else None,
            "largest_relative_error": max(verdict.committed, default=None),
            "over_tolerance": sum(e > args.tolerance for e in verdict.committed),
        },
    }
    (out / "verdict.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"{len(keys)} rows drawn from {len(runs)} runs; current vs {against}: {len(verdict.against)} compared, "
        f"largest relative error {max(verdict.against, default=0.0):.3e}, {verdict.failed} over {args.tolerance:g}, "
        f"{verdict.missing} missing; current vs committed (information: other hardware): {len(verdict.committed)} "
        f"rows, median {summary['committed_vs_current']['median_relative_error'] or 0.0:.2e}, "
        f"largest {summary['committed_vs_current']['largest_relative_error'] or 0.0:.2e}"
    )
    return 1 if verdict.failed or verdict.missing else 0


if __name__ == "__main__":
    sys.exit(main())
