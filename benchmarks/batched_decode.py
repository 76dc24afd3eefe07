"""Sequential against batched decoding of every compressed configuration of one prompt, measured in one run.

For each prompt length, one needle prompt of essay text is prefilled once and recorded; a cache is derived for
the full cache and every (method, budget) (19 configurations with the defaults), then

(a) sequential: ``greedy_decode`` over each cache in turn (what ``ripplekv eval --decode sequential`` does);
(b) batched: ``batched_greedy_decode_rows`` over all of them laid out as one ragged batch (the eval runner's default).

Both decode exactly ``--new-tokens`` tokens per configuration (stop tokens are barred, ``min_new_tokens`` equal to
the length, so every row costs the same number of steps in both). The script prints both wall times, the speed-up
(a)/(b) (goal: at least 4x at 2K and 4K tokens on the 2-core CPU), and every configuration whose greedy tokens
differ, with the position of the first difference and the sequential run's top-1 minus top-2 logit margin there
(a difference is a float-rounding near-tie when that margin is tiny).

    python benchmarks/batched_decode.py                          # smollm2-135m, 2048 and 4096 tokens
    python benchmarks/batched_decode.py --lengths 1024 --new-tokens 8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from ripplekv.cli.args import method_list
from ripplekv.inference.generate import chat_prompt_parts, eos_ids, greedy_decode
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.loading import load_model
from ripplekv.presses.registry import make_press
from ripplekv.profiling.haystack import build_needle_prompt
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv_eval.fastpath.batched import batched_greedy_decode_rows, decode_row
from ripplekv_eval.fastpath.derive import derived_prefill
from ripplekv_eval.fastpath.fidelity import teacher_forced_logprobs
from ripplekv_eval.fastpath.record import record_prefill

DEFAULT_PROFILE = Path(__file__).parent / "results" / "smollm2-135m.profile.json"
DEFAULT_METHODS = "streamingllm,snapkv,pyramidkv,adakv,ripplekv,ripplekv-local"


def _margin(logprobs: torch.Tensor) -> float:
    top = torch.topk(logprobs, 2).values
    return float(top[0] - top[1])


def measure(model, tokenizer, profile, length: int, methods, budgets, new_tokens: int) -> dict:
    needle = build_needle_prompt(tokenizer, length, depth=0.5, seed=0, digits=4)
    head, tail = chat_prompt_parts(tokenizer, needle.context, needle.question)
    ids = tokenizer(head + tail, add_special_tokens=False, return_tensors="pt")["input_ids"]
    record = record_prefill(model, ids, hidden_tail=None)  # any --methods: every position kept
    configurations = [("full", 1.0)] + [(m, b) for m in methods for b in budgets]
    states = [derived_prefill(record, make_press(m, budget=b, profile=profile))[0] for m, b in configurations]
    stops = eos_ids(model, tokenizer)

    greedy_decode(model, states[0], 2, stops)  # warm-up of both paths
    batched_greedy_decode_rows(model, [decode_row(s, 2) for s in states[:2]], 2, stops, 0)

    start = time.perf_counter()
    sequential = [greedy_decode(model, s, new_tokens, stops, min_new_tokens=new_tokens) for s in states]
    sequential_seconds = time.perf_counter() - start
    start = time.perf_counter()
    rows = [decode_row(s, new_tokens) for s in states]
    batched = batched_greedy_decode_rows(model, rows, new_tokens, stops, min_new_tokens=new_tokens)
    batched_seconds = time.perf_counter() - start

    differing = []
    for (method, budget), state, seq, bat in zip(configurations, states, sequential, batched):
        if seq == bat:
            continue
        first = next(i for i, (a, b) in enumerate(zip(seq, bat)) if a != b)
        margin = _margin(teacher_forced_logprobs(model, state, seq)[first])
        differing.append({"method": method, "budget": budget, "first_difference": first, "margin": margin})
    tokens = sum(len(t) for t in sequential)
    return {
        "prompt_tokens": int(ids.shape[1]),
        "configurations": len(configurations),
        "new_tokens": new_tokens,
        "sequential_seconds": round(sequential_seconds, 3),
        "batched_seconds": round(batched_seconds, 3),
        "speedup": round(sequential_seconds / batched_seconds, 2),
        "sequential_ms_per_token": round(1000 * sequential_seconds / tokens, 2),
        "batched_ms_per_token": round(1000 * batched_seconds / tokens, 2),
        "differing_rows": differing,
        "differing_tokens": sum(a != b for seq, bat in zip(sequential, batched) for a, b in zip(seq, bat)),
        "tokens": tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--profile", default=str(DEFAULT_PROFILE), help="profile for the ripplekv methods")
    parser.add_argument("--lengths", default="2048,4096", help="prompt lengths in tokens (default 2048,4096)")
    parser.add_argument("--methods", default=DEFAULT_METHODS, help="compressed methods (full is always added)")
    parser.add_argument("--budgets", default="0.1,0.2,0.3")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens decoded per configuration (default 32)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = parser.parse_args()
    if args.new_tokens < 1:
        raise SystemExit("--new-tokens must be >= 1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model, tokenizer = load_model(args.model)
    enable_varlen_attention(model)
    methods = method_list(args.methods)
    budgets = tuple(float(b) for b in args.budgets.split(","))
    profile = SensitivityProfile.load(args.profile) if any(m.startswith("ripplekv") for m in methods) else None
    results = []
    for length in (int(x) for x in args.lengths.split(",")):
        numbers = measure(model, tokenizer, profile, length, methods, budgets, args.new_tokens)
        results.append(numbers)
        print(
            f"{numbers['prompt_tokens']} tokens, {numbers['configurations']} configurations x {args.new_tokens} "
            f"tokens: sequential {numbers['sequential_seconds']:.1f} s ({numbers['sequential_ms_per_token']:.1f} "
            f"ms/token), batched {numbers['batched_seconds']:.1f} s ({numbers['batched_ms_per_token']:.1f} ms/token)"
            f", speed-up {numbers['speedup']:.2f}x; differing tokens {numbers['differing_tokens']}/{numbers['tokens']}"
            f" in {len(numbers['differing_rows'])} configuration(s)"
        )
        for row in numbers["differing_rows"]:
            print(
                f"  {row['method']}@{row['budget']:g}: first difference at token {row['first_difference']}, "
                f"sequential top-1 - top-2 logit margin there {row['margin']:.2e}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
