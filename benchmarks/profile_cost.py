"""Cost of sensitivity profiling relative to plain prefills of the same contexts, measured side by side.

Profiling a sample costs one prefill plus, for each layer l, a continuation pass from layer l up.
This script times, in one run and on the same samples:

  A. plain prefills of every calibration context (what any use of the model pays anyway);
  B. the sensitivity pass of ``ripplekv profile`` on the same samples (prefill + all perturbed continuations);
  C. the choice of RippleKV's r and gamma that follows it (issue 44): every candidate of the grid compressed from the
     sensitivity pass's own prefills and teacher-forced, at 10/20/30%;

and prints B / A (target <= 1.5 at 4K-token contexts with 32-token continuations) and C / B (target <= 1: the
selection costs at most the sensitivity pass). ``--no-select-setting`` times A and B alone (``profile_model``).

On a shared machine other processes slow A and B unevenly, so A and B alternate for ``--rounds`` rounds and
the ratio is taken between the fastest A and the fastest B (the least disturbed runs); the process CPU time
of each is printed too.

    python benchmarks/profile_cost.py                      # SmolLM2-135M, 2 samples x 4096 tokens, 2 rounds
    python benchmarks/profile_cost.py --samples 4 --repeats 1 --rounds 3
    python benchmarks/profile_cost.py --samples 1 --context-tokens 1024 --rounds 1   # a quick check
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import DynamicCache
from transformers.utils import logging as hf_logging

from ripplekv.inference.setting import SELECTION_GAMMAS, SELECTION_RATIOS, SettingGrid, profile_with_setting
from ripplekv.models.loading import load_model
from ripplekv.profiling.calibration import default_calibration
from ripplekv.profiling.sensitivity import DEFAULT_ALPHA, DEFAULT_REPEATS, ProfilingConfig, profile_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--context-tokens", type=int, default=4096)
    parser.add_argument("--continuation-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of A and B (the fastest counts)")
    parser.add_argument("--json", default=None, help="also write the measurements to this file")
    parser.add_argument("--no-select-setting", action="store_true", help="time the sensitivity pass alone")
    parser.add_argument("--setting-ratios", default=",".join(f"{r:g}" for r in SELECTION_RATIOS))
    parser.add_argument("--setting-gammas", default=",".join(f"{g:g}" for g in SELECTION_GAMMAS))
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")

    hf_logging.disable_progress_bar()
    model, tokenizer = load_model(args.model)
    calibration = default_calibration(
        tokenizer,
        n_samples=args.samples,
        context_tokens=args.context_tokens,
        continuation_tokens=args.continuation_tokens,
    )
    contexts = [
        tokenizer(s.context, add_special_tokens=False, return_tensors="pt")["input_ids"] for s in calibration.samples
    ]
    with torch.no_grad():  # warm-up, not timed
        model(contexts[0][:, :256], past_key_values=DynamicCache(), logits_to_keep=1)

    def prefills() -> None:  # a plain prefill as generation runs it: fill the cache, logits of the last position
        with torch.no_grad():
            for ids in contexts:
                model(ids, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)

    config = ProfilingConfig(alpha=args.alpha, repeats=args.repeats)
    select = not args.no_select_setting
    grid = SettingGrid(
        tuple(float(v) for v in args.setting_ratios.split(",")), tuple(float(v) for v in args.setting_gammas.split(","))
    )
    rounds: list[dict[str, float]] = []
    selections: list[dict[str, object]] = []

    def profiling() -> float | None:
        """The sensitivity pass (timed by the caller) and, unless skipped, the selection's own seconds."""
        if not select:
            profile_model(model, tokenizer, calibration, config)
            return None
        run = profile_with_setting(model, tokenizer, calibration, config, grid)
        assert run.selection is not None
        setting = run.selection.setting
        selections.append(
            {
                "seconds": round(run.selection.seconds, 2),
                "reused": run.selection.reused,
                "prefilled": run.selection.prefilled,
                "caches": run.selection.caches,
                "ratio": setting.ratio,
                "gamma": setting.gamma,
            }
        )
        return run.selection.seconds

    for _ in range(args.rounds):
        timing: dict[str, float] = {}
        wall, cpu = time.perf_counter(), time.process_time()
        prefills()
        timing["prefill_s"], timing["prefill_cpu_s"] = time.perf_counter() - wall, time.process_time() - cpu
        wall, cpu = time.perf_counter(), time.process_time()
        selection_s = profiling()
        total, total_cpu = time.perf_counter() - wall, time.process_time() - cpu
        if selection_s is None:
            timing["profiling_s"], timing["profiling_cpu_s"] = total, total_cpu
        else:  # the selection's CPU time taken as its wall share of the whole (it runs right after the pass)
            timing["profiling_s"], timing["selection_s"] = total - selection_s, selection_s
            timing["profiling_cpu_s"] = total_cpu * (total - selection_s) / total
            timing["selection_cpu_s"] = total_cpu * selection_s / total
        rounds.append({k: round(v, 2) for k, v in timing.items()})
        print(f"round {len(rounds)}: " + ", ".join(f"{k} {v:.1f}" for k, v in rounds[-1].items()), flush=True)
    prefill_s = min(r["prefill_s"] for r in rounds)
    profile_s = min(r["profiling_s"] for r in rounds)
    cpu_ratio = min(r["profiling_cpu_s"] for r in rounds) / min(r["prefill_cpu_s"] for r in rounds)
    selection_s = min(r["selection_s"] for r in rounds) if select else None

    layers = len(model.get_decoder().layers)
    result = {
        "model": args.model,
        "samples": args.samples,
        "context_tokens": [int(ids.shape[1]) for ids in contexts],
        "continuation_tokens": args.continuation_tokens,
        "layers": layers,
        "repeats": args.repeats,
        "plain_prefill_s": round(prefill_s, 2),
        "profiling_s": round(profile_s, 2),
        "ratio": round(profile_s / prefill_s, 3),
        "cpu_ratio": round(cpu_ratio, 3),
        **(
            {}
            if selection_s is None
            else {
                "selection_s": round(selection_s, 2),
                "selection_ratio": round(selection_s / profile_s, 3),
                "selection_grid": {
                    "ratios": list(grid.ratios),
                    "gammas": list(grid.gammas),
                    "budgets": list(grid.budgets),
                },
                "selections": selections,
            }
        ),
        "rounds": rounds,
        "torch_threads": torch.get_num_threads(),
        "attention": model.config._attn_implementation,
    }
    print(
        f"model {args.model}: {layers} layers, {args.samples} samples of {result['context_tokens']} tokens, "
        f"{args.continuation_tokens}-token continuations, {args.repeats} noise draw(s) per layer"
    )
    print(f"plain prefills:  {prefill_s:8.2f} s (fastest of {args.rounds})")
    print(f"profiling:       {profile_s:8.2f} s (fastest of {args.rounds})")
    print(
        f"ratio profiling / prefills: {result['ratio']:.3f}   (target <= 1.5; {layers} full prefills per "
        f"sample would be ~{layers}x)"
    )
    print(f"ratio of process CPU times:  {cpu_ratio:.3f}")
    if selection_s is not None:
        last = selections[-1]
        print(
            f"setting selection: {selection_s:8.2f} s (fastest of {args.rounds}; {len(grid.candidates)} candidates x "
            f"{len(grid.budgets)} budgets, {last['caches']} caches scored, {last['reused']} prefills reused, "
            f"{last['prefilled']} prefilled again; chose r {last['ratio']:g}, gamma {last['gamma']:g})"
        )
        print(f"ratio selection / sensitivity pass: {selection_s / profile_s:.3f}   (target <= 1)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
