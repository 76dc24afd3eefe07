"""``RippleConfig``: bad settings and engine settings the plugin cannot serve with fail with a clear message."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import PROFILE

from ripplekv_vllm.config import RippleConfig, RippleConfigError

ENGINE = {"num_layers": 30, "block_size": 32, "max_model_len": 2048, "max_num_batched_tokens": 2048}


def make(settings: dict, **engine) -> RippleConfig:
    """A config of SmolLM2-135M's engine facts (30 layers), overridden by ``engine``."""
    return RippleConfig.from_settings(settings, **{**ENGINE, **engine})


def profile_with(tmp_path: Path, **changes) -> str:
    """A copy of the SmolLM2 profile with top-level fields replaced; returns its path."""
    data = json.loads(PROFILE.read_text())
    data.update(changes)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return str(path)


def raises(message: str):
    """``pytest.raises(RippleConfigError)`` matching ``message`` literally."""
    return pytest.raises(RippleConfigError, match=re.escape(message))


def test_a_profile_and_a_budget_give_one_group_per_layer() -> None:
    config = make({"profile": str(PROFILE), "budget": 0.2})
    assert config.budgets.groups == tuple((layer,) for layer in range(30))
    kept = config.budgets.layer_budgets(1500)
    assert len(set(kept)) > 3 and sum(kept) == 30 * (288 + 1500 % 32)  # SnapKV-uniform's 9 blocks per layer


def test_tiers_of_equal_sizes_in_budget_order() -> None:
    config = make({"profile": str(PROFILE), "budget": 0.2, "groups": 3})
    groups = config.budgets.groups
    assert len(groups) == 3 and {len(g) for g in groups} == {10}
    scores = config.budgets.scores  # tiers are runs of the layers ranked by sensitivity
    assert all(max(scores[i] for i in groups[a]) <= min(scores[i] for i in groups[a + 1]) for a in range(2))
    for n in (700, 2000):
        kept = config.budgets.kept_blocks(n)
        assert list(kept) == sorted(kept)


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        (0.0, "ripplekv: budget must be > 0 (a kept fraction in (0, 1]), got 0.0"),
        (1.5, "ripplekv: budget=1.5 is above 1, but budget is a kept fraction in (0, 1]"),
        (None, "ripplekv: no budget given"),
        (float("nan"), "ripplekv: budget is NaN"),
    ],
)
def test_bad_budget(budget, message: str) -> None:
    with raises(message):
        make({"profile": str(PROFILE), "budget": budget})


def test_profile_of_another_layer_count(tmp_path: Path) -> None:
    data = json.loads(PROFILE.read_text())
    path = profile_with(
        tmp_path,
        model={**data["model"], "num_hidden_layers": 24},
        scores=data["scores"][:24],
        local_scores=data["local_scores"][:24],
        sample_scores=[r[:24] for r in data["sample_scores"]],
    )
    with raises(f"ripplekv: profile {path} has 24 layer scores, but the served model has 30 layers"):
        make({"profile": path, "budget": 0.2})


def test_profile_with_nan(tmp_path: Path) -> None:
    data = json.loads(PROFILE.read_text())
    path = profile_with(tmp_path, scores=[*data["scores"][:3], float("nan"), *data["scores"][4:]])
    with raises(f"ripplekv: profile {path}: scores of layer 3 is nan (NaN or non-finite): the profile is unusable"):
        make({"profile": path, "budget": 0.2})


def test_profile_of_another_architecture() -> None:
    with raises("was measured on a model with num_key_value_heads=3, the served model has num_key_value_heads=4"):
        make({"profile": str(PROFILE), "budget": 0.2}, model={"num_key_value_heads": 4})


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"enable_prefix_caching": True}, "ripplekv: prefix caching is on"),
        ({"enable_prefix_caching": True}, "start vLLM with enable_prefix_caching=False"),
        ({"block_size": 16}, "ripplekv: block_size 16 is not a multiple of 32"),
        ({"block_size": 48}, "ripplekv: block_size 48 is not a multiple of 32"),
        ({"max_num_batched_tokens": 1024}, "ripplekv: max_num_batched_tokens=1024 is below max_model_len=2048"),
        ({"long_prefill_token_threshold": 64}, "only chunked prefill serves: start vLLM with enable_chunked_prefill"),
        ({"disable_hybrid_kv_cache_manager": True}, "start vLLM with disable_hybrid_kv_cache_manager=False"),
        ({"speculative_decoding": True}, "ripplekv: speculative decoding is on"),
        ({"async_scheduling": True}, "start vLLM with async_scheduling=False"),
        ({"kv_connector": True}, "start vLLM without kv_transfer_config"),
        ({"parallel_sizes": {"tensor_parallel_size": 2}}, "start vLLM with tensor_parallel_size=1"),
        ({"parallel_sizes": {"pipeline_parallel_size": 2}}, "start vLLM with pipeline_parallel_size=1"),
        ({"parallel_sizes": {"decode_context_parallel_size": 2}}, "with decode_context_parallel_size=1"),
        ({"parallel_sizes": {"prefill_context_parallel_size": 2}}, "with prefill_context_parallel_size=1"),
    ],
)
def test_engine_settings_the_plugin_cannot_serve(engine: dict, message: str) -> None:
    with raises(message):
        make({"keep_fractions": [0.5] * 30}, **engine)


