"""Method specs (``cake:tau1=2,tau2=0.5``): parsing, one canonical name per setting, validation by the method's own
dataclass, the command-line list and grids, and what each parameter sets in the press ``make_press`` builds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kvpress import KnormPress

from ripplekv.allocation.budget import AllocationConfig
from ripplekv.allocation.per_prompt import PerPromptSchedule
from ripplekv.allocation.schedules import PyramidSchedule
from ripplekv.cli.args import method_list
from ripplekv.presses.descriptions import describe_method
from ripplekv.presses.method_lists import expand_grid, split_method_list
from ripplekv.presses.method_spec import METHOD_TABLE, MethodSpec, base_method, format_value, parse_method
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress
from ripplekv.presses.registry import METHODS, make_press
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv_eval.running.config import EvalConfig
from tests.conftest import synthetic_profile, tiny_model


def _profile() -> SensitivityProfile:
    return synthetic_profile(tiny_model("llama", layers=4))


def test_every_method_declares_its_parameters_and_every_default_is_a_valid_setting() -> None:
    assert set(METHOD_TABLE) == set(METHODS)
    for name in METHODS:
        assert parse_method(name) == MethodSpec(name)
        assert parse_method(name).values == {p.name: p.default for p in METHOD_TABLE[name].params}


def test_one_setting_has_one_name() -> None:
    assert parse_method("cake:tau2=0.5,tau1=2").canonical() == "cake:tau1=2,tau2=0.5"  # declared order
    assert parse_method("CAKE : tau1 = 1").canonical() == "cake"  # a default is left out
    assert parse_method("ripplekv:r=16.0,gamma=12").canonical() == "ripplekv:r=16,gamma=12"
    assert parse_method("dynamickv:update_interval=4.0").canonical() == "dynamickv"  # 4.0 reads as the int 4
    assert parse_method("lava-layer:gqa_support=false").values["gqa_support"] is False
    assert parse_method("ripplekv", r=8.0).canonical() == "ripplekv:r=8"  # keyword overrides
    assert parse_method(parse_method("cake:tau1=2"), tau2=3.0).canonical() == "cake:tau1=2,tau2=3"
    assert base_method("Cake:tau1=2") == "cake" and base_method(MethodSpec("cake")) == "cake"


@given(st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False))
def test_values_round_trip_exactly(value: float) -> None:
    spec = parse_method(f"cake:tau1={format_value(value)}")
    assert spec.values["tau1"] == value
    assert parse_method(spec.canonical()) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cake:tau3=1", "method 'cake' has no parameter 'tau3' \\(its parameters: tau1, tau2, window\\)"),
        ("snapkv:r=2", "method 'snapkv' has no parameter 'r' \\(its parameters: none\\)"),
        ("cake:tau1=-1", "method 'cake': CakeRule.tau1 must be a finite number > 0"),
        ("cake:tau1=nan", "method 'cake', parameter 'tau1': expected a finite number"),
        ("cake:tau1=x", "method 'cake', parameter 'tau1': expected a number"),
        ("cake:tau1=1,tau1=2", "given twice"),
        ("cake:tau1", "expected key=value"),
        ("cake:", "must be followed by key=value"),
        ("squeezeattention:p=1.5", "SqueezeAttentionRule.p must be <= 1"),
        ("squeezeattention:n_clusters=2.5", "expected an integer"),
        ("ripplekv:gamma=0.5", "gamma must be a finite number >= 1"),
        ("dynamickv:pooling=mean", "DynamicKVRule.pooling must be one of"),
        ("dynamickv:window=0", "window must be an integer >= 1"),
        ("lava:gqa_support=maybe", "expected true or false"),
        ("pyramidkv:beta=0", "beta"),
        ("streamingllm:n_sink=-1", "n_sink must be an integer >= 0"),
        ("adakv:alpha_safeguard=2", "alpha_safeguard must be in \\[0, 1\\]"),
        ("lava:floor_alpha=1.5", "floor_alpha must be in \\[0, 1\\]"),
        ("lava-layer:floor_alpha=0.5", "method 'lava-layer' has no parameter 'floor_alpha'"),
        ("nosuch:a=1", "unknown method 'nosuch'"),
    ],
)
def test_bad_specs_name_the_method_and_the_problem(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_method(text)
    with pytest.raises(ValueError, match=message):
        make_press(text, budget=0.2, profile=_profile())


def test_a_keyword_and_a_spec_must_agree() -> None:
    with pytest.raises(ValueError, match="r is given twice"):
        make_press("ripplekv:r=16", budget=0.2, profile=_profile(), ratio=8.0)
    assert make_press("ripplekv:r=16", budget=0.2, profile=_profile(), ratio=16.0).ratio == 16.0


def test_command_line_lists_continue_a_method_with_its_pairs() -> None:
    text = "full,ripplekv:r=16,gamma=12,cake:tau1=2,tau2=0.5,snapkv"
    assert split_method_list(text) == ["full", "ripplekv:r=16,gamma=12", "cake:tau1=2,tau2=0.5", "snapkv"]
    assert method_list("cake:tau2=0.5,tau1=2,squeezeattention:p=1") == ("cake:tau1=2,tau2=0.5", "squeezeattention:p=1")
    for bad in ("tau1=2,cake", "snapkv,tau1=2", "cake,,snapkv"):
        with pytest.raises(ValueError):
            split_method_list(bad)


def test_grids_are_the_product_of_their_values() -> None:
    specs = [s.canonical() for s in expand_grid("cake:tau1=0.5|1|2,tau2=1|3")]
    assert specs == [
        "cake:tau1=0.5",
        "cake:tau1=0.5,tau2=3",
        "cake",
        "cake:tau2=3",
        "cake:tau1=2",
        "cake:tau1=2,tau2=3",
    ]
    assert [s.canonical() for s in expand_grid("pyramidkv")] == ["pyramidkv"]
    with pytest.raises(ValueError, match="distinct"):
        expand_grid("cake:tau1=1|1")


def test_each_parameter_reaches_the_press_it_configures() -> None:
    profile = _profile()
    ripple = make_press("ripplekv:r=16,gamma=12", budget=0.2, profile=profile)
    assert (ripple.ratio, ripple.gamma) == (16.0, 12.0)
    local = make_press("ripplekv-local:gamma=6", budget=0.2, profile=profile)
    assert (local.ratio, local.gamma, local.signal) == (4.0, 6.0, "local")
    cake = make_press("cake:tau1=2,tau2=0.5", budget=0.2)
    assert (cake.schedule.rule.tau1, cake.schedule.rule.tau2) == (2.0, 0.5)
    squeeze = make_press("squeezeattention:p=0.625,n_clusters=4", budget=0.2)
    assert (squeeze.schedule.rule.p, squeeze.schedule.rule.n_clusters) == (0.625, 4)
    dynamic = make_press("dynamickv:radio_max=5,update_interval=2,window=8", budget=0.2)
    assert (dynamic.schedule.rule.radio_max, dynamic.schedule.rule.update_interval) == (5.0, 2)
    assert (dynamic.statistic_window, dynamic.window_size, dynamic.schedule.window_size) == (
        8,
        64,
        64,
    )  # its own window, SnapKV's kept
    assert make_press("pyramidkv:beta=5", budget=0.2).schedule.beta == 5
    assert make_press("streamingllm:n_sink=2", budget=0.2).press.n_sink == 2
    assert make_press("adakv:alpha_safeguard=0.5", budget=0.2).press.alpha_safeguard == 0.5
    lava = make_press("lava:floor_alpha=0.5,kernel_size=5", budget=0.2)
    assert (lava.floor_alpha, lava.schedule.rule.kernel_size) == (0.5, 5)


@pytest.mark.parametrize("method", ["cake", "squeezeattention", "dynamickv", "lava-layer"])
def test_a_per_prompt_rule_reserves_only_the_window_its_scorer_keeps(method: str) -> None:
    snap = make_press(method, budget=0.2)
    assert (snap.window_size, snap.schedule.window_size, snap.statistic_window, snap.floor) == (64, 64, 64, 64)
    for scorer in ("expected_attention", "tova", "knorm"):
        press = make_press(method, budget=0.2, scorer=scorer)
        # nothing reserved, floor 1 (as RippleKV's LayerBudgetPress under the same scorer); statistics over 64
        assert (press.window_size, press.schedule.window_size, press.statistic_window, press.floor) == (0, 0, 64, 1)
        ripple = make_press("ripplekv", budget=0.2, profile=_profile(), scorer=scorer)
        assert press.floor == ripple.floor
    with pytest.raises(ValueError, match="reserves a 64-token window but the scorer KnormPress always keeps 0"):
        PerPromptBudgetPress(KnormPress(), PerPromptSchedule(snap.schedule.rule, 0.2, window_size=64))


def test_a_windowless_scorer_lets_the_rule_share_every_token() -> None:
    from ripplekv.allocation.cake import CakeRule

    rule = CakeRule()
    stats = [(1.0, 1.0), (2.0, 1.0), (3.0, 1.0), (10.0, 1.0)]  # preference P_l = H_l: 1 : 2 : 3 : 10
    press = make_press("cake", budget=0.25, scorer="expected_attention")
    budgets = press.schedule.layer_budgets(4, 400, press.floor, stats=stats)
    assert (
        budgets == rule.layer_budgets(4, 400, 1, stats=stats, total=400, window_size=0) == (25, 50, 75, 250)
    )  # P / sum(P) * total
    snap = make_press("cake", budget=0.25)
    assert (
        snap.schedule.layer_budgets(4, 400, snap.floor, stats=stats)[0] == 64 + (400 - 4 * 64) // 16
    )  # window + share


def test_eval_config_stores_canonical_specs_and_refuses_bad_ones() -> None:
    config = EvalConfig(suite="needle", methods=("full", "cake:tau2=0.5,tau1=2", "squeezeattention:p=0.625"))
    assert config.methods == ("full", "cake:tau1=2,tau2=0.5", "squeezeattention:p=0.625")
    names = {name for name, _ in config.configurations}
    assert {"cake:tau1=2,tau2=0.5", "squeezeattention:p=0.625"} <= names
    with pytest.raises(ValueError, match="duplicates"):
        EvalConfig(suite="needle", methods=("cake:tau1=1", "cake"))  # one setting, two spellings
    with pytest.raises(ValueError, match="unknown method"):
        EvalConfig(suite="needle", methods=("nosuch:a=1",))
    with pytest.raises(ValueError, match="CakeRule.tau1"):
        EvalConfig(suite="needle", methods=("cake:tau1=0",))
    with pytest.raises(ValueError, match="kept fractions only"):
        EvalConfig(suite="needle", methods=("streamingllm:n_sink=2",), budgets=(), tokens=(64,))
    scored = EvalConfig(suite="needle", methods=("cake:tau1=2", "streamingllm:n_sink=2"), scorers=("snapkv", "tova"))
    assert [n for n, _ in scored.configurations].count("streamingllm:n_sink=2") == len(scored.budget_values)


def test_reports_describe_a_spec_by_its_method_and_parameters() -> None:
    assert describe_method("cake:tau1=2,tau2=0.5") == METHOD_TABLE["cake"].description + ", with tau1=2, tau2=0.5"
    assert describe_method("cake") == METHOD_TABLE["cake"].description
    assert describe_method("unknown:x=1") == "unknown:x=1"


def test_the_verdict_finds_each_family_under_its_tuned_setting() -> None:
    from benchmarks.allocators_verdict import resolve

    methods = ["full", "snapkv", "pyramidkv:beta=5", "cake:tau1=2", "dynamickv", "lava", "squeezeattention:p=0.625"]
    candidate, families = resolve([*methods, "ripplekv:r=16,gamma=12", "ripplekv-local:r=16,gamma=12"])
    assert candidate == "ripplekv:r=16,gamma=12"
    assert families["depth"] == ("pyramidkv:beta=5",) and families["local signal"] == ("ripplekv-local:r=16,gamma=12",)
    assert families["attention statistics"] == ("cake:tau1=2", "dynamickv", "lava")  # lava-layer absent: left out
    assert families["representation change"] == ("squeezeattention:p=0.625",)
    assert resolve(["snapkv"])[0] is None
    with pytest.raises(SystemExit, match="two settings of cake"):
        resolve(["cake", "cake:tau1=2"])


@pytest.mark.parametrize("spec", ["dynamickv:window=8", "cake:window=32", "lava:window=32", "dynamickv"])
def test_a_statistic_window_of_its_own_reads_the_keys_the_selection_chooses_among(spec: str) -> None:
    import torch

    from ripplekv.inference.generate import kept_tokens, prefill
    from tests.conftest import random_ids

    model = tiny_model("llama", layers=4)
    n, reserve = 160, 16
    press = make_press(spec, budget=0.3, window_size=reserve)
    ids = random_ids(n)
    with torch.no_grad():
        state = prefill(model, ids, press)
    assert sum(kept_tokens(state)) == 4 * int(n * 0.3)  # SnapKV's total, whatever window the statistics read
    seen: list[int] = []
    original = press.schedule.rule.layer_statistic

    def spy(attention: torch.Tensor, *rest: object) -> object:
        seen.append(attention.shape[-1])
        return original(attention, *rest)

    object.__setattr__(press.schedule.rule, "layer_statistic", spy)
    with torch.no_grad():
        prefill(model, ids, press)
    assert seen == [n - max(press.statistic_window, reserve)] * 4  # the prefix before both windows


@pytest.mark.parametrize(
    "committed",
    [
        "dynamickv:radio_max=2,window=64",
        "lava:window=64,floor_alpha=0.1",
        "lava-layer:window=128",
        "cake:tau1=8,tau2=2,window=32",
        "ripplekv:gamma=6",
        "pyramidkv:beta=5",
        "squeezeattention:p=0.8",
    ],
)
def test_specs_of_committed_runs_keep_their_names(committed: str) -> None:
    """Rows of committed runs are keyed by canonical specs: the table's parameter order must keep them."""
    assert parse_method(committed).canonical() == committed


