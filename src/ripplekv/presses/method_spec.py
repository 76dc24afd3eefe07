"""The methods of ``make_press`` (:data:`METHOD_TABLE`) and their names with parameters: ``cake:tau1=2,tau2=0.5``.

A parameter is a field of the dataclass the method is built from (RippleKV's ``r`` is
:class:`~ripplekv.allocation.AllocationConfig`'s ``ratio``): its kind and default are read from that field, and a
value is validated by building the dataclass. A spec has one canonical form (:meth:`MethodSpec.canonical`: declared
order, shortest exact values, defaults left out, so ``cake:tau2=1,tau1=1`` is ``cake``), so resumed runs, rows and
reports name one setting one way. No torch or kvpress import: reports parse committed runs' names without them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ripplekv.allocation.cake import CakeRule
from ripplekv.allocation.dynamickv import DynamicKVRule
from ripplekv.allocation.lava import LavaRule
from ripplekv.allocation.lava_heads import DEFAULT_FLOOR_ALPHA
from ripplekv.allocation.schedules import AllocationConfig, PyramidSchedule
from ripplekv.allocation.squeezeattention import SqueezeAttentionRule
from ripplekv.profiling.damage_profile import ORACLE_METHOD

__all__ = [
    "GRID_SEPARATOR",
    "METHOD_TABLE",
    "PARAM_SEPARATOR",
    "Method",
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

_KINDS: dict[str, type] = {"float": float, "int": int, "bool": bool, "str": str}


@dataclass(frozen=True)
class Param:
    """One knob of a method.

    Args:
        default: the value when the key is absent (None: derived at build time, e.g. the scorer's window).
        owner: the dataclass whose field this is (a value is validated by building it), or None.
        field: the owner's field name (``ratio`` for RippleKV's ``r``); empty when it is ``name``.
        low: without an owner, the smallest valid value.
        high: without an owner, the largest valid value (None: unbounded).
    """

    name: str
    kind: type
    default: Any
    owner: type | None = None
    field: str = ""
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in (float, int, bool, str):
            raise ValueError(f"Param {self.name!r}: kind must be float, int, bool or str, got {self.kind!r}")
        if not self.name.isidentifier():
            raise ValueError(f"Param name must be an identifier, got {self.name!r}")

    @classmethod
    def of(cls, owner: type, name: str, field: str = "") -> Param:
        """The parameter ``name`` of ``owner``'s field ``field`` (default ``name``), of the field's kind and default."""
        declared = {f.name: f for f in dataclasses.fields(owner)}[field or name]
        kind = _KINDS.get(declared.type, declared.type) if isinstance(declared.type, str) else declared.type
        return cls(name, kind, declared.default, owner, field if field != name else "")  # type: ignore[arg-type]

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

    def check_range(self, method: str, value: Any) -> None:
        """Raise ``ValueError`` naming the method if ``value`` is outside ``[low, high]`` (None passes)."""
        if value is None or self.low is None:
            return
        if self.high is None and value < self.low:
            kind = "an integer" if self.kind is int else "a number"
            raise ValueError(f"method {method!r}: {self.name} must be {kind} >= {self.low:g}, got {value!r}")
        if self.high is not None and not self.low <= value <= self.high:
            raise ValueError(f"method {method!r}: {self.name} must be in [{self.low:g}, {self.high:g}], got {value!r}")


@dataclass(frozen=True)
class Method:
    """One method of ``make_press``.

    Args:
        description: what it computes, one line (the legend of reports).
        factory: the name of its builder in :mod:`ripplekv.presses.registry` (by name: no torch import here).
        owner_args: arguments besides the parameters with which an owner is built to validate values
            (PyramidSchedule needs a budget).
        takes_tokens: whether it takes a token budget (kvpress's own presses take a kept fraction only).
        has_scorer: whether it ranks tokens with a scorer that ``make_press(scorer=...)`` replaces.
    """

    description: str
    factory: str
    params: tuple[Param, ...] = ()
    owner_args: tuple[tuple[type, tuple[tuple[str, Any], ...]], ...] = ()
    takes_tokens: bool = True
    has_scorer: bool = True

    def param(self, name: str) -> Param | None:
        """The parameter named ``name``, or None."""
        return next((p for p in self.params if p.name == name), None)

    def config(self, owner: type, values: Mapping[str, Any]) -> Any:
        """``owner`` built from the values of its parameters (absent ones at the field's default)."""
        kwargs = {p.field or p.name: values[p.name] for p in self.params if p.owner is owner and p.name in values}
        return owner(**dict(dict(self.owner_args).get(owner, ())), **kwargs)

    def check(self, name: str, values: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` naming the method unless ``values`` (the given parameters) are valid."""
        for param in self.params:
            if param.owner is None and param.name in values:
                param.check_range(name, values[param.name])
        for owner in dict.fromkeys(p.owner for p in self.params if p.owner is not None):
            try:
                self.config(owner, values)  # type: ignore[arg-type]
            except ValueError as err:
                raise ValueError(f"method {name!r}: {err}") from None


_WINDOW = Param("window", int, None, low=1)  # the statistic's window; default: the scorer's window, else 64
_RIPPLE = (Param.of(AllocationConfig, "r", "ratio"), Param.of(AllocationConfig, "gamma"))
_LAVA = (*(Param.of(LavaRule, name) for name in ("kernel_size", "pooling", "gqa_support")), _WINDOW)

METHOD_TABLE: dict[str, Method] = {
    "full": Method("full cache (no compression)", "build_full", has_scorer=False),
    "streamingllm": Method(
        "StreamingLLM (kvpress): attention sinks + recent tokens, uniform budgets",
        "build_streamingllm",
        (Param("n_sink", int, 4, low=0),),  # kvpress StreamingLLMPress's default
        takes_tokens=False,
        has_scorer=False,
    ),
    "snapkv": Method("SnapKV scorer, uniform per-layer budgets", "build_snapkv"),
    "pyramidkv": Method(
        "SnapKV scorer, PyramidKV schedule (authors' code: linear in depth, beta 20), SnapKV's total",
        "build_pyramidkv",
        (Param.of(PyramidSchedule, "beta"),),
        ((PyramidSchedule, (("budget", 1.0),)),),
    ),
    "pyramidkv-kvpress": Method(
        "kvpress 0.5.5 PyramidKVPress (falls back to uniform when prompt x budget / 20 < window)",
        "build_pyramidkv_kvpress",
        takes_tokens=False,
        has_scorer=False,
    ),
    "adakv": Method(
        "AdaKV (kvpress): SnapKV scores, head-wise budgets within each layer (keys masked, not freed)",
        "build_adakv",
        (Param("alpha_safeguard", float, 0.2, low=0, high=1),),  # kvpress AdaKVPress's default
        takes_tokens=False,
    ),
    "ripplekv": Method(
        "SnapKV scorer, RippleKV budgets from the profile's downstream-KL scores", "build_ripplekv", _RIPPLE
    ),
    "ripplekv-local": Method(
        "SnapKV scorer, RippleKV budgets from the profile's local signal (ablation)", "build_ripplekv_local", _RIPPLE
    ),
    "ripplekv-ada": Method(
        "SnapKV scores, RippleKV per-layer budgets, AdaKV head-wise allocation in each layer (keys masked)",
        "build_ripplekv_ada",
        _RIPPLE,
    ),
    "cake": Method(
        "SnapKV scorer, CAKE budgets per prompt (window attention's entropy x variance per layer), SnapKV's total",
        "build_cake",
        (Param.of(CakeRule, "tau1"), Param.of(CakeRule, "tau2"), _WINDOW),
    ),
    "squeezeattention": Method(
        "SnapKV scorer, SqueezeAttention budgets per prompt (cosine of each layer's residual update)",
        "build_squeezeattention",
        (Param.of(SqueezeAttentionRule, "p"), Param.of(SqueezeAttentionRule, "n_clusters")),
    ),
    "dynamickv": Method(
        "SnapKV scorer, DynamicKV budgets per prompt (global top-k of window attention over layers)",
        "build_dynamickv",
        # radio_max is the authors' (misspelt) name, kept: the specs of committed runs use it
        (*(Param.of(DynamicKVRule, n) for n in ("radio_max", "update_interval", "kernel_size", "pooling")), _WINDOW),
    ),
    "lava": Method(
        "SnapKV scorer, LAVa: layer budgets per prompt (value-weighted entropy), head-wise split (keys masked)",
        "build_lava",
        (*_LAVA, Param("floor_alpha", float, DEFAULT_FLOOR_ALPHA, low=0, high=1)),
    ),
    "lava-layer": Method(
        "SnapKV scorer, LAVa's layer rule alone (value-weighted entropy per layer), no head-wise split",
        "build_lava_layer",
        _LAVA,
    ),
    ORACLE_METHOD: Method(
        "SnapKV scorer, RippleKV budgets from a damage profile (measured single-layer damage; ceiling)",
        "build_ripplekv_oracle",
        _RIPPLE,
    ),
}
"""Every method of ``make_press`` by name: what it computes, its parameters (in canonical order), its factory."""


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
    """A method and the parameters given to it: ``(key, value)`` pairs in declared order, none at its default."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.name not in METHOD_TABLE:
            raise ValueError(f"unknown method {self.name!r}; choose one of {', '.join(METHOD_TABLE)}")
        declared = {p.name: p for p in METHOD_TABLE[self.name].params}
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
        METHOD_TABLE[self.name].check(self.name, dict(self.params))

    @property
    def values(self) -> dict[str, Any]:
        """Every parameter of the method with its value: the given ones, the defaults for the rest."""
        given = dict(self.params)
        return {p.name: given.get(p.name, p.default) for p in METHOD_TABLE[self.name].params}

    def config(self, owner: type) -> Any:
        """The dataclass ``owner`` (a rule, :class:`AllocationConfig`, ...) built from this spec's values."""
        return METHOD_TABLE[self.name].config(owner, self.values)

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

    ``overrides`` are values given by keyword (``make_press(..., ratio=...)``); a key given both in ``text`` and here
    with another value is an error. A :class:`MethodSpec` passes through with ``overrides`` applied.

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
        if name not in METHOD_TABLE:
            raise ValueError(f"unknown method {head!r}; choose one of {', '.join(METHOD_TABLE)}")
        declared = {p.name: p for p in METHOD_TABLE[name].params}
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
    declared = {p.name: p for p in METHOD_TABLE[name].params}
    for key, value in overrides.items():
        if key not in declared:
            raise ValueError(f"method {name!r} has no parameter {key!r}")
        if key in given and given[key] != value:
            raise ValueError(f"method {name!r}: {key} is given twice ({given[key]!r} and {value!r})")
        given[key] = value
    params = tuple(
        (p.name, given[p.name]) for p in METHOD_TABLE[name].params if p.name in given and given[p.name] != p.default
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


def __getattr__(name: str) -> object:
    """Name the replacement of a removed name (an ``ImportError``, which ``from ... import`` passes on)."""
    if name == "METHOD_PARAMS":
        raise ImportError(
            "ripplekv.presses.method_spec.METHOD_PARAMS is gone: use METHOD_TABLE[name].params (and .check)"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
