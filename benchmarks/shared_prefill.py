"""Shared prefill vs one prefill per configuration, on the same needle prompts, measured in one run.

(a) ``ripplekv eval``'s runner: each sample is prefilled once and every (method, budget) cache is derived from
    that prefill (:mod:`ripplekv_eval.fastpath`), then decoded;
(b) the plain way: ``generate_answer`` per (sample, method, budget), each with its own prefill.

Both decode greedily for the same number of tokens (``--max-new-tokens``, small so the prefill dominates), on the
same prompts (needles at evenly spaced depths in ``--context-tokens`` tokens of essay text). The script prints both
wall times, the speed-up (b)/(a), and how many answers agree (they should all: the derived caches equal direct
prefills tensor for tensor).

    python benchmarks/shared_prefill.py                      # smollm2-135m, 2 needles of 2048 tokens
    python benchmarks/shared_prefill.py --samples 1 --context-tokens 1024 --budgets 0.1,0.3
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from ripplekv.inference.generate import generate_answer
from ripplekv.models.loading import load_model
from ripplekv.presses.registry import make_press
from ripplekv.profiling.haystack import build_needle_prompt
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.results import RESULTS_FILE, ResultsLog
from ripplekv_eval.running.runner import run_eval

DEFAULT_PROFILE = Path(__file__).parent / "results" / "smollm2-135m.profile.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--profile", default=str(DEFAULT_PROFILE), help="profile for the ripplekv methods")
    parser.add_argument("--samples", type=int, default=2, help="needle prompts (default 2)")
    parser.add_argument("--context-tokens", type=int, default=2048, help="needle context length (default 2048)")
    parser.add_argument("--methods", default="full,snapkv,pyramidkv,ripplekv")
    parser.add_argument("--budgets", default="0.1,0.2,0.3")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--digits", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = parser.parse_args()
    if args.samples < 1:
        raise SystemExit("--samples must be >= 1")

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    model, tokenizer = load_model(args.model)
    methods = tuple(m.strip() for m in args.methods.split(","))
    budgets = tuple(float(b) for b in args.budgets.split(","))
    needs_profile = any(m.startswith("ripplekv") for m in methods)
    profile = SensitivityProfile.load(args.profile) if needs_profile else None
    depths = tuple(round((i + 0.5) / args.samples, 4) for i in range(args.samples))
    config = EvalConfig(
        suite="needle",
        model=args.model,
        methods=methods,
        budgets=budgets,
        profile=args.profile if needs_profile else None,
        options={"needle_lengths": (args.context_tokens,), "needle_depths": depths, "needle_digits": args.digits},
        max_new_tokens=args.max_new_tokens,
    )
    configurations = config.configurations
    print(
        f"{args.model}: {args.samples} needle prompt(s) of {args.context_tokens} tokens x {len(configurations)} "
        f"configurations ({', '.join(f'{m}@{b:g}' for m, b in configurations)}), {args.max_new_tokens} new tokens"
    )
    warm = tokenizer("warm up " * 64, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        model(warm)

    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        summary = run_eval(config, Path(folder) / "run", model, tokenizer, progress=False)
        shared_seconds = time.perf_counter() - start
        rows = ResultsLog(Path(folder) / "run" / RESULTS_FILE).read()
    shared_answers = {(r["meta"]["depth"], r["method"], r["budget"]): r["prediction"].strip() for r in rows}
    print(f"(a) shared prefill (runner, {summary.rows} rows): {shared_seconds:.1f} s")

    start = time.perf_counter()
    agree = 0
    for depth in depths:
        needle = build_needle_prompt(tokenizer, args.context_tokens, depth=depth, seed=0, digits=args.digits)
        for method, budget in configurations:
            press = make_press(method, budget=budget, profile=profile)
            result = generate_answer(
                model, tokenizer, needle.context, needle.question, press, max_new_tokens=args.max_new_tokens
            )
            agree += result.text == shared_answers[depth, method, budget]
    separate_seconds = time.perf_counter() - start
    total = len(depths) * len(configurations)
    print(f"(b) one prefill per configuration (generate_answer x {total}): {separate_seconds:.1f} s")
    speedup = separate_seconds / shared_seconds
    print(f"speed-up (b)/(a): {speedup:.2f}x; identical answers: {agree}/{total}")
    if args.json:
        numbers = {
            "model": args.model,
            "samples": args.samples,
            "context_tokens": args.context_tokens,
            "configurations": [[m, b] for m, b in configurations],
            "max_new_tokens": args.max_new_tokens,
            "shared_seconds": round(shared_seconds, 2),
            "separate_seconds": round(separate_seconds, 2),
            "speedup": round(speedup, 2),
            "identical_answers": agree,
            "answers": total,
        }
        Path(args.json).write_text(json.dumps(numbers, indent=2) + "\n")


if __name__ == "__main__":
    main()
