"""Cost of sensitivity profiling relative to plain prefills of the same contexts, measured side by side.

Profiling a sample costs one prefill plus, for each layer l, a continuation pass from layer l up.
This script times, in one run and on the same samples:

  A. plain prefills of every calibration context (what any use of the model pays anyway);
  B. ``profile_model`` on the same samples (prefill + all perturbed continuations);

and prints B / A (target <= 1.5 at 4K-token contexts with 32-token continuations).

    python benchmarks/profile_cost.py                      # SmolLM2-135M, 2 samples x 4096 tokens
    python benchmarks/profile_cost.py --samples 4 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import DynamicCache
from transformers.utils import logging as hf_logging

from ripplekv.models import load_model
from ripplekv.profiling import ProfilingConfig, profile_model
from ripplekv.profiling.calibration import default_calibration
from ripplekv.profiling.sensitivity import DEFAULT_ALPHA, DEFAULT_REPEATS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--context-tokens", type=int, default=4096)
    parser.add_argument("--continuation-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    parser.add_argument("--json", default=None, help="also write the measurements to this file")
    args = parser.parse_args()

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

    # A plain prefill as generation runs it: fill the cache, logits of the last position only.
    start = time.perf_counter()
    with torch.no_grad():
        for ids in contexts:
            model(ids, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
    prefill_s = time.perf_counter() - start

    config = ProfilingConfig(alpha=args.alpha, repeats=args.repeats)
    start = time.perf_counter()
    profile = profile_model(model, tokenizer, calibration, config)
    profile_s = time.perf_counter() - start

    layers = profile.num_layers
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
        "torch_threads": torch.get_num_threads(),
        "attention": model.config._attn_implementation,
    }
    print(
        f"model {args.model}: {layers} layers, {args.samples} samples of {result['context_tokens']} tokens, "
        f"{args.continuation_tokens}-token continuations, {args.repeats} noise draw(s) per layer"
    )
    print(f"plain prefills:  {prefill_s:8.2f} s")
    print(f"profiling:       {profile_s:8.2f} s")
    print(
        f"ratio profiling / prefills: {result['ratio']:.3f}   (target <= 1.5; {layers} full prefills per "
        f"sample would be ~{layers}x)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
