"""Argument types and option groups shared by the ``ripplekv`` commands, and ``--profile`` loading.

Imported by every command module at start-up, so it imports nothing heavy at its top. The argparse ``type``
functions keep their names: argparse prints a type's ``__name__`` when it rejects a value (``invalid
_positive_int value: 'x'``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ripplekv.profiling import SensitivityProfile

__all__ = ["_add_model_args", "_add_ray_args", "_budget", "_comma_list", "_load_profile", "_on_ray", "_positive_int"]


def _budget(text: str) -> float:
    """An argparse ``type``: a kept fraction in (0, 1] or a whole token count > 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"budget must be a number, got {text!r}") from None
    if not (value > 0) or (value > 1 and not value.is_integer()):
        raise argparse.ArgumentTypeError(
            f"budget {text} out of range: a kept fraction in (0, 1] (0.1 = 10%) or a whole token count > 1"
        )
    return value


def _positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def _comma_list(kind: Callable[[str], Any], name: str) -> Callable[[str], tuple[Any, ...]]:
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


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--model``, ``--dtype`` and ``--device`` to ``parser``."""
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help="HF directory, hub id, .gguf file, or the alias smollm2-135m (default)",
    )
    parser.add_argument("--dtype", default=None, help="float32 (CPU default), bfloat16, float16")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")


def _add_ray_args(parser: argparse.ArgumentParser, units: str) -> None:
    """Add ``--workers`` and ``--ray-address`` to ``parser``; ``units`` names what the workers share."""
    parser.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help=f"Ray actors sharing the {units}, one model each (default 1: in this process, without Ray); needs "
        "pip install 'ripplekv[ray]'",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to run the workers on (auto, HOST:6379, ray://HOST:10001; default: a local cluster)",
    )


def _on_ray(args: argparse.Namespace) -> bool:
    """Whether a command given :func:`_add_ray_args`'s options runs on Ray (``--workers N > 1`` or an address)."""
    return args.workers > 1 or args.ray_address is not None


def _load_profile(path: str | None, required: bool) -> SensitivityProfile | None:
    """The profile at ``path``; None when no path is given, unless ``required`` (then exit with an error)."""
    from ripplekv.profiling import SensitivityProfile

    if path is None:
        if required:
            raise SystemExit("error: this method needs --profile (make one with `ripplekv profile`)")
        return None
    return SensitivityProfile.load(path)


def suite_options(args: argparse.Namespace) -> dict[str, Any]:
    """Every suite's own options that were given on the command line (the chosen suite refuses others)."""
    import dataclasses

    from ripplekv.evaluation.suites import SUITES

    names = {f.name for suite in SUITES.values() for f in dataclasses.fields(suite.options_type)}
    return {name: getattr(args, name) for name in sorted(names) if getattr(args, name, None) is not None}