def test_a_parameter_of_a_dataclass_has_its_fields_kind_and_default() -> None:
    """Parameters and defaults are declared once, on the dataclasses the methods are built from; RippleKV's r and
    gamma default to None (derived when the press is built: the profile's setting, else the dataclass's default)."""
    import dataclasses

    for method in METHOD_TABLE.values():
        for param in method.params:
            if param.owner is not None:
                field = {f.name: f for f in dataclasses.fields(param.owner)}[param.field or param.name]
                derived = param.default is None and param.owner is AllocationConfig
                assert derived or param.default == field.default, (method, param)
                assert param.kind.__name__ == field.type, (method, param)
    # a knob of a press that needs torch is declared by hand (the table loads without torch): the press's default
    from kvpress import AdaKVPress, StreamingLLMPress

    from ripplekv.presses.lava_press import LavaPress

    for name, press in (("streamingllm", StreamingLLMPress), ("adakv", AdaKVPress), ("lava", LavaPress)):
        for param in (p for p in METHOD_TABLE[name].params if p.owner is None and p.name != "window"):
            assert param.default == {f.name: f.default for f in dataclasses.fields(press)}[param.name], param
    assert parse_method("ripplekv:r=8").config(AllocationConfig) == AllocationConfig(ratio=8.0)
    assert parse_method("ripplekv").config(AllocationConfig) == AllocationConfig()  # None: the dataclass default
    assert parse_method("pyramidkv").values == {"beta": PyramidSchedule.beta}


