"""Recompute random committed result rows with the current code: each ``fidelity_kl`` must equal the committed one.

For each run of :data:`RUNS` (folders of ``benchmarks/results/``), the run's configuration is rebuilt from its
``COMMAND.sh`` with ``ripplekv eval``'s own parser (:func:`ripplekv_eval.cli.eval.eval_config`) and checked against
its ``config.json`` (the resolved configuration: model identity, profile hash, the hash of every sample's token ids);
``--rows`` rows of its compressed configurations are drawn at random (``random.Random(seed)``, the first ``--rows``
of a fixed draw of :data:`DRAW` rows, so a smaller check is a subset of the full one), and each drawn row's sample is
run again by the harness's per-sample path (:class:`~ripplekv_eval.running.rows.SampleRunner`: one shared prefill
per sample, the drawn configurations derived from it, the full cache's committed answer teacher-forced). The script
prints committed vs recomputed ``fidelity_kl`` and their relative error, and exits with status 1 if any exceeds
``--tolerance`` (default 1e-6).

Every recomputed row is appended to ``OUT/rows.jsonl`` as soon as it is known; a rerun skips the rows found there
(an interrupted check resumes). ``OUT/draw.json`` records the seed and the rows drawn.

    python benchmarks/reproduce_rows.py                       # 20 rows of each of the four runs
    python benchmarks/reproduce_rows.py --rows 2 --threads 2  # the smoke check committed with the script
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
RUNS = ("longbench-fidelity", "allocators-longbench-tuned", "allocators-ruler-4k-tuned", "heldout-bamboo")
DRAW = 20
"""Rows drawn per run; ``--rows`` takes the first of them."""
DEFAULT_OUT = RESULTS / "reproduce-rows"


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


def rebuild_config(run: Path, data_dir: str | None) -> Any:
    """The run's :class:`~ripplekv_eval.running.config.EvalConfig`, from ``COMMAND.sh`` parsed as ``ripplekv eval``
    parses it (paths relative to the repository, as the script runs them); ``data_dir`` replaces ``--data-dir``.

    Args:
        run: the run folder.
        data_dir: the LongBench folder to read instead of the command's (None: the command's).
    """
    from ripplekv.cli.main import build_parser
    from ripplekv_eval.cli.eval import eval_config

    args = build_parser(["eval"]).parse_args(command_argv(run))
    if data_dir is not None and getattr(args, "data_dir", None) is not None:
        args.data_dir = data_dir
    return eval_config(args)


def draw_rows(rows: Sequence[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """:data:`DRAW` rows drawn at random from a run's compressed rows (``method != "full"``), in the draw's order.

    Args:
        rows: the run's rows, in file order.
        seed: the draw's seed.
    """
    compressed = [row for row in rows if row["method"] != "full"]
    return random.Random(seed).sample(compressed, min(DRAW, len(compressed)))


def row_key(run: str, row: dict[str, Any]) -> tuple[str, str, str, float]:
    """What identifies a row of a run: the run, then the row's results key (sample, configuration, budget)."""
    from ripplekv_eval.running.results import row_key as results_key

    return (run, *results_key(row))


def relative_error(committed: float, recomputed: float) -> float:
    """``|recomputed - committed| / |committed|`` (the absolute difference where the committed value is 0)."""
    difference = abs(recomputed - committed)
    return difference / abs(committed) if committed else difference


def recompute_run(
    name: str,
    config: Any,
    picked: Sequence[dict[str, Any]],
    rows: Sequence[dict[str, Any]],
    model: Any,
    tokenizer: Any,
) -> Iterator[dict[str, Any]]:
    """The recomputed ``fidelity_kl`` of the ``picked`` rows of run ``name`` (its rebuilt ``config``; ``rows``: all
    its rows, for the full cache's answers), one sample (one prefill) at a time.

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
    by_sample: dict[str, list[dict[str, Any]]] = {}
    for row in picked:
        by_sample.setdefault(row["sample_id"], []).append(row)
    for sample_id, wanted in by_sample.items():
        expected = {(row_configuration(row), float(row["budget"])): row for row in wanted}
        started = time.perf_counter()
        for new in runner.run_sample(samples[sample_id], list(expected), answers[sample_id]):
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default=",".join(RUNS), help=f"run folders of benchmarks/results (default {RUNS})")
    parser.add_argument("--rows", type=int, default=DRAW, help=f"rows per run, the first of the draw (<= {DRAW})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    parser.add_argument("--tolerance", type=float, default=1e-6, help="largest relative error (default 1e-6)")
    parser.add_argument("--data-dir", default=None, help="LongBench folder replacing the runs' --data-dir")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (rows.jsonl, draw.json)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if not 1 <= args.rows <= DRAW:
        parser.error(f"--rows must be in [1, {DRAW}]")

    import torch
    from transformers.utils import logging as hf_logging

    from ripplekv.models import load_model
    from ripplekv.models.attention import enable_varlen_attention
    from ripplekv_eval.running.results import ResultsLog
    from ripplekv_eval.sample import row_configuration

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    out = Path(args.out).resolve()
    args.data_dir = None if args.data_dir is None else str(Path(args.data_dir).resolve())
    os.chdir(REPO)  # the runs' commands name their files relative to the repository, as their COMMAND.sh does
    out.mkdir(parents=True, exist_ok=True)
    log = ResultsLog(out / "rows.jsonl")  # durable row by row; an interrupted last line is cut off
    done = {row_key(r["run"], r): r for r in log.read(repair=True)}
    runs = [name.strip() for name in args.runs.split(",") if name.strip()]
    draws = {}
    for name in runs:
        rows = ResultsLog(RESULTS / name / "results.jsonl").read()
        draws[name] = (rows, draw_rows(rows, args.seed))
    drawn = {name: [list(row_key(name, row)[1:]) for row in draw] for name, (_, draw) in draws.items()}
    (out / "draw.json").write_text(json.dumps({"seed": args.seed, "rows": drawn}, indent=1) + "\n")

    loaded: dict[tuple[str, str | None], Any] = {}
    results = []
    for name, (rows, draw) in draws.items():
        picked = draw[: args.rows]
        todo = [row for row in picked if row_key(name, row) not in done]
        results.extend(done[row_key(name, row)] for row in picked if row_key(name, row) in done)
        if not todo:
            continue
        config = rebuild_config(RESULTS / name, args.data_dir)
        if (config.model, config.dtype) not in loaded:
            model, tokenizer = load_model(config.model, dtype=config.dtype, device=config.device)
            loaded[config.model, config.dtype] = (enable_varlen_attention(model), tokenizer)
        model, tokenizer = loaded[config.model, config.dtype]
        for result in recompute_run(name, config, todo, rows, model, tokenizer):
            log.append(result)
            results.append(result)
            print(
                f"{name:27s} {row_configuration(result):36s} {result['budget']:<4} committed "
                f"{result['committed']:.12g} recomputed {result['recomputed']:.12g} "
                f"rel.err {result['relative_error']:.2e}",
                flush=True,
            )
    worst = max((r["relative_error"] for r in results), default=0.0)
    failed = [r for r in results if r["relative_error"] > args.tolerance]
    print(
        f"{len(results)} rows of {len(runs)} runs, largest relative error {worst:.3e}, "
        f"{len(failed)} over {args.tolerance:g}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
