"""Group specs stay in separate KV-cache groups; ``register()`` is idempotent and keeps vLLM's own specs served."""

from __future__ import annotations

import pytest
import torch
from vllm.config import VllmConfig
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.core.kv_cache_utils import get_kv_cache_groups
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

import ripplekv_vllm
from ripplekv_vllm.budgets import FractionBudgets
from ripplekv_vllm.manager import RippleManager
from ripplekv_vllm.spec import RippleSpec, ripple_spec_from


def stock() -> FullAttentionSpec:
    """A SmolLM2-135M layer's stock spec (3 KV heads of 64, float32, 32-token blocks)."""
    return FullAttentionSpec(block_size=32, num_kv_heads=3, head_size=64, dtype=torch.float32)


def specs_of(fractions: list[float]) -> list[RippleSpec]:
    """Each layer's spec when the layers of one fraction form a group."""
    budgets = FractionBudgets.of_layers(fractions, 32, 64)
    group_of = budgets.group_of_layers()
    return [ripple_spec_from(stock(), budgets, group_of[i], 64, 5) for i in range(len(fractions))]


def fraction_of(spec: RippleSpec) -> float:
    """The kept fraction of a spec's group."""
    return spec.budgets.fractions[spec.group]


def groups_of(fractions: list[float]) -> list[tuple[float, int]]:
    """(keep fraction, layers) of each KV-cache group vLLM forms for layers of these fractions."""
    config = VllmConfig()
    config.cache_config.kv_cache_layout = "LBHNC"
    specs = {f"model.layers.{i}.self_attn.attn": spec for i, spec in enumerate(specs_of(fractions))}
    out = []
    for group in get_kv_cache_groups(config, specs):
        kinds = {(type(specs[name]), specs[name].group) for name in group.layer_names}
        assert len(kinds) == 1, kinds  # one group's layers per KV-cache group
        assert type(group.kv_cache_spec) is RippleSpec
        out.append((fraction_of(group.kv_cache_spec), len(group.layer_names)))
    return sorted(out)


def test_register_is_idempotent_and_keeps_stock_specs_served() -> None:
    ripplekv_vllm.register()
    ripplekv_vllm.register()
    assert KVCacheSpecRegistry.get_manager_class(stock()) is FullAttentionManager
    (spec,) = specs_of([0.5])
    assert KVCacheSpecRegistry.get_manager_class(spec) is RippleManager
    assert KVCacheSpecRegistry.get_uniform_type_base_spec(spec) is RippleSpec
    # the attention backend is not overridden process-wide: the plugin's runner gives it to its own engine only
    assert AttentionBackendEnum.CPU_ATTN.get_path() == "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"


def test_each_group_is_its_own_kv_cache_group() -> None:
    ripplekv_vllm.register()
    assert groups_of([0.25] * 10 + [0.5] * 10 + [1.0] * 10) == [(0.25, 10), (0.5, 10), (1.0, 10)]
    assert groups_of([0.5] * 30) == [(0.5, 30)]


def test_merge_refuses_two_groups_and_keeps_the_group() -> None:
    a, b = specs_of([0.25, 0.5])
    with pytest.raises(AssertionError, match="different groups"):
        RippleSpec.merge([a, b])
    with pytest.raises(AssertionError, match="RippleSpec layers only"):
        RippleSpec.merge([a, stock()])
    merged = RippleSpec.merge([a, a])
    assert merged == a and merged.tier == (a.budgets, 0, 64, 5) and fraction_of(merged) == 0.25
    assert not a.is_uniform_with_collection({"x": a, "y": b}) and a.is_uniform_with_collection({"x": a})
    assert b.page_size_bytes == stock().page_size_bytes
    assert not a.prefix_cacheable
