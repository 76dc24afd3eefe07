"""``ripplekv generate``: answer a question about a long context with a compressed cache."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ripplekv.cli.args import (
    add_budget_args,
    add_model_args,
    load_profile,
    method_spec_arg,
    positive_int,
    resolve_budget,
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``generate`` subcommand to ``subparsers``; return its parser."""
    from ripplekv.inference.generate import PROTOCOLS
    from ripplekv.presses.registry import DEFAULT_WINDOW, METHODS

    g = subparsers.add_parser(
        "generate",
        help="answer a question about a long context with a compressed cache",
        description="Compress the prompt's KV cache with METHOD and decode greedily; prints the answer, "
        "the per-layer cache sizes and KV bytes against the full cache.",
    )
    add_model_args(g)
    g.add_argument(
        "--method",
        type=method_spec_arg,
        default="ripplekv",
        help=f"compression method, from {', '.join(METHODS)}, optionally with its parameters "
        "(ripplekv:r=16,gamma=12; default ripplekv, whose r and gamma are the profile's chosen setting unless given)",
    )
    g.add_argument(
        "--profile",
        default=None,
        help="profile JSON (required by ripplekv methods; they run its chosen r and gamma unless the method's name "
        "gives them)",
    )
    g.add_argument(
        "--strict-profile",
        action="store_true",
        help="a profile measured on other weights than the model's is an error, not a warning",
    )
    add_budget_args(g, default_budget=0.2)
    g.add_argument("--context-file", required=True, help="text file with the long context")
    g.add_argument("--question", required=True, help="the question")
    g.add_argument("--max-new-tokens", type=positive_int, default=64, help="answer length limit (default 64)")
    g.add_argument("--protocol", choices=PROTOCOLS, default="question-aware", help="default question-aware")
    g.add_argument("--window-size", type=positive_int, default=DEFAULT_WINDOW, help="SnapKV window (default 64)")
    g.add_argument("--json", action="store_true", help="print JSON")
    return g


def run(args: argparse.Namespace) -> int:
    """Run ``ripplekv generate`` with parsed ``args``: print the answer and cache sizes; return the exit status."""
    from ripplekv.inference.generate import generate_answer
    from ripplekv.models.loading import load_model
    from ripplekv.presses.method_spec import needs_profile
    from ripplekv.presses.registry import make_press
    from ripplekv.presses.ripplekv_press import press_setting

    profile = load_profile(args.profile, required=bool(needs_profile(args.method)))
    given = resolve_budget(args)  # {"budget": F} or {"tokens": N}
    press = make_press(
        args.method,
        **given,
        profile=profile,
        window_size=args.window_size,
        strict_profile=args.strict_profile,
    )
    applied = press_setting(press)  # a RippleKV press: its r, gamma and where they came from
    setting = (
        {} if applied is None else {"ratio": applied.ratio, "gamma": applied.gamma, "setting_source": applied.source}
    )
    context = Path(args.context_file).read_text()
    model, tokenizer = load_model(args.model, dtype=args.dtype, device=args.device)
    result = generate_answer(
        model, tokenizer, context, args.question, press, max_new_tokens=args.max_new_tokens, protocol=args.protocol
    )
    if args.json:
        print(
            json.dumps(
                {
                    "method": args.method,
                    **setting,
                    "budget": given.get("budget"),
                    "tokens": given.get("tokens"),
                    "answer": result.text,
                    "prompt_tokens": result.prompt_tokens,
                    "layer_tokens": list(result.layer_tokens),
                    "kv_bytes": result.kv_bytes,
                    "full_kv_bytes": result.full_kv_bytes,
                    "prefill_seconds": round(result.prefill_seconds, 3),
                    "decode_seconds": round(result.decode_seconds, 3),
                }
            )
        )
        return 0
    if applied is not None:
        print(f"{args.method}: {applied.describe()}")
    print(f"answer: {result.text}")
    print(f"prompt tokens: {result.prompt_tokens}; tokens kept per layer: {list(result.layer_tokens)}")
    print(
        f"KV cache: {result.kv_bytes / 2**20:.2f} MiB vs {result.full_kv_bytes / 2**20:.2f} MiB full "
        f"({100 * result.kv_fraction:.1f}%); prefill {result.prefill_seconds:.2f} s, "
        f"decode {result.decode_seconds:.2f} s"
    )
    return 0
