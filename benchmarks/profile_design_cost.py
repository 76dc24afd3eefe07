"""Profiling cost of each profile-design variant, against plain prefills of the same prompts, side by side.

Issue 8 bounds a profile's cost at 1.5 times the plain prefills of its calibration prompts. The variants are those
of ``benchmarks/results/profiles/COMMAND.sh``; each is timed here on the same number of calibration samples:

  A. plain prefills of the variant's prompts (as generation runs them: cache filled, last-position logits);
  B. the variant's profiling of the same samples:
     - noise variants: :func:`ripplekv.profiling.profile_model` (prefill, the model's own answer when the variant
       uses it, and every layer's perturbed continuation);
     - ``evict-qa``: the damage profile at one budget, as ``ripplekv analyze`` measures it (prefill, the model's
       own answer, its teacher-forced reference, and one pass per layer with that layer alone evicted by SnapKV).

A and B alternate for ``--rounds`` rounds per variant; the fastest of each counts (the least disturbed run). The
ratio B / A is what the bound is about. Run it on an otherwise idle machine.

    python benchmarks/profile_design_cost.py --qa-calib benchmarks/results/profiles/calib-qa.jsonl
    python benchmarks/profile_design_cost.py --qa-calib ... --variants default,qa-model --samples 2 --rounds 1
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.utils import logging as hf_logging

from ripplekv.inference.generate import eos_ids, greedy_decode
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.loading import load_model
from ripplekv.presses.registry import make_press
from ripplekv.profiling.calibration import load_calibration
from ripplekv.profiling.sensitivity import ProfilingConfig, calibration_ids, profile_model
from ripplekv_eval.analysis.damage import DAMAGE_METHOD, layer_damage
from ripplekv_eval.fastpath.derive import derived_prefill
from ripplekv_eval.fastpath.fidelity import teacher_forced_logprobs
from ripplekv_eval.fastpath.record import record_prefill
from ripplekv_eval.sample import MIN_NEW_TOKENS


@dataclass(frozen=True)
class Variant:
    """One profile-design variant: its calibration data and continuation, and its perturbation."""

    calib: str  # "essays" or "qa"
    continuation: str = "text"  # "text" (teacher-forced) or "model" (the model's own answer)
    continuation_tokens: int = 32
    alpha: float = 0.5
    evict: bool = False  # the layer's cache evicted by SnapKV instead of noise
    max_continuation_tokens: int | None = None  # text continuations cut to this many tokens


VARIANTS: dict[str, Variant] = {
    "default": Variant("essays"),
    "essays-cont8": Variant("essays", continuation_tokens=8),
    "essays-cont128": Variant("essays", continuation_tokens=128),
    "essays-model": Variant("essays", continuation="model"),
    "qa-gold": Variant("qa"),
    "qa-gold32": Variant("qa", max_continuation_tokens=32),
    "qa-model": Variant("qa", continuation="model"),
    "evict-qa": Variant("qa", continuation="model", evict=True),
}


def timed(run: Callable[[], Any]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def plain_prefills(model: Any, prompts: list[torch.Tensor]) -> None:
    """Prefill every prompt as generation does: fill a cache, logits of the last position only."""
    with torch.no_grad():
        for ids in prompts:
            model(ids, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)


def evict_profiling(model: Any, tokenizer: Any, prompts: list[torch.Tensor], args: argparse.Namespace) -> None:
    """The evict-qa damage profile of ``prompts`` at ``args.evict_budget``, as ``ripplekv analyze`` measures it."""
    stops = eos_ids(model, tokenizer)
    full_press = make_press("full")
    press = make_press(DAMAGE_METHOD, budget=args.evict_budget)
    for ids in prompts:
        record = record_prefill(model, ids)
        full, _ = derived_prefill(record, full_press)
        tokens = greedy_decode(model, full, args.answer_tokens, stops, min_new_tokens=MIN_NEW_TOKENS)
        reference = teacher_forced_logprobs(model, full, tokens)
        layer_damage(model, record, press, reference, tokens, stops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--qa-calib", required=True, help="the QA calibration JSONL (context, question, continuation)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--samples", type=int, default=4, help="calibration samples per variant (default 4)")
    parser.add_argument("--context-tokens", type=int, default=2048, help="essay context length (default 2048)")
    parser.add_argument("--answer-tokens", type=int, default=32, help="cap on the model's own answer (default 32)")
    parser.add_argument("--evict-budget", type=float, default=0.1, help="budget of the evict-qa damage (0.1)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of A and B (the fastest counts)")
    parser.add_argument("--json", default=None, help="also write the measurements to this file")
    args = parser.parse_args()
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    if args.rounds < 1 or args.samples < 1:
        parser.error("--rounds and --samples must be >= 1")
    names.sort(key=lambda n: VARIANTS[n].evict)  # evict last: it switches the model to variable-length attention

    hf_logging.disable_progress_bar()
    model, tokenizer = load_model(args.model)
    with torch.no_grad():  # warm-up, not timed
        model(torch.tensor([[1] * 256]), past_key_values=DynamicCache(), logits_to_keep=1)
    results: list[dict[str, Any]] = []
    for name in names:
        variant = VARIANTS[name]
        calibration = load_calibration(
            None if variant.calib == "essays" else args.qa_calib,
            tokenizer,
            args.samples,
            args.context_tokens,
            variant.continuation_tokens,
            0,
        )
        config = ProfilingConfig(
            alpha=variant.alpha,
            continuation=variant.continuation,
            answer_tokens=args.answer_tokens,
            max_continuation_tokens=variant.max_continuation_tokens,
        )
        pairs = [calibration_ids(model, tokenizer, s, config) for s in calibration.samples]
        prompts = [context for context, _ in pairs]
        # teacher-forced continuation lengths; the model's own answers are at most --answer-tokens long
        forced = [None if cont is None else int(cont.shape[1]) for _, cont in pairs]
        if variant.evict:
            enable_varlen_attention(model)
            profiling = functools.partial(evict_profiling, model, tokenizer, prompts, args)
        else:
            profiling = functools.partial(profile_model, model, tokenizer, calibration, config)
        prefills = functools.partial(plain_prefills, model, prompts)

        rounds = []
        for _ in range(args.rounds):
            (a, a_cpu), (b, b_cpu) = timed(prefills), timed(profiling)
            rounds.append(
                {
                    "prefill_s": round(a, 2),
                    "prefill_cpu_s": round(a_cpu, 2),
                    "profiling_s": round(b, 2),
                    "profiling_cpu_s": round(b_cpu, 2),
                }
            )
            print(
                f"{name} round {len(rounds)}: " + ", ".join(f"{k} {v:.1f}" for k, v in rounds[-1].items()), flush=True
            )
        prefill_s = min(r["prefill_s"] for r in rounds)
        profile_s = min(r["profiling_s"] for r in rounds)
        results.append(
            {
                "variant": name,
                "calibration": calibration.description,
                "prompt_tokens": [int(ids.shape[1]) for ids in prompts],
                "continuation": variant.continuation,
                "continuation_tokens": forced if variant.continuation == "text" else f"<= {args.answer_tokens}",
                "perturbation": f"evict ({DAMAGE_METHOD}, budget {args.evict_budget})" if variant.evict else "noise",
                "plain_prefill_s": prefill_s,
                "profiling_s": profile_s,
                "ratio": round(profile_s / prefill_s, 3),
                "within_1_5": profile_s / prefill_s <= 1.5,
                "rounds": rounds,
            }
        )

    print(f"\nmodel {args.model}, {args.samples} samples per variant, fastest of {args.rounds} round(s)")
    print(f"{'variant':16s} {'prompt tokens':>14s} {'prefills s':>10s} {'profiling s':>11s} {'ratio':>6s}  <= 1.5")
    for r in results:
        mean_tokens = sum(r["prompt_tokens"]) / len(r["prompt_tokens"])
        print(
            f"{r['variant']:16s} {mean_tokens:14.0f} {r['plain_prefill_s']:10.2f} {r['profiling_s']:11.2f} "
            f"{r['ratio']:6.2f}  {'yes' if r['within_1_5'] else 'NO'}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "model": args.model,
                    "samples": args.samples,
                    "rounds": args.rounds,
                    "torch_threads": torch.get_num_threads(),
                    "variants": results,
                },
                f,
                indent=2,
            )
            f.write("\n")


if __name__ == "__main__":
    main()