def test_chunked_prefill_is_served_with_any_step_budget_and_a_long_prefill_cap() -> None:
    chunked = {"enable_chunked_prefill": True, "max_num_batched_tokens": 256, "long_prefill_token_threshold": 128}
    assert make({"keep_fractions": [0.5] * 30}, **chunked).enable_chunked_prefill


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"keep_fractions": [0.5] * 29}, "ripplekv: keep_fractions has 29 values for a model of 30 layers"),
        ({"keep_fractions": [0.5] * 29 + [0.0]}, "ripplekv: keep_fractions[29] is 0.0; it must be in (0, 1]"),
        ({"keep_fractions": [float("nan")] * 30}, "ripplekv: keep_fractions[0] is nan; it must be in (0, 1]"),
        ({"keep_fractions": [0.5] * 30, "budget": 0.2}, "give 'keep_fractions' or 'profile' with 'budget', not both"),
        ({}, "ripplekv: no budget source"),
        ({"profile": str(PROFILE), "budget": 0.2, "groups": 4}, "groups must be 'layer' or a number of tiers dividing"),
        ({"profile": str(PROFILE), "budget": 0.2, "groups": "tier"}, "groups must be 'layer' or a number of tiers"),
        ({"profile": "/nonexistent.json", "budget": 0.2}, "profile file /nonexistent.json does not exist"),
        ({"keep_fractions": [0.5] * 30, "window": 0}, "ripplekv: window must be an integer >= 1, got 0"),
        ({"keep_fractions": [0.5] * 30, "kernel_size": 4}, "kernel_size must be an odd integer >= 1, got 4"),
        ({"keep_fraction": 0.5}, "additional_config['ripplekv'] has unknown settings ['keep_fraction']"),
        ({"profile": str(PROFILE), "budget": 0.2, "gamma": 0.5}, "ripplekv: AllocationConfig.gamma must be"),
    ],
)
def test_bad_settings(settings: dict, message: str) -> None:
    with raises(message):
        make(settings)


def profile_with_setting(tmp_path: Path, chosen: tuple[float, float] = (16.0, 30.0)) -> str:
    """The SmolLM2 profile with a chosen RippleKV setting (made-up evidence that makes ``chosen`` the rule's pick)."""
    from dataclasses import replace

    from ripplekv.profiling.profile import ProfileSetting, SensitivityProfile, SettingCandidate

    grid = [(4.0, 3.0), chosen]
    candidates = tuple(
        SettingCandidate(r, g, tuple((0.1 if (r, g) == chosen else 0.5,) for _ in range(3))) for r, g in grid
    )
    setting = ProfileSetting(
        ratio=chosen[0],
        gamma=chosen[1],
        budgets=(0.1, 0.2, 0.3),
        candidates=candidates,
        snapkv_kl=((0.9,), (0.9,), (0.9,)),
        prompts={"samples": [0], "split": "all"},
    )
    path = tmp_path / "with-setting.profile.json"
    replace(SensitivityProfile.load(PROFILE), setting=setting).save(path)
    return str(path)


def test_the_profiles_setting_is_served_unless_one_is_given(tmp_path: Path) -> None:
    """The plugin serves what the library's presses run: the profile's chosen r and gamma, an explicit pair over it,
    and r 4, gamma 3 for a profile without one."""
    from ripplekv_vllm.budgets import ProfileBudgets

    path = profile_with_setting(tmp_path)
    chosen = make({"profile": path, "budget": 0.2})
    assert (chosen.setting.ratio, chosen.setting.gamma, chosen.setting.source) == (16.0, 30.0, "profile")
    assert (chosen.budgets.ratio, chosen.budgets.gamma) == (16.0, 30.0)
    expected = ProfileBudgets(chosen.budgets.groups, chosen.budgets.scores, 0.2, 16.0, 30.0, 32, 64)
    assert chosen.budgets.layer_budgets(1500) == expected.layer_budgets(1500)
    explicit = make({"profile": path, "budget": 0.2, "gamma": 6.0})
    assert (explicit.setting.ratio, explicit.setting.gamma, explicit.setting.source) == (4.0, 6.0, "explicit")
    plain = make({"profile": str(PROFILE), "budget": 0.2})
    assert (plain.setting.ratio, plain.setting.gamma, plain.setting.source) == (4.0, 3.0, "default")
    assert chosen.budgets.layer_budgets(1500) != plain.budgets.layer_budgets(1500)