@pytest.mark.parametrize(
    ("module", "name", "replacement"),
    [
        ("ripplekv.presses.method_spec", "METHOD_PARAMS", "METHOD_TABLE[name].params"),
        ("ripplekv.presses.descriptions", "METHOD_DESCRIPTIONS", "METHOD_TABLE[name].description"),
        ("ripplekv.presses", "METHOD_DESCRIPTIONS", "METHOD_TABLE[name].description"),
    ],
)
def test_removed_tables_point_to_the_method_table(module: str, name: str, replacement: str) -> None:
    import re

    with pytest.raises(ImportError, match=re.escape(replacement)):
        exec(f"from {module} import {name}", {})


def test_the_profile_a_method_needs_is_declared_once_in_its_entry() -> None:
    """``make_press``, ``eval``, ``tune``, ``allocate`` and ``generate`` all read ``Method.needs_profile``."""
    from ripplekv.presses.method_spec import Method, needs_profile

    needed = {name: method.needs_profile for name, method in METHOD_TABLE.items() if method.needs_profile}
    assert needed == {
        "ripplekv": "sensitivity",
        "ripplekv-local": "sensitivity",
        "ripplekv-ada": "sensitivity",
        "ripplekv-oracle": "damage",
    }
    assert needs_profile("RippleKV-Local:r=8") == "sensitivity" and needs_profile("uniform") == ""
    with pytest.raises(ValueError, match="method 'ripplekv-ada' needs a sensitivity profile"):
        make_press("ripplekv-ada", budget=0.2)
    with pytest.raises(ValueError, match="needs a damage profile .* got a sensitivity profile"):
        make_press("ripplekv-oracle", budget=0.2, profile=_profile())
    with pytest.raises(ValueError, match="needs_profile must be"):
        Method("a method", METHOD_TABLE["full"].factory, needs_profile="some")  # type: ignore[arg-type]
