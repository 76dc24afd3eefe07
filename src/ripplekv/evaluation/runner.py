"""``ripplekv eval``: score methods x budgets on a suite (LongBench, RULER, needle, a JSONL file, ...).

Per sample, the prompt is prefilled **once** and recorded (:mod:`ripplekv.inference.shared`); every (method,
budget) cache is derived from that record (AdaKV's head-wise masks included). Then:

1. the full cache's state (query-agnostic: the context's cache extended with the question) decodes the full
   cache's greedy answer, once per sample (or it is read back from the ``full`` row's ``answer_ids`` on resume);
   the answer teacher-forced over the full cache gives the reference distributions;
2. every configuration's cache teacher-forces that answer: ``fidelity_kl`` is the mean KL(full || method) over
   its positions, ``top1_agreement`` the fraction of positions where the method's greedy choice (its argmax, stop
   tokens excluded at the first position as in decoding) is the full cache's token; the suite's gold answer is
   teacher-forced too (``gold_nll``, and ``gold_nll_delta`` against the full cache's);
3. with ``score="both"`` (default) every configuration is decoded greedily and scored by the suite's metric; with
   ``score="fidelity"`` only the full cache is (the other rows hold ``prediction`` and ``score`` null).

Decoding never stops at the first generated token (``min_new_tokens=1``, LongBench ``pred.py``'s ``min_length``,
applied to every task). The full cache is decoded even when ``full`` is not among the methods (it is the
reference); its row is written only when it is. Rows are described in :mod:`ripplekv.evaluation.rows`.

Protocols: ``question-aware`` (default) prefills and compresses the whole prompt; ``query-agnostic`` prefills and
compresses the context part only, then runs the question over each derived cache with ``extend``.

Output folder (:mod:`ripplekv.evaluation.results`)::

    config.json     the resolved configuration (compared on resume), library and dependency versions
    results.jsonl   one row per (sample, method, budget), appended, flushed and fsynced as soon as it finishes

Re-running the same command resumes: rows already in ``results.jsonl`` are skipped, a truncated last line (an
interrupted write) is dropped and redone, and a folder whose ``config.json`` holds a different configuration is
refused. An interruption loses at most the configuration in flight.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpress.presses.base_press import BasePress
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.evaluation.config import DEFAULT_BUDGETS, DEFAULT_METHODS, FULL_BUDGET, EvalConfig, EvalSample
from ripplekv.evaluation.results import (
    CONFIG_FILE,
    RESULTS_FILE,
    ConfigMismatchError,
    ResultsLog,
    check_or_write_config,
    row_key,
    sha256_json,
)
from ripplekv.evaluation.rows import SampleRunner
from ripplekv.evaluation.suites import SUITES, get_suite
from ripplekv.evaluation.suites.needle import DEFAULT_NEEDLE_DEPTHS, DEFAULT_NEEDLE_DIGITS, DEFAULT_NEEDLE_LENGTHS
from ripplekv.evaluation.suites.ruler import DEFAULT_CONTEXT_TOKENS, DEFAULT_RULER_SAMPLES
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.presses.registry import make_press
from ripplekv.profiling.profile import SensitivityProfile

__all__ = [
    "CONFIG_FILE",
    "DEFAULT_BUDGETS",
    "DEFAULT_CONTEXT_TOKENS",
    "DEFAULT_METHODS",
    "DEFAULT_NEEDLE_DEPTHS",
    "DEFAULT_NEEDLE_DIGITS",
    "DEFAULT_NEEDLE_LENGTHS",
    "DEFAULT_RULER_SAMPLES",
    "FULL_BUDGET",
    "RESULTS_FILE",
    "SUITES",
    "ConfigMismatchError",
    "EvalConfig",
    "EvalSample",
    "EvalSummary",
    "ResultsLog",
    "build_samples",
    "resolve_config",
    "run_eval",
]


@dataclass(frozen=True)
class EvalSummary:
    """What one :func:`run_eval` call did.

    Args:
        out: the evaluation folder.
        rows: rows in ``results.jsonl`` at the end.
        new_rows: rows written by this call.
        samples: samples of the run.
        configurations: (method, budget) pairs per sample.
        seconds: wall time of the call.
    """

    out: Path
    rows: int
    new_rows: int
    samples: int
    configurations: int
    seconds: float


def build_samples(
    config: EvalConfig, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None = None
) -> list[EvalSample]:
    """The samples of ``config.suite`` (in run order), with unique ids.

    Args:
        config: the evaluation.
        tokenizer: the model's tokenizer.
        model: the model, where a suite takes a default from it (LongBench's ``max_length``).
    """
    samples = get_suite(config.suite).samples(config, tokenizer, model)
    if not samples:
        raise ValueError(f"the {config.suite} suite has no samples with these options")
    if len({s.id for s in samples}) != len(samples):
        raise ValueError("sample ids are not unique")
    return samples


def resolve_config(
    config: EvalConfig,
    model: PreTrainedModel,
    samples: Sequence[EvalSample],
    profile: SensitivityProfile | None,
) -> dict[str, Any]:
    """The configuration compared on resume: options with their defaults filled in, the model's identity, the
    profile's content hash, and a hash of every sample's token ids (dataset, tokenizer and prompt format).

    Args:
        config: the evaluation.
        model: the model.
        samples: the samples of ``config``.
        profile: the sensitivity profile, if the methods use one.
    """
    from ripplekv.models import model_identity

    resolved: dict[str, Any] = {
        "suite": config.suite,
        "model": model_identity(model),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "methods": list(config.methods),
        "budgets": [float(b) for b in config.budgets],
        "protocol": config.protocol,
        "window_size": config.window_size,
        "max_new_tokens": config.max_new_tokens,
        "seed": config.seed,
        "profile": None if profile is None else {"sha256": sha256_json(profile.to_dict())},
        "score": config.score,
        "chat_template": config.chat_template,
    }
    resolved.update(get_suite(config.suite).resolve(config, model))
    resolved["samples"] = {
        "count": len(samples),
        "sha256": sha256_json(
            [[s.id, list(s.input_ids), s.question_start, s.max_new_tokens, sorted(s.extra_stop_ids)] for s in samples]
        ),
    }
    return json.loads(json.dumps(resolved))  # tuples -> lists, as read back from the file


def _build_presses(
    config: EvalConfig, profile: SensitivityProfile | None, model: PreTrainedModel
) -> dict[tuple[str, float], BasePress]:
    presses = {}
    for method, budget in [("full", FULL_BUDGET), *config.configurations]:
        press = make_press(method, budget=budget, profile=profile, window_size=config.window_size)
        press.post_init_from_model(model)  # checks a profile against the model before any work
        presses[method, budget] = press
    return presses


def run_eval(
    config: EvalConfig,
    out: str | os.PathLike[str],
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
) -> EvalSummary:
    """Run (or resume) the evaluation ``config`` into the folder ``out``; see the module docstring.

    Args:
        config: the evaluation.
        out: the output folder (created; resumed when it holds the same configuration).
        model: the model (loaded from ``config.model`` unless given together with ``tokenizer``).
        tokenizer: its tokenizer.
        on_row: called with every row right after it was written.
        progress: show a progress bar.
    """
    from tqdm import tqdm

    start = time.perf_counter()
    suite = get_suite(config.suite)
    needs_profile = any(m.startswith("ripplekv") for m in config.methods)
    if needs_profile and config.profile is None:
        raise ValueError("the ripplekv methods need --profile (make one with `ripplekv profile`)")
    profile = SensitivityProfile.load(config.profile) if config.profile is not None and needs_profile else None
    if model is None or tokenizer is None:
        from ripplekv.models import load_model

        model, tokenizer = load_model(config.model, dtype=config.dtype, device=config.device)
    enable_varlen_attention(model)
    presses = _build_presses(config, profile, model)
    samples = build_samples(config, tokenizer, model)
    resolved = resolve_config(config, model, samples, profile)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sources = {"model": config.model, **suite.sources(config), "profile": config.profile}
    check_or_write_config(out, resolved, sources)
    log = ResultsLog(out / RESULTS_FILE)
    existing = log.read(repair=True)
    done = {row_key(row) for row in existing}
    answers = {
        str(row["sample_id"]): [int(t) for t in row["answer_ids"]]
        for row in existing
        if row["method"] == "full" and isinstance(row.get("answer_ids"), list) and row["answer_ids"]
    }

    configurations = config.configurations
    planned = [(sample, [(m, b) for m, b in configurations if (sample.id, m, b) not in done]) for sample in samples]
    total = len(samples) * len(configurations)
    already = total - sum(len(pending) for _, pending in planned)
    runner = SampleRunner(config, model, tokenizer, presses)
    written = 0
    with tqdm(total=total, initial=already, desc=f"eval {config.suite}", unit="run", disable=not progress) as bar:
        for sample, pending in planned:
            if not pending:
                continue
            bar.set_postfix_str(sample.id[-40:], refresh=False)
            for row in runner.run_sample(sample, pending, answers.get(sample.id)):
                log.append(row)
                written += 1
                bar.update(1)
                if on_row is not None:
                    on_row(row)
    rows = len(log.read())
    return EvalSummary(
        out=out,
        rows=rows,
        new_rows=written,
        samples=len(samples),
        configurations=len(configurations),
        seconds=time.perf_counter() - start,
    )
