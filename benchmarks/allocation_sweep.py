"""Which disparity ``r`` and clip ``gamma`` should RippleKV use by default? Measured, side by side.

For held-out essay windows (a different seed from the calibration set), each configuration compresses
the context's KV cache at the given budget (query-agnostic: SnapKV's window is the end of the context),
then the true continuation is teacher-forced over the compressed cache. Reported per configuration:

  KL   mean KL(P_full || P_compressed) of the continuation's next-token distributions (lower is better)
  NLL  mean negative log-likelihood of the true continuation tokens (lower is better)
  vs uniform   KL relative to SnapKV with uniform budgets (r = 1), the baseline RippleKV modifies

    python benchmarks/allocation_sweep.py --profile smollm2.profile.json          # ~7 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import json
import time
from itertools import product

import torch
from transformers.utils import logging as hf_logging

from ripplekv.cli.demo import cached_default_profile
from ripplekv.inference.generate import prefill
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.loading import load_model
from ripplekv.presses.registry import make_press
from ripplekv.profiling.calibration import default_calibration
from ripplekv.profiling.profile import SensitivityProfile


@torch.no_grad()
def continuation_logprobs(model, state, continuation: torch.Tensor) -> torch.Tensor:
    """Log-probabilities (T, V) of the next token at every continuation position, teacher-forced."""
    positions = torch.arange(state.prompt_tokens, state.prompt_tokens + continuation.shape[1])
    logits = model(
        continuation, past_key_values=state.cache, cache_position=positions, position_ids=positions[None]
    ).logits[0]
    # position i predicts continuation token i + 1; the prefill's last logits predict token 0
    return torch.cat([state.next_logits[None], logits[:-1]]).float().log_softmax(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--profile", default=None, help="profile JSON (default: the cached default profile)")
    parser.add_argument("--budget", type=float, default=0.1)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--context-tokens", type=int, default=2048)
    parser.add_argument("--continuation-tokens", type=int, default=64)
    parser.add_argument("--ratios", default="2,4,8,16")
    parser.add_argument("--gammas", default="2,3,5")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    hf_logging.disable_progress_bar()
    model, tokenizer = load_model(args.model)
    enable_varlen_attention(model)
    profile = SensitivityProfile.load(args.profile) if args.profile else cached_default_profile(model, tokenizer)
    held_out = default_calibration(
        tokenizer,
        n_samples=args.samples,
        context_tokens=args.context_tokens,
        continuation_tokens=args.continuation_tokens,
        seed=1,
    )
    configs: list[tuple[str, dict]] = [("snapkv (uniform)", {"name": "snapkv"}), ("pyramidkv", {"name": "pyramidkv"})]
    for r, g in product([float(x) for x in args.ratios.split(",")], [float(x) for x in args.gammas.split(",")]):
        configs.append((f"ripplekv r={r:g} gamma={g:g}", {"name": "ripplekv", "ratio": r, "gamma": g}))
    configs.append(("ripplekv-local r=4 gamma=3", {"name": "ripplekv-local", "ratio": 4.0, "gamma": 3.0}))

    totals = {label: {"kl": 0.0, "nll": 0.0} for label, _ in configs}
    full_nll = 0.0
    start = time.perf_counter()
    for sample in held_out.samples:
        encode = lambda text: tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]  # noqa: E731
        context, continuation = encode(sample.context), encode(sample.continuation)
        targets = continuation[0]
        ref = continuation_logprobs(model, prefill(model, context), continuation)
        full_nll += float(-ref.gather(1, targets[:, None]).mean())
        for label, spec in configs:
            spec = dict(spec)
            press = make_press(spec.pop("name"), budget=args.budget, profile=profile, **spec)
            logp = continuation_logprobs(model, prefill(model, context, press), continuation)
            totals[label]["kl"] += float((ref.exp() * (ref - logp)).sum(-1).mean())
            totals[label]["nll"] += float(-logp.gather(1, targets[:, None]).mean())
        print(f"sample done ({time.perf_counter() - start:.0f} s)", flush=True)

    n = len(held_out)
    uniform_kl = totals["snapkv (uniform)"]["kl"] / n
    rows = []
    print(
        f"\n{args.model}, budget {args.budget:g}, {n} held-out samples of {args.context_tokens} tokens + "
        f"{args.continuation_tokens}-token continuations; full-cache NLL {full_nll / n:.4f}\n"
    )
    print(f"{'configuration':<28} {'KL':>8} {'NLL':>8} {'KL vs uniform':>14}")
    for label, _ in configs:
        kl, nll = totals[label]["kl"] / n, totals[label]["nll"] / n
        rows.append({"configuration": label, "kl": kl, "nll": nll, "kl_vs_uniform": kl / uniform_kl})
        print(f"{label:<28} {kl:8.4f} {nll:8.4f} {kl / uniform_kl:14.3f}")
    print(f"\nwall time {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "full_nll": full_nll / n, "rows": rows}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
