"""Needle retrieval under KV-cache compression, every method side by side, plus RippleKV's (r, gamma) grid.

Needles ("The special magic number for <city> is <number>.") are placed at evenly spaced depths in real
essay text of the given lengths (tokens). Each method compresses the whole prompt (question-aware
protocol: SnapKV's window holds the question), then decodes greedily; a needle counts as retrieved when
the number appears in the answer as a whole number (not inside a longer run of digits). The full cache is
run once per needle as the reference. ``--json`` also stores every answer.

    python benchmarks/needle_sweep.py --profile benchmarks/results/smollm2-135m.profile.json
    python benchmarks/needle_sweep.py --profile P.json --grid     # also r in 2,4,8,16 x gamma in 2,3,5
"""

from __future__ import annotations

import argparse
import json
import time
from itertools import product

from transformers.utils import logging as hf_logging

from ripplekv.inference.generate import generate_answer
from ripplekv.models.loading import load_model
from ripplekv.presses.registry import make_press
from ripplekv.profiling.haystack import build_needle_prompt
from ripplekv.profiling.profile import SensitivityProfile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--profile", required=True)
    parser.add_argument("--lengths", default="500,1000", help="context lengths in tokens")
    parser.add_argument("--needles", type=int, default=6, help="needles (depths) per length")
    parser.add_argument("--digits", type=int, default=4)
    parser.add_argument("--budgets", default="0.2,0.5")
    parser.add_argument("--methods", default="snapkv,pyramidkv,ripplekv,ripplekv-local,streamingllm")
    parser.add_argument("--grid", action="store_true", help="also sweep RippleKV's ratio and gamma")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    hf_logging.disable_progress_bar()
    model, tokenizer = load_model(args.model)
    profile = SensitivityProfile.load(args.profile)
    budgets = [float(b) for b in args.budgets.split(",")]
    configs: list[tuple[str, str, dict]] = [(m, m, {}) for m in args.methods.split(",")]
    if args.grid:
        for r, g in product((2.0, 4.0, 8.0, 16.0), (2.0, 3.0, 5.0)):
            configs.append((f"ripplekv r={r:g} gamma={g:g}", "ripplekv", {"ratio": r, "gamma": g}))

    needles = [
        build_needle_prompt(
            tokenizer, length, depth=(i + 0.5) / args.needles, seed=1000 * length + i, digits=args.digits
        )
        for length in (int(x) for x in args.lengths.split(","))
        for i in range(args.needles)
    ]
    hits = {(label, b): 0 for label, _, _ in configs for b in budgets}
    full_hits = 0
    predictions: list[dict] = []  # every answer, so a run can be re-scored or audited later
    start = time.perf_counter()
    for n, needle in enumerate(needles):
        full = generate_answer(model, tokenizer, needle.context, needle.question, make_press("full"), 16)
        full_hits += needle.retrieved(full.text)
        predictions.append({"needle": n, "answer": needle.answer, "method": "full", "budget": 1.0, "text": full.text})
        for (label, name, extra), budget in product(configs, budgets):
            press = make_press(name, budget=budget, profile=profile, **extra)
            result = generate_answer(model, tokenizer, needle.context, needle.question, press, 16)
            hits[(label, budget)] += needle.retrieved(result.text)
            predictions.append(
                {"needle": n, "answer": needle.answer, "method": label, "budget": budget, "text": result.text}
            )
        print(
            f"needle {n + 1}/{len(needles)} ({needle.context_tokens} tokens, depth {needle.depth:.2f}) "
            f"{time.perf_counter() - start:.0f} s",
            flush=True,
        )

    total = len(needles)
    print(
        f"\n{args.model}: {total} needles ({args.digits}-digit numbers) in {args.lengths}-token essay "
        f"contexts, question-aware; retrieved / {total}\n"
    )
    print(f"{'method':<28} " + " ".join(f"{'b=' + str(b):>7}" for b in budgets))
    print(f"{'full cache':<28} " + " ".join(f"{full_hits:>7}" for _ in budgets))
    rows = [{"method": "full", "budget": 1.0, "retrieved": full_hits, "needles": total}]
    for label, _, _ in configs:
        print(f"{label:<28} " + " ".join(f"{hits[(label, b)]:>7}" for b in budgets))
        rows += [{"method": label, "budget": b, "retrieved": hits[(label, b)], "needles": total} for b in budgets]
    print(f"\nwall time {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "predictions": predictions}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
