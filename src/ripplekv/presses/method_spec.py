"""The methods of ``make_press`` (:data:`METHOD_TABLE`: factory, parameters, profile) and their specs,
``cake:tau1=2,tau2=0.5``: a parameter is a field of the dataclass the method is built from (kind and default read
from it); a spec has one canonical form (declared order, defaults left out). No torch or kvpress import (reports
read committed runs' names without them): a factory imports its presses when called."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from ripplekv.allocation.budget import AllocationConfig, BudgetSpec
from ripplekv.allocation.cake import CakeRule
from ripplekv.allocation.dynamickv import DynamicKVRule
from ripplekv.allocation.lava import LavaRule
from ripplekv.allocation.lava_heads import DEFAULT_FLOOR_ALPHA
from ripplekv.allocation.per_prompt import PerPromptRule, PerPromptSchedule
from ripplekv.allocation.schedules import PyramidSchedule, UniformSchedule
from ripplekv.allocation.squeezeattention import SqueezeAttentionRule
from ripplekv.profiling.damage_profile import ORACLE_METHOD, require_damage_profile
from ripplekv.profiling.profile import SensitivityProfile

if TYPE_CHECKING:
    from kvpress import ScorerPress
    from kvpress.presses.base_press import BasePress

    from ripplekv.presses.per_prompt_press import PerPromptBudgetPress
    from ripplekv.presses.ripplekv_press import RippleKVPress

__all__ = ["METHOD_TABLE", "Build", "Method", "MethodSpec", "Param", "base_method", "needs_profile", "parse_method"]

PARAM_SEPARATOR = ":"
_KINDS = {"float": float, "int": int, "bool": bool, "str": str}
SENSITIVITY, DAMAGE = "sensitivity", "damage"  # the profiles a method needs: `ripplekv profile`'s, `ripplekv analyze`'s


@dataclass(frozen=True)
class Param:
    """One knob of a method: a field of ``owner`` (``field``, default ``name``; a value is checked by building the
    owner) or, without an owner, a number in ``[low, high]`` (``high`` None: unbounded). ``default`` None: derived
    when the press is built (e.g. the scorer's window)."""

    name: str
    kind: type
    default: Any
    owner: type | None = None
    field: str = ""
    low: float | None = None
    high: float | None = None

    @classmethod
    def of(cls, owner: type, name: str, field: str = "") -> Param:
        declared = {f.name: f for f in dataclasses.fields(owner)}[field or name]
        kind = _KINDS.get(declared.type, declared.type) if isinstance(declared.type, str) else declared.type
        return cls(name, kind, declared.default, owner, field)  # type: ignore[arg-type]

    @classmethod
    def fields(cls, owner: type) -> tuple[Param, ...]:
        """A parameter for each field of the dataclass ``owner``, in declared order (a spec's canonical order)."""
        return tuple(cls.of(owner, f.name) for f in dataclasses.fields(owner))

    def read(self, method: str, text: str) -> Any:
        """``text`` as a value of this parameter's kind, or a ``ValueError`` naming the method and parameter."""
        where, word = f"method {method!r}, parameter {self.name!r}", text.strip().lower()
        if self.kind is bool and word not in ("true", "false", "1", "0"):
            raise ValueError(f"{where}: expected true or false, got {text!r}")
        if self.kind is str and not text:
            raise ValueError(f"{where}: empty value")
        if self.kind in (bool, str):
            return word in ("true", "1") if self.kind is bool else text
        expected = "an integer" if self.kind is int else "a number"
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{where}: expected {expected}, got {text!r}") from None
        if not math.isfinite(value) or (self.kind is int and value != int(value)):
            raise ValueError(f"{where}: expected {expected.replace('a ', 'a finite ')}, got {text!r}")
        return int(value) if self.kind is int else value

    def check_range(self, method: str, value: Any) -> None:
        high = math.inf if self.high is None else self.high
        if value is not None and self.low is not None and not self.low <= value <= high:
            kind = "an integer" if self.kind is int else "a number"
            bound = f"{kind} >= {self.low:g}" if self.high is None else f"in [{self.low:g}, {self.high:g}]"
            raise ValueError(f"method {method!r}: {self.name} must be {bound}, got {value!r}")


@dataclass(frozen=True)
class Method:
    """A method: what it computes (the legend of reports), its factory (a :class:`Build` to the press), its
    parameters, the arguments besides them with which an owner is built to check values, whether it takes
    ``tokens=``, whether ``scorer=`` replaces its scorer, and the profile it needs ("" for none)."""

    description: str
    factory: Callable[[Build], BasePress]
    params: tuple[Param, ...] = ()
    owner_args: tuple[tuple[type, tuple[tuple[str, Any], ...]], ...] = ()
    takes_tokens: bool = True
    has_scorer: bool = True
    needs_profile: Literal["", "sensitivity", "damage"] = ""

    def __post_init__(self) -> None:
        if self.needs_profile not in ("", SENSITIVITY, DAMAGE):
            raise ValueError(f"needs_profile must be '', {SENSITIVITY!r} or {DAMAGE!r}, got {self.needs_profile!r}")

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def refuse_unknown(self, name: str, keys: Iterable[str]) -> None:
        """Raise naming the ``keys`` that are no parameter of this method (``name``)."""
        if unknown := ", ".join(repr(k) for k in keys if self.param(k) is None):
            accepted = ", ".join(p.name for p in self.params) or "none"
            raise ValueError(f"method {name!r} has no parameter {unknown} (its parameters: {accepted})")

    def config(self, owner: type, values: Mapping[str, Any]) -> Any:
        """``owner`` built from the values of its parameters (absent or None ones at the field's default)."""
        kwargs = {
            p.field or p.name: values[p.name]
            for p in self.params
            if p.owner is owner and values.get(p.name) is not None
        }
        return owner(**dict(dict(self.owner_args).get(owner, ())), **kwargs)

    def check(self, name: str, values: Mapping[str, Any]) -> None:
        for param in (p for p in self.params if p.owner is None and p.name in values):
            param.check_range(name, values[param.name])
        for owner in dict.fromkeys(p.owner for p in self.params if p.owner is not None):
            try:
                self.config(owner, values)  # type: ignore[arg-type]
            except ValueError as err:
                raise ValueError(f"method {name!r}: {err}") from None


@dataclass(frozen=True)
class Build:
    """What a method's factory gets: the parsed spec, the budget, the profile (checked against the one the method
    needs), the window_size, whether a profile of other weights is an error, and a scorer factory (a new copy)."""

    method: MethodSpec
    spec: BudgetSpec
    profile: SensitivityProfile | None
    window_size: int
    strict: bool
    scorer: Callable[[], ScorerPress]

    def __post_init__(self) -> None:
        need = METHOD_TABLE[self.method.name].needs_profile
        if need == DAMAGE:
            require_damage_profile(self.method.name, self.profile)
        elif need and self.profile is None:
            raise ValueError(f"method {self.method.name!r} needs a sensitivity profile (run `ripplekv profile` first)")

    def ripple(self, signal: str = "kl") -> RippleKVPress:
        """RippleKV's press over the scorer and the profile with this method's ``r`` and ``gamma`` (None when not
        given: the press takes the profile's setting, else the defaults)."""
        from ripplekv.presses.ripplekv_press import RippleKVPress

        values = self.method.values
        press = partial(RippleKVPress, profile=self.profile, signal=signal, strict_profile=self.strict)
        return press(self.scorer(), **self.spec.kwargs(), ratio=values["r"], gamma=values["gamma"])


def global_layers(b: Build, make: Callable[[float], BasePress]) -> BasePress:
    """kvpress's own press ``make(compression_ratio)`` on the global layers only; its budget is a kept fraction."""
    from ripplekv.presses.global_layers_press import GlobalLayersPress

    if b.spec.budget is None:
        raise ValueError(
            f"{b.method.name} is kvpress's own press, configured by a compression ratio: it takes a kept "
            f"fraction (budget=), not tokens={b.spec.tokens}"
        )
    return GlobalLayersPress(make(1 - float(b.spec.budget)))


def build_full(b: Build) -> BasePress:
    from ripplekv.presses.full_press import FullPress

    return FullPress()


def build_streamingllm(b: Build) -> BasePress:
    from kvpress import StreamingLLMPress

    return global_layers(b, lambda ratio: StreamingLLMPress(compression_ratio=ratio, n_sink=b.method.values["n_sink"]))


def build_snapkv(b: Build) -> BasePress:
    from ripplekv.presses.layer_budget_press import LayerBudgetPress

    return LayerBudgetPress(b.scorer(), UniformSchedule(**b.spec.kwargs()))


def build_pyramidkv(b: Build) -> BasePress:
    from ripplekv.presses.layer_budget_press import LayerBudgetPress

    schedule = PyramidSchedule(**b.spec.kwargs(), window_size=b.window_size, beta=b.method.values["beta"])
    return LayerBudgetPress(b.scorer(), schedule)


def build_pyramidkv_kvpress(b: Build) -> BasePress:
    from kvpress import PyramidKVPress

    return global_layers(b, lambda ratio: PyramidKVPress(compression_ratio=ratio, window_size=b.window_size))


def build_adakv(b: Build) -> BasePress:
    from kvpress import AdaKVPress

    from ripplekv.presses.layer_budget_press import scorer_at_ratio

    alpha = b.method.values["alpha_safeguard"]
    return global_layers(b, lambda ratio: AdaKVPress(scorer_at_ratio(b.scorer(), ratio), alpha_safeguard=alpha))


def build_ripplekv_ada(b: Build) -> BasePress:
    """RippleKV's per-layer budgets (the ``ripplekv`` schedule, same floor) with AdaKV's head-wise allocation."""
    from ripplekv.presses.layer_budget_ada_press import LayerBudgetAdaPress
    from ripplekv.presses.ripplekv_press import press_setting

    ripple = b.ripple()
    setting = press_setting(ripple)
    return LayerBudgetAdaPress(b.scorer(), ripple.schedule, profile=b.profile, strict_profile=b.strict, setting=setting)


def per_prompt(b: Build, rule: type[PerPromptRule]) -> PerPromptBudgetPress:
    """``rule``'s per-prompt press over the scorer, reserving the window the scorer keeps (none without one)."""
    from ripplekv.presses.per_prompt_press import PerPromptBudgetPress
    from ripplekv.presses.selection_window import scorer_window

    inner = b.scorer()
    statistic_window = b.method.values.get("window") or scorer_window(inner) or int(b.window_size)
    schedule = PerPromptSchedule(b.method.config(rule), **b.spec.kwargs(), window_size=scorer_window(inner))
    return PerPromptBudgetPress(inner, schedule, statistic_window=statistic_window)


def build_lava(b: Build) -> BasePress:
    """LAVa complete: ``lava-layer``'s press (its layer budgets) with LAVa's head-wise split inside each layer."""
    from ripplekv.presses.lava_press import LavaPress

    layer = per_prompt(b, LavaRule)
    floor_alpha = b.method.values["floor_alpha"]
    return LavaPress(layer.press, layer.schedule, statistic_window=layer.statistic_window, floor_alpha=floor_alpha)


_STATISTIC_WINDOW = Param("window", int, None, low=1)  # spec key `window` (in run names): the press's statistic_window
# RippleKV's r and gamma default to None: derived when the press is built, from the profile's chosen setting, else r 4
# and gamma 3 (ripplekv.profiling.profile.resolve_setting); a value given, the default's included, is explicit and wins
_RIPPLE = tuple(
    dataclasses.replace(Param.of(AllocationConfig, n, f), default=None) for n, f in (("r", "ratio"), ("gamma", "gamma"))
)
_LAVA = (*Param.fields(LavaRule), _STATISTIC_WINDOW)
_SNAP = "SnapKV scorer, "

METHOD_TABLE: dict[str, Method] = {
    "full": Method("full cache (no compression)", build_full, has_scorer=False),
    "streamingllm": Method(
        "StreamingLLM (kvpress): attention sinks + recent tokens, uniform budgets",
        build_streamingllm,
        (Param("n_sink", int, 4, low=0),),  # kvpress StreamingLLMPress's default
        takes_tokens=False,
        has_scorer=False,
    ),
    "snapkv": Method(_SNAP + "uniform per-layer budgets", build_snapkv),
    "pyramidkv": Method(
        _SNAP + "PyramidKV schedule (authors' code: linear in depth, beta 20), SnapKV's total",
        build_pyramidkv,
        (Param.of(PyramidSchedule, "beta"),),
        ((PyramidSchedule, (("budget", 1.0),)),),
    ),
    "pyramidkv-kvpress": Method(
        "kvpress 0.5.5 PyramidKVPress (falls back to uniform when prompt x budget / 20 < window)",
        build_pyramidkv_kvpress,
        takes_tokens=False,
        has_scorer=False,
    ),
    "adakv": Method(
        "AdaKV (kvpress): SnapKV scores, head-wise budgets within each layer (keys masked, not freed)",
        build_adakv,
        (Param("alpha_safeguard", float, 0.2, low=0, high=1),),  # kvpress AdaKVPress's default
        takes_tokens=False,
    ),
    "ripplekv": Method(
        _SNAP + "RippleKV budgets from the profile's downstream-KL scores",
        Build.ripple,
        _RIPPLE,
        needs_profile=SENSITIVITY,
    ),
    "ripplekv-local": Method(
        _SNAP + "RippleKV budgets from the profile's local signal (ablation)",
        partial(Build.ripple, signal="local"),
        _RIPPLE,
        needs_profile=SENSITIVITY,
    ),
    "ripplekv-ada": Method(
        "SnapKV scores, RippleKV per-layer budgets, AdaKV head-wise allocation in each layer (keys masked)",
        build_ripplekv_ada,
        _RIPPLE,
        needs_profile=SENSITIVITY,
    ),
    "cake": Method(
        _SNAP + "CAKE budgets per prompt (window attention's entropy x variance per layer), SnapKV's total",
        partial(per_prompt, rule=CakeRule),
        (*Param.fields(CakeRule), _STATISTIC_WINDOW),
    ),
    "squeezeattention": Method(
        _SNAP + "SqueezeAttention budgets per prompt (cosine of each layer's residual update)",
        partial(per_prompt, rule=SqueezeAttentionRule),
        Param.fields(SqueezeAttentionRule),
    ),
    "dynamickv": Method(
        _SNAP + "DynamicKV budgets per prompt (global top-k of window attention over layers)",
        partial(per_prompt, rule=DynamicKVRule),
        (*Param.fields(DynamicKVRule), _STATISTIC_WINDOW),
    ),
    "lava": Method(
        _SNAP + "LAVa: layer budgets per prompt (value-weighted entropy), head-wise split (keys masked)",
        build_lava,
        (*_LAVA, Param("floor_alpha", float, DEFAULT_FLOOR_ALPHA, low=0, high=1)),
    ),
    "lava-layer": Method(
        _SNAP + "LAVa's layer rule alone (value-weighted entropy per layer), no head-wise split",
        partial(per_prompt, rule=LavaRule),
        _LAVA,
    ),
    ORACLE_METHOD: Method(
        _SNAP + "RippleKV budgets from a damage profile (measured single-layer damage: the oracle)",
        Build.ripple,
        _RIPPLE,
        needs_profile=DAMAGE,
    ),
}
"""Every method of ``make_press`` by name."""


def format_value(value: Any) -> str:
    """A value as a spec writes it: ``true``/``false``, an int, a float at its shortest exact form."""
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
        method, keys = lookup(self.name, self.name), [k for k, _ in self.params]
        method.refuse_unknown(self.name, keys)
        order = [p.name for p in method.params if p.name in keys]
        if keys != order:
            raise ValueError(f"method {self.name!r}: parameters must be given once, in declared order {order}: {keys}")
        method.check(self.name, dict(self.params))

    @property
    def values(self) -> dict[str, Any]:
        """Every parameter with its value: the given ones, the defaults for the rest."""
        return {p.name: dict(self.params).get(p.name, p.default) for p in METHOD_TABLE[self.name].params}

    def config(self, owner: type) -> Any:
        """The dataclass ``owner`` (a rule, :class:`AllocationConfig`, ...) built from this spec's values."""
        return METHOD_TABLE[self.name].config(owner, self.values)

    def canonical(self) -> str:
        """``name`` or ``name:key=value,...``."""
        pairs = ",".join(f"{k}={format_value(v)}" for k, v in self.params)
        return f"{self.name}{PARAM_SEPARATOR}{pairs}" if pairs else self.name

    __str__ = canonical


def lookup(name: str, given: str) -> Method:
    """The method ``name`` (as the user wrote it: ``given``), or a ``ValueError`` listing the methods."""
    if name not in METHOD_TABLE:
        raise ValueError(f"unknown method {given!r}; choose one of {', '.join(METHOD_TABLE)}")
    return METHOD_TABLE[name]


def parse_method(text: str | MethodSpec, **overrides: Any) -> MethodSpec:
    """The spec of ``name`` or ``name:key=value,...`` (or a :class:`MethodSpec`) with ``overrides`` (values given
    by keyword, e.g. ``make_press(ratio=...)``; a different value for a key of ``text`` is an error)."""
    if isinstance(text, MethodSpec):
        name, given, method = text.name, dict(text.params), METHOD_TABLE[text.name]
    elif not isinstance(text, str):
        raise TypeError(f"a method must be a name or a MethodSpec, got {type(text).__name__}")
    else:
        head, sep, tail = text.strip().partition(PARAM_SEPARATOR)
        name, given, method = head.strip().lower(), {}, lookup(head.strip().lower(), head)
        if sep and not tail.strip():
            raise ValueError(f"method {name!r}: ':' must be followed by key=value pairs, got {text!r}")
        for item in tail.split(",") if sep else ():
            key, eq, value = (part.strip() for part in item.partition("="))
            if not eq or not key:
                raise ValueError(f"method {name!r}: expected key=value, got {item!r} in {text!r}")
            if key in given:
                raise ValueError(f"method {name!r}: parameter {key!r} given twice in {text!r}")
            method.refuse_unknown(name, [key])
            given[key] = method.param(key).read(name, value)  # type: ignore[union-attr]
    method.refuse_unknown(name, overrides)
    for key, value in overrides.items():
        if key in given and given[key] != value:
            raise ValueError(f"method {name!r}: {key} is given twice ({given[key]!r} and {value!r})")
        given[key] = value
    params = tuple((p.name, given[p.name]) for p in method.params if given.get(p.name, p.default) != p.default)
    return MethodSpec(name, params)


def base_method(text: str | MethodSpec) -> str:
    """The method name of a spec (``cake`` of ``cake:tau1=2``), without parsing its parameters."""
    return text.name if isinstance(text, MethodSpec) else text.partition(PARAM_SEPARATOR)[0].strip().lower()


def needs_profile(text: str | MethodSpec) -> str:
    """The profile the method of a spec needs: :data:`SENSITIVITY`, :data:`DAMAGE`, or "" (none, or no method)."""
    method = METHOD_TABLE.get(base_method(text))
    return method.needs_profile if method else ""


def __getattr__(name: str) -> object:
    if name == "METHOD_PARAMS":  # a removed name: ImportError naming its replacement
        raise ImportError("ripplekv.presses.method_spec.METHOD_PARAMS is gone: use METHOD_TABLE[name].params")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
