"""Method names with parameters: ``cake:tau1=2,tau2=0.5``, ``ripplekv:r=16,gamma=12``, ``squeezeattention:p=0.625``.

A *method spec* is a method name of :data:`~ripplekv.presses.registry.METHODS`, optionally followed by ``:`` and
``key=value`` pairs separated by commas. Every method declares the knobs its authors expose
(:data:`METHOD_PARAMS`: RippleKV's disparity ``r`` and clip ``gamma``, CAKE's temperatures, SqueezeAttention's
class-3 share ``p``, DynamicKV's cap ``radio_max`` and statistic window, PyramidKV's ``beta``, ...); a spec is
parsed (:func:`parse_method`), validated by the very dataclass the method is built from (a bad value is the same
``ValueError`` as in Python), and written back in one canonical form (:meth:`MethodSpec.canonical`): parameters in
their declared order, values at their shortest exact form, and a parameter equal to its default left out, so
``cake:tau2=1,tau1=1`` is ``cake`` and resumed runs, rows and reports name one setting one way.

On a command line, where methods are a comma-separated list, a ``key=value`` item continues the method before it
(:func:`split_method_list`): ``--methods 'full,ripplekv:r=16,gamma=12,cake:tau1=2,tau2=0.5'`` is three methods.
A tuning grid gives several values of a key separated by ``|`` (:func:`expand_grid`):
``cake:tau1=0.5|1|2,tau2=0.5|1|2`` is nine specs.

This module imports neither torch nor kvpress (reports parse the names of committed runs without them).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ripplekv.allocation import (
    DEFAULT_GAMMA,
    DEFAULT_RATIO,
    AllocationConfig,
    CakeRule,
    DynamicKVRule,
    LavaRule,
    PyramidSchedule,
    SqueezeAttentionRule,
)

__all__ = [
    "GRID_SEPARATOR",
    "METHOD_PARAMS",
    "PARAM_SEPARATOR",
    "MethodSpec",
    "Param",
    "base_method",
    "expand_grid",
    "format_value",
    "parse_method",
    "split_method_list",
]

PARAM_SEPARATOR = ":"
GRID_SEPARATOR = "|"


@dataclass(frozen=True)
class Param:
    """One knob of a method.

    Args:
        name: its key in a spec (``r``, ``tau1``, ...).
        kind: ``float``, ``int``, ``bool`` or ``str``; a value is read as this type.
        default: the value the method uses when the key is absent (None: derived at build time, e.g. a window
            that defaults to the scorer's).
        help: one line on what it sets.
    """

    name: str
    kind: type
    default: Any
    help: str

    def __post_init__(self) -> None:
        if self.kind not in (float, int, bool, str):
            raise ValueError(f"Param {self.name!r}: kind must be float, int, bool or str, got {self.kind!r}")
        if not self.name.isidentifier():
            raise ValueError(f"Param name must be an identifier, got {self.name!r}")

    def read(self, method: str, text: str) -> Any:
        """The value of ``text`` as this parameter's kind.

        Raises:
            ValueError: naming the method and the parameter, when ``text`` is not a value of the kind.
        """
        where = f"method {method!r}, parameter {self.name!r}"
        if self.kind is bool:
            lowered = text.strip().lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError(f"{where}: expected true or false, got {text!r}")
            return lowered in ("true", "1")
        if self.kind is int:
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{where}: expected an integer, got {text!r}") from None
            if not math.isfinite(value) or value != int(value):
                raise ValueError(f"{where}: expected an integer, got {text!r}")
            return int(value)
        if self.kind is float:
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{where}: expected a number, got {text!r}") from None
            if not math.isfinite(value):
                raise ValueError(f"{where}: expected a finite number, got {text!r}")
            return value
        if not text:
            raise ValueError(f"{where}: empty value")
        return text


def _window(method: str, values: Mapping[str, Any]) -> None:
    window = values.get("window")
    if window is not None and window < 1:
        raise ValueError(f"method {method!r}: window must be an integer >= 1, got {window!r}")


def _rule_check(rule: type, fields: Sequence[str]) -> Callable[[str, Mapping[str, Any]], None]:
    def check(method: str, values: Mapping[str, Any]) -> None:
        _window(method, values)
        try:
            rule(**{k: values[k] for k in fields if k in values})
        except ValueError as err:
            raise ValueError(f"method {method!r}: {err}") from None

    return check


def _disparity_check(method: str, values: Mapping[str, Any]) -> None:
    try:
        AllocationConfig(ratio=values.get("r", DEFAULT_RATIO), gamma=values.get("gamma", DEFAULT_GAMMA))
    except ValueError as err:
        raise ValueError(f"method {method!r}: {err}") from None


def _pyramid_check(method: str, values: Mapping[str, Any]) -> None:
    try:
        PyramidSchedule(budget=0.5, beta=values.get("beta", 20))
    except ValueError as err:
        raise ValueError(f"method {method!r}: {err}") from None


def _streaming_check(method: str, values: Mapping[str, Any]) -> None:
    if values.get("n_sink", 4) < 0:
        raise ValueError(f"method {method!r}: n_sink must be an integer >= 0, got {values['n_sink']!r}")


def _ada_check(method: str, values: Mapping[str, Any]) -> None:
    alpha = values.get("alpha_safeguard", 0.2)
    if not 0 <= alpha <= 1:
        raise ValueError(f"method {method!r}: alpha_safeguard must be in [0, 1], got {alpha!r}")


def _lava_check(method: str, values: Mapping[str, Any]) -> None:
    _LAVA[1](method, values)
    alpha = values.get("floor_alpha", 0.2)
    if not 0 <= alpha <= 1:
        raise ValueError(f"method {method!r}: floor_alpha must be in [0, 1], got {alpha!r}")


def _no_check(method: str, values: Mapping[str, Any]) -> None:
    return None


_R = Param("r", float, float(DEFAULT_RATIO), "RippleKV's disparity: multipliers r ** s_l (> 0)")
_GAMMA = Param("gamma", float, float(DEFAULT_GAMMA), "RippleKV's clip: multipliers in [1/gamma, gamma] (>= 1)")
_WINDOW = Param("window", int, None, "the statistic's observation window (default: the scorer's window, else 64)")
_KERNEL = Param("kernel_size", int, 7, "pooling width along the keys (odd)")
_RIPPLE = ((_R, _GAMMA), _disparity_check)
_LAVA = (
    (
        _KERNEL,
        Param("pooling", str, "maxpool", "maxpool or avgpool"),
        Param("gqa_support", bool, True, "max over a KV head's query heads"),
        _WINDOW,
    ),
    _rule_check(LavaRule, ("kernel_size", "pooling", "gqa_support")),
)

METHOD_PARAMS: dict[str, tuple[tuple[Param, ...], Callable[[str, Mapping[str, Any]], None]]] = {
    "full": ((), _no_check),
    "streamingllm": ((Param("n_sink", int, 4, "attention-sink tokens kept at the start"),), _streaming_check),
    "snapkv": ((), _no_check),
    "pyramidkv": ((Param("beta", int, 20, "PyramidKV's steepness: the top layer keeps C / beta"),), _pyramid_check),
    "pyramidkv-kvpress": ((), _no_check),
    "adakv": ((Param("alpha_safeguard", float, 0.2, "share of a layer's budget split evenly over heads"),), _ada_check),
    "ripplekv": _RIPPLE,
    "ripplekv-local": _RIPPLE,
    "ripplekv-ada": _RIPPLE,
    "cake": (
        (
            Param("tau1", float, 1.0, "temperature of the attention dispersion"),
            Param("tau2", float, 1.0, "temperature of the temporal shift"),
            _WINDOW,
        ),
        _rule_check(CakeRule, ("tau1", "tau2")),
    ),
    "squeezeattention": (
        (
            Param("p", float, SqueezeAttentionRule.p, "class 3's budget relative to the average"),
            Param("n_clusters", int, 3, "KMeans clusters over the layers"),
        ),
        _rule_check(SqueezeAttentionRule, ("p", "n_clusters")),
    ),
    "dynamickv": (
        (
            Param("radio_max", float, 10.0, "cap on a layer's selected tokens, in multiples of the average"),
            Param("update_interval", int, 4, "layers between two global top-k updates"),
            _KERNEL,
            Param("pooling", str, "avgpool", "avgpool or maxpool"),
            _WINDOW,
        ),
        _rule_check(DynamicKVRule, ("radio_max", "update_interval", "kernel_size", "pooling")),
    ),
    "lava": (
        (*_LAVA[0], Param("floor_alpha", float, 0.2, "share of a layer's budget every head keeps (LAVa's floor)")),
        _lava_check,
    ),
    "lava-layer": _LAVA,
    "ripplekv-oracle": _RIPPLE,
}
"""Per method: its parameters in canonical order, and the check of a set of values (the method's own dataclass)."""


def format_value(value: Any) -> str:
    """A parameter value as a spec writes it: ``true``/``false``, an int, a float at its shortest exact form."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        short = format(value, "g")
        return short if float(short) == value else repr(value)
    return str(value)


@dataclass(frozen=True)
class MethodSpec:
    """A method and the parameters given to it (defaults left out).

    Args:
        name: the method (a key of :data:`METHOD_PARAMS`).
        params: ``(key, value)`` pairs in the method's declared order, none equal to its default.
    """

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.name not in METHOD_PARAMS:
            raise ValueError(f"unknown method {self.name!r}; choose one of {', '.join(METHOD_PARAMS)}")
        declared = {p.name: p for p in METHOD_PARAMS[self.name][0]}
        keys = [k for k, _ in self.params]
        unknown = [k for k in keys if k not in declared]
        if unknown:
            accepted = ", ".join(declared) or "none"
            raise ValueError(
                f"method {self.name!r} has no parameter {', '.join(map(repr, unknown))} (its parameters: {accepted})"
            )
        if len(set(keys)) != len(keys):
            raise ValueError(f"method {self.name!r}: a parameter is given twice in {keys}")
        order = [p for p in declared if p in keys]
        if keys != order:
            raise ValueError(f"method {self.name!r}: parameters must be in declared order {order}, got {keys}")
        METHOD_PARAMS[self.name][1](self.name, dict(self.params))

    @property
    def values(self) -> dict[str, Any]:
        """Every parameter of the method with its value: the given ones, the defaults for the rest."""
        given = dict(self.params)
        return {p.name: given.get(p.name, p.default) for p in METHOD_PARAMS[self.name][0]}

    @property
    def given(self) -> dict[str, Any]:
        """The parameters given (the non-default ones)."""
        return dict(self.params)

    def canonical(self) -> str:
        """``name`` or ``name:key=value,...`` (declared order, defaults left out)."""
        if not self.params:
            return self.name
        pairs = ",".join(f"{k}={format_value(v)}" for k, v in self.params)
        return f"{self.name}{PARAM_SEPARATOR}{pairs}"

    def __str__(self) -> str:
        return self.canonical()


def parse_method(text: str | MethodSpec, **overrides: Any) -> MethodSpec:
    """The spec of ``name`` or ``name:key=value,...``, validated, defaults dropped.

    Args:
        text: the spec (a :class:`MethodSpec` passes through, with ``overrides`` applied).
        overrides: parameter values given by keyword (Python's ``make_press(..., ratio=...)``); a key given both in
            ``text`` and here with another value is an error.

    Raises:
        ValueError: on an unknown method or parameter, a malformed pair, a value of the wrong kind or out of range.
    """
    if isinstance(text, MethodSpec):
        name, given = text.name, dict(text.params)
    else:
        if not isinstance(text, str):
            raise TypeError(f"a method must be a name or a MethodSpec, got {type(text).__name__}")
        head, sep, tail = text.strip().partition(PARAM_SEPARATOR)
        name = head.strip().lower()
        if name not in METHOD_PARAMS:
            raise ValueError(f"unknown method {head!r}; choose one of {', '.join(METHOD_PARAMS)}")
        declared = {p.name: p for p in METHOD_PARAMS[name][0]}
        given = {}
        if sep:
            if not tail.strip():
                raise ValueError(f"method {name!r}: ':' must be followed by key=value pairs, got {text!r}")
            for item in tail.split(","):
                key, eq, value = item.partition("=")
                key = key.strip()
                if not eq or not key:
                    raise ValueError(f"method {name!r}: expected key=value, got {item!r} in {text!r}")
                if key in given:
                    raise ValueError(f"method {name!r}: parameter {key!r} given twice in {text!r}")
                if key not in declared:
                    accepted = ", ".join(declared) or "none"
                    raise ValueError(f"method {name!r} has no parameter {key!r} (its parameters: {accepted})")
                given[key] = declared[key].read(name, value.strip())
    declared = {p.name: p for p in METHOD_PARAMS[name][0]}
    for key, value in overrides.items():
        if key not in declared:
            raise ValueError(f"method {name!r} has no parameter {key!r}")
        if key in given and given[key] != value:
            raise ValueError(f"method {name!r}: {key} is given twice ({given[key]!r} and {value!r})")
        given[key] = value
    params = tuple(
        (p.name, given[p.name]) for p in METHOD_PARAMS[name][0] if p.name in given and given[p.name] != p.default
    )
    return MethodSpec(name, params)


def base_method(text: str | MethodSpec) -> str:
    """The method name of a spec (``cake`` of ``cake:tau1=2``), without parsing its parameters."""
    if isinstance(text, MethodSpec):
        return text.name
    return text.partition(PARAM_SEPARATOR)[0].strip().lower()


def split_method_list(text: str) -> list[str]:
    """The methods of a comma-separated command-line list, where a ``key=value`` item continues the method before.

    ``"full,ripplekv:r=16,gamma=12,cake"`` -> ``["full", "ripplekv:r=16,gamma=12", "cake"]``.

    Raises:
        ValueError: on an empty item, or a ``key=value`` item before any method.
    """
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
    """Every spec of a grid: ``cake:tau1=0.5|1|2,tau2=1|2`` -> six specs (the product, in declared order).

    Raises:
        ValueError: as :func:`parse_method` for any combination, or on a repeated value of one key.
    """
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
