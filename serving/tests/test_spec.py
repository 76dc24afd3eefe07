"""Every layer of a RippleKV engine is in one KV-cache group whose hole is the pooled one; ``register()`` is idempotent
and keeps vLLM's own specs served."""

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
from ripplekv_vllm.hole import hole
from ripplekv_vllm.manager import RippleManager
from ripplekv_vllm.spec import RippleSpec, ripple_spec_from


def stock() -> FullAttentionSpec:
    """A SmolLM2-135M layer's stock spec (3 KV heads of 64, float32, 32-token blocks)."""
    return FullAttentionSpec(block_size=32, num_kv_heads=3, head_size=64, dtype=torch.float32)


def specs_of(fractions: list[float]) -> list[RippleSpec]:
    """Each layer's spec (one setting for every layer: its fraction lives in the budgets)."""
    budgets = FractionBudgets.of_layers(fractions, 32, 64)
    return [ripple_spec_from(stock(), budgets, 64, 5) for _ in fractions]


def groups_of(fractions: list[float]) -> list[int]:
    """The layer count of each KV-cache group vLLM forms for layers of these fractions."""
    config = VllmConfig()
    config.cache_config.kv_cache_layout = "LBHNC"
    specs = {f"model.layers.{i}.self_attn.attn": spec for i, spec in enumerate(specs_of(fractions))}
    out = []
    for group in get_kv_cache_groups(config, specs):
        assert type(group.kv_cache_spec) is RippleSpec
        out.append(len(group.layer_names))
    return out


def test_register_is_idempotent_and_keeps_stock_specs_served() -> None:
    ripplekv_vllm.register()
    ripplekv_vllm.register()
    assert KVCacheSpecRegistry.get_manager_class(stock()) is FullAttentionManager
    (spec,) = specs_of([0.5])
    assert KVCacheSpecRegistry.get_manager_class(spec) is RippleManager
    assert KVCacheSpecRegistry.get_uniform_type_base_spec(spec) is RippleSpec
    # the attention backend is not overridden process-wide: the plugin's runner gives it to its own engine only
    assert AttentionBackendEnum.CPU_ATTN.get_path() == "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"


def test_every_layer_is_in_one_kv_cache_group() -> None:
    ripplekv_vllm.register()
    assert groups_of([0.25] * 10 + [0.5] * 10 + [1.0] * 10) == [30]
    assert groups_of([0.5] * 30) == [30]


def test_the_group_frees_what_its_layers_kept_blocks_leave() -> None:
    (spec, *_) = specs_of([0.25, 0.25, 0.5, 0.5])
    for n in (100, 333, 500, 1102, 2049):
        layers = [hole(n, f, 32, 64)[0] // 32 for f in (0.25, 0.25, 0.5, 0.5)]
        assert spec.budgets.layer_kept_blocks(n) == tuple(layers)
        assert spec.hole(n) == (-(-sum(layers) // 4) * 32, n // 32 * 32)


def test_merge_refuses_two_settings_and_keeps_the_setting() -> None:
    a = specs_of([0.25, 0.5])[0]
    b = specs_of([0.5, 0.25])[0]
    with pytest.raises(AssertionError, match="different settings"):
        RippleSpec.merge([a, b])
    with pytest.raises(AssertionError, match="RippleSpec layers only"):
        RippleSpec.merge([a, stock()])
    merged = RippleSpec.merge([a, a])
    assert merged == a and merged.tier == (a.budgets, 64, 5)
    assert not a.is_uniform_with_collection({"x": a, "y": b}) and a.is_uniform_with_collection({"x": a})
    assert b.page_size_bytes == stock().page_size_bytes
    assert not a.prefix_cacheable
