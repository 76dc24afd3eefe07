"""The factories of every method of ``make_press`` but ``ripplekv``'s own: each gets a
:class:`~ripplekv.presses.registry.Build` and returns the press. kvpress's own presses compress global layers only
(:class:`GlobalLayersPress`), as the schedules do."""

from __future__ import annotations

from kvpress import AdaKVPress, PyramidKVPress, StreamingLLMPress
from kvpress.presses.base_press import BasePress

from ripplekv.allocation.cake import CakeRule
from ripplekv.allocation.dynamickv import DynamicKVRule
from ripplekv.allocation.lava import LavaRule
from ripplekv.allocation.per_prompt import PerPromptRule, PerPromptSchedule
from ripplekv.allocation.schedules import PyramidSchedule, UniformSchedule
from ripplekv.allocation.squeezeattention import SqueezeAttentionRule
from ripplekv.presses.full_press import FullPress
from ripplekv.presses.global_layers_press import GlobalLayersPress
from ripplekv.presses.lava_press import LavaPress
from ripplekv.presses.layer_budget_ada_press import LayerBudgetAdaPress
from ripplekv.presses.layer_budget_press import LayerBudgetPress, scorer_at_ratio
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress
from ripplekv.presses.registry import Build
from ripplekv.presses.ripplekv_press import press_setting
from ripplekv.presses.selection_window import scorer_window
from ripplekv.profiling.damage_profile import ORACLE_METHOD, require_damage_profile


def kept_fraction(b: Build) -> float:
    """The budget of kvpress's own presses, configured by a compression ratio: a kept fraction, never tokens."""
    if b.spec.budget is None:
        raise ValueError(
            f"{b.method.name} is kvpress's own press, configured by a compression ratio: it takes a kept "
            f"fraction (budget=), not tokens={b.spec.tokens}"
        )
    return float(b.spec.budget)


def per_prompt(b: Build, rule: type[PerPromptRule]) -> PerPromptBudgetPress:
    """``rule``'s per-prompt press over the scorer, reserving the window the scorer keeps (none without one)."""
    inner = b.scorer()
    window = b.method.values.get("window") or scorer_window(inner) or int(b.window)
    schedule = PerPromptSchedule(b.method.config(rule), **b.spec.kwargs(), window_size=scorer_window(inner))
    return PerPromptBudgetPress(inner, schedule, statistic_window=window)


def build_full(b: Build) -> BasePress:
    return FullPress()


def build_streamingllm(b: Build) -> BasePress:
    return GlobalLayersPress(
        StreamingLLMPress(compression_ratio=1 - kept_fraction(b), n_sink=b.method.values["n_sink"])
    )


def build_snapkv(b: Build) -> BasePress:
    return LayerBudgetPress(b.scorer(), UniformSchedule(**b.spec.kwargs()))


def build_pyramidkv(b: Build) -> BasePress:
    schedule = PyramidSchedule(**b.spec.kwargs(), window_size=b.window, beta=b.method.values["beta"])
    return LayerBudgetPress(b.scorer(), schedule)


def build_pyramidkv_kvpress(b: Build) -> BasePress:
    return GlobalLayersPress(PyramidKVPress(compression_ratio=1 - kept_fraction(b), window_size=b.window))


def build_adakv(b: Build) -> BasePress:
    scorer = scorer_at_ratio(b.scorer(), 1 - kept_fraction(b))
    return GlobalLayersPress(AdaKVPress(scorer, alpha_safeguard=b.method.values["alpha_safeguard"]))


def build_ripplekv_local(b: Build) -> BasePress:
    return b.ripple(b.needs_profile(), signal="local")


def build_ripplekv_oracle(b: Build) -> BasePress:
    return b.ripple(require_damage_profile(ORACLE_METHOD, b.profile))


def build_ripplekv_ada(b: Build) -> BasePress:
    """RippleKV's per-layer budgets (the ``ripplekv`` schedule, same floor) with AdaKV's head-wise allocation."""
    ripple = b.ripple(b.needs_profile())
    setting = press_setting(ripple)
    return LayerBudgetAdaPress(b.scorer(), ripple.schedule, profile=b.profile, strict_profile=b.strict, setting=setting)


def build_cake(b: Build) -> BasePress:
    return per_prompt(b, CakeRule)


def build_squeezeattention(b: Build) -> BasePress:
    return per_prompt(b, SqueezeAttentionRule)


def build_dynamickv(b: Build) -> BasePress:
    return per_prompt(b, DynamicKVRule)


def build_lava_layer(b: Build) -> BasePress:
    return per_prompt(b, LavaRule)


def build_lava(b: Build) -> BasePress:
    """LAVa complete: ``lava-layer``'s press (its layer budgets) with LAVa's head-wise split inside each layer."""
    layer = per_prompt(b, LavaRule)
    return LavaPress(
        layer.press, layer.schedule, statistic_window=layer.statistic_window, floor_alpha=b.method.values["floor_alpha"]
    )
