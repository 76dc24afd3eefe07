"""Several method specs in one command-line argument: a comma-separated list, or a grid of values to try."""

from __future__ import annotations

import itertools

from ripplekv.presses.method_spec import PARAM_SEPARATOR, MethodSpec, parse_method

__all__ = ["GRID_SEPARATOR", "expand_grid", "split_method_list"]

GRID_SEPARATOR = "|"


def split_method_list(text: str) -> list[str]:
    """The methods of a comma-separated list, where a ``key=value`` item continues the method before:
    ``"full,ripplekv:r=16,gamma=12,cake"`` -> ``["full", "ripplekv:r=16,gamma=12", "cake"]``."""
    methods: list[str] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"empty method in {text!r}")
        if "=" in item and PARAM_SEPARATOR not in item:
            if not methods or PARAM_SEPARATOR not in methods[-1]:
                raise ValueError(
                    f"{item!r} in {text!r} is a parameter without a method: write method:key=value,key=value"
                )
            methods[-1] += "," + item
        else:
            methods.append(item)
    return methods


def expand_grid(text: str) -> list[MethodSpec]:
    """Every spec of a grid, the product in declared order: ``cake:tau1=0.5|1|2,tau2=1|2`` -> six specs."""
    head, sep, tail = text.strip().partition(PARAM_SEPARATOR)
    if not sep:
        return [parse_method(head)]
    keys, choices = [], []
    for item in tail.split(","):
        key, eq, values = item.partition("=")
        if not eq:
            raise ValueError(f"grid {text!r}: expected key=v1|v2|..., got {item!r}")
        options = [v.strip() for v in values.split(GRID_SEPARATOR)]
        if len(set(options)) != len(options) or not all(options):
            raise ValueError(f"grid {text!r}: the values of {key.strip()!r} must be distinct and non-empty")
        keys.append(key.strip())
        choices.append(options)
    specs: dict[str, MethodSpec] = {}
    for combo in itertools.product(*choices):
        spec = parse_method(f"{head}{PARAM_SEPARATOR}" + ",".join(f"{k}={v}" for k, v in zip(keys, combo)))
        specs.setdefault(spec.canonical(), spec)
    return list(specs.values())
