"""Argument types and option groups shared by the ``ripplekv`` commands (imported at start-up: nothing heavy at its
top; argparse prints a ``type``'s ``__name__`` when it rejects a value)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ripplekv.profiling.profile import SensitivityProfile


def budget_arg(text: str) -> float:
    """An argparse ``type``: a kept fraction in (0, 1] (``--budget``, ``--budgets``); token counts are ``--tokens``."""
    return _kept_fraction(text, tokens_hint=True)


def fraction_arg(text: str) -> float:
    """An argparse ``type``: a kept fraction in (0, 1], for a command without ``--tokens`` (``demo``)."""
    return _kept_fraction(text, tokens_hint=False)


def _kept_fraction(text: str, tokens_hint: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"budget must be a number, got {text!r}") from None
    if value > 1:
        hint = f"--tokens {int(value)}" if value.is_integer() else "--tokens N (a whole number)"
        tokens = f"; for an average number of tokens per layer use {hint}" if tokens_hint else ""
        raise argparse.ArgumentTypeError(
            f"budget {text} is above 1: a budget is a kept fraction in (0, 1] (0.1 = 10%){tokens}"
        )
    if not (value > 0):  # also NaN
        raise argparse.ArgumentTypeError(f"budget {text} out of range: a kept fraction in (0, 1] (0.1 = 10%)")
    return value


def tokens_arg(text: str) -> int:
    """An argparse ``type``: an average number of kept tokens per layer, a whole number >= 1 (``--tokens``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"tokens must be a whole number of tokens per layer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"tokens must be >= 1 (tokens kept per layer on average), got {text}")
    return value


def row_tokens_arg(text: str) -> int:
    """An argparse ``type``: a token count of a run whose rows store budgets as numbers (``eval``, ``analyze``,
    ``tune``): a whole number >= 2, since 1 would read back as the kept fraction 1.0 (the full cache's budget)."""
    value = tokens_arg(text)
    if value < 2:
        raise argparse.ArgumentTypeError(
            f"--tokens {text}: results rows store a budget as one number, and {value} is the kept fraction 1.0 "
            "(the full cache's row); use 2 or more tokens per layer (or --budgets 1.0 to keep everything)"
        )
    return value


def add_budget_args(parser: argparse.ArgumentParser, default_budget: float | None = None) -> None:
    """Add ``--budget F`` and ``--tokens N``, mutually exclusive; one is required unless ``default_budget`` is set."""
    group = parser.add_mutually_exclusive_group(required=default_budget is None)
    default = "" if default_budget is None else f" (default {default_budget:g} when --tokens is not given)"
    group.add_argument(
        "--budget", type=budget_arg, default=None, help=f"kept fraction of the prompt in (0, 1], 0.1 = 10%%{default}"
    )
    group.add_argument(
        "--tokens", type=tokens_arg, default=None, help="instead of --budget: average tokens kept per layer (>= 1)"
    )
    parser.set_defaults(default_budget=default_budget)


def resolve_budget(args: argparse.Namespace) -> dict[str, float | int]:
    """``{"budget": F}`` or ``{"tokens": N}`` of :func:`add_budget_args`' options (for ``make_press`` and schedules)."""
    if args.tokens is not None:
        return {"tokens": int(args.tokens)}
    budget = args.budget if args.budget is not None else args.default_budget
    return {"budget": float(budget)}


def resolve_budgets(args: argparse.Namespace, default: tuple[float, ...]) -> tuple[float, ...]:
    """The fractions of ``--budgets`` as given; else ``default``, unless ``--tokens`` was given alone."""
    if args.budgets is not None:
        return tuple(args.budgets)
    return () if args.tokens else tuple(default)


_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30}


def memory_size(text: str) -> int:
    """An argparse ``type``: bytes from a number with an optional binary unit (``512MiB``, ``1.5G``, ``K``, ``B``)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in _UNITS:
        raise argparse.ArgumentTypeError(f"expected a size such as 2GiB, 512MiB or a number of bytes, got {text!r}")
    size = float(match.group(1)) * _UNITS[match.group(2)]
    if not math.isfinite(size) or size < 1:
        raise argparse.ArgumentTypeError(f"the size must be at least one byte, got {text!r}")
    return int(size)


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def comma_list(kind: Callable[[str], Any], name: str) -> Callable[[str], tuple[Any, ...]]:
    """An argparse ``type`` for a comma-separated list whose items are parsed by ``kind``."""

    def parse(text: str) -> tuple[Any, ...]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {name}, got {text!r}")
        try:
            return tuple(kind(item) for item in items)
        except (ValueError, argparse.ArgumentTypeError) as err:
            raise argparse.ArgumentTypeError(f"bad {name} list {text!r}: {err}") from None

    return parse


def method_list(text: str) -> tuple[str, ...]:
    """An argparse ``type``: comma-separated method specs in canonical form (``key=value`` items continue the method
    before them, :func:`ripplekv.presses.method_lists.split_method_list`)."""
    from ripplekv.presses.method_lists import split_method_list
    from ripplekv.presses.method_spec import parse_method

    try:
        return tuple(parse_method(item).canonical() for item in split_method_list(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def method_spec_arg(text: str) -> str:
    """An argparse ``type``: one method spec (``cake:tau1=2,tau2=0.5``), in its canonical form."""
    from ripplekv.presses.method_spec import parse_method

    try:
        return parse_method(text).canonical()
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--model``, ``--dtype`` and ``--device`` to ``parser``."""
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help="HF directory, hub id, .gguf file, or an alias: smollm2-135m (default), gemma3-270m, qwen2.5-coder-0.5b",
    )
    parser.add_argument("--dtype", default=None, help="float32 (CPU default), bfloat16, float16")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")


def add_ray_args(parser: argparse.ArgumentParser, units: str) -> None:
    """Add ``--workers`` and ``--ray-address`` to ``parser``; ``units`` names what the workers share."""
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help=f"Ray actors sharing the {units}, one model each (default 1: in this process, without Ray); needs "
        "pip install 'ripplekv[ray]'",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to run the workers on (auto, HOST:6379, ray://HOST:10001; default: a local cluster)",
    )


def on_ray(args: argparse.Namespace) -> bool:
    """Whether a command given :func:`add_ray_args`'s options runs on Ray (``--workers N > 1`` or an address)."""
    return args.workers > 1 or args.ray_address is not None


def load_profile(path: str | None, required: bool) -> SensitivityProfile | None:
    """The profile at ``path``; None when no path is given, unless ``required`` (then exit with an error)."""
    from ripplekv.profiling.profile import SensitivityProfile

    if path is None:
        if required:
            raise SystemExit("error: this method needs --profile (make one with `ripplekv profile`)")
        return None
    return SensitivityProfile.load(path)


def prefill_chunk_arg(text: str) -> int | None:
    """``--prefill-chunk``: an integer >= 1 (tokens per prefill pass) or ``none`` (one pass whatever the length)."""
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 (tokens per chunk) or none, got {text!r}")
    return value
