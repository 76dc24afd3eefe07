"""Relations of a run's bookkeeping (issue 26): an extended run's history of configurations, the warning of a
profile applied to other weights, once per (profile, model) pair, and (issue 45) a resume over the same profile
content only. Each test names the seeded bug it was checked to catch.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from ripplekv.models.identity import cached_weights_fingerprint
from ripplekv.profiling import profile as profile_module
from ripplekv.profiling.profile import ProfileError, ProfileWeightsWarning
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.results import ConfigMismatchError, check_or_write_config, open_results
from ripplekv_eval.running.runner import load_run_profiles, open_run_folder, resolve_config
from tests.conftest import synthetic_profile, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

EXTENDABLE = {"scorers": ["snapkv"], "budgets": [], "methods": []}
OLD = "2000-01-01T00:00:00+00:00"  # a creation time no run written now can have


def _config(**changes: Any) -> dict[str, Any]:
    return {"suite": "needle", "methods": ["full", "snapkv"], "budgets": [0.2], "window_size": 8, **changes}


def _saved(out: Path) -> dict[str, Any]:
    return json.loads((out / "config.json").read_text())


def _backdate(out: Path, created: str) -> None:
    """Set the folder config's ``created``, so each configuration's creation time is told apart."""
    saved = _saved(out)
    saved["created"] = created
    (out / "config.json").write_text(json.dumps(saved))


# ------------------------------------------------------------------------------------- a run's extension history


def test_every_extension_keeps_the_configurations_before_it_in_order_with_their_creation_times(tmp_path: Path) -> None:
    """Three configurations, each extending the one before: ``extended_from`` lists the first two in order, each
    with the ``created`` of the config.json it was, and ``config`` is the last. Resuming the last configuration, or
    refusing a configuration that is not an extension, leaves the history as it is.
    Seeded bugs caught: the history replaced by the last previous configuration only; the new entry put first;
    the previous entry stamped with the new creation time."""
    out = tmp_path / "run"
    out.mkdir()
    first, second = _config(), _config(scorers=["snapkv", "tova"])
    third = _config(scorers=["snapkv", "tova"], budgets=[0.2, 0.5])
    check_or_write_config(out, first, {}, extendable=EXTENDABLE)
    assert "extended_from" not in _saved(out)
    _backdate(out, OLD)
    check_or_write_config(out, second, {}, extendable=EXTENDABLE)
    assert _saved(out)["extended_from"] == [{"config": first, "created": OLD}]
    _backdate(out, "2001-01-01T00:00:00+00:00")
    check_or_write_config(out, third, {}, extendable=EXTENDABLE)
    saved = _saved(out)
    assert saved["config"] == third
    assert saved["extended_from"] == [
        {"config": first, "created": OLD},
        {"config": second, "created": "2001-01-01T00:00:00+00:00"},
    ]
    check_or_write_config(out, third, {}, extendable=EXTENDABLE)  # a resume: nothing changes
    with pytest.raises(ConfigMismatchError, match="window_size"):  # not an extension: another setting
        check_or_write_config(out, {**third, "window_size": 16}, {}, extendable=EXTENDABLE)
    assert _saved(out) == saved


def test_a_run_folder_extends_its_config_only_where_the_run_says_it_may(tmp_path: Path) -> None:
    """``open_results`` hands its ``extendable`` keys on: with them, more scorers extend the folder's run (the
    history kept); without, the same change is refused. Seeded bug caught: ``open_results`` not passing
    ``extendable`` on to the config check."""
    out = tmp_path / "run"
    with open_results(out, _config(), {}, extendable=EXTENDABLE):
        pass
    wider = _config(scorers=["snapkv", "tova"])
    with pytest.raises(ConfigMismatchError, match="scorers"):
        open_results(out, wider, {})
    with open_results(out, wider, {}, extendable=EXTENDABLE):
        pass
    saved = _saved(out)
    assert saved["config"] == wider and [h["config"] for h in saved["extended_from"]] == [_config()]


# ---------------------------------------------------------------------- a warning per (profile, model) pair


def _caught(call: Any) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if issubclass(w.category, ProfileWeightsWarning)]


def test_other_weights_warn_once_per_profile_and_model_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two profiles of other weights (fingerprints ``a``, ``b``) and two models of one architecture (seeds 0, 1):
    each of the four (profile, model) pairs warns the first time only, in any order, naming both fingerprints; a
    profile of the model's own weights never warns; ``strict`` raises for a pair already warned about too.
    Seeded bugs caught: the warning keyed by the profile only; by the model only; given every time; never."""
    monkeypatch.setattr(profile_module, "_WARNED", set())
    x, y = tiny_model("llama", layers=2, seed=0), tiny_model("llama", layers=2, seed=1)
    base = synthetic_profile(x)
    a = dataclasses.replace(base, weights_fingerprint="a" * 16)
    b = dataclasses.replace(base, weights_fingerprint="b" * 16)
    own = dataclasses.replace(base, weights_fingerprint=cached_weights_fingerprint(x))
    assert cached_weights_fingerprint(x) != cached_weights_fingerprint(y)
    order = [(a, x), (a, x), (b, x), (a, y), (b, y), (b, x), (a, y), (b, y), (a, x)]
    counts = [len(_caught(lambda p=p, m=m: p.check_model(m))) for p, m in order]
    assert counts == [1, 0, 1, 1, 1, 0, 0, 0, 0]
    (message,) = _caught(lambda: dataclasses.replace(base, weights_fingerprint="c" * 16).check_model(y))
    assert "c" * 16 in str(message.message) and cached_weights_fingerprint(y) in str(message.message)
    assert _caught(lambda: own.check_model(x)) == [] and _caught(lambda: own.check_model(x)) == []
    with pytest.raises(ProfileError, match="strict"):
        a.check_model(x, strict=True)


# ------------------------------------------------------------------------ a resume and its profile's content


def _open_eval_folder(out: Path, config: EvalConfig, model: Any) -> None:
    """``run_eval``'s steps up to its run folder: the profiles read from ``config``'s paths, the configuration
    resolved (no samples: the profile's part is what is compared here) and checked against the folder's."""
    profiles = load_run_profiles(config)
    resolved = resolve_config(config, model, [], profiles.profile, profiles.oracles)
    with open_run_folder(config, out, resolved, profiles):
        pass


def test_a_run_resumes_over_the_same_profile_content_only(tmp_path: Path) -> None:
    """A run folder made with a profile resumes with it, refuses the profile rewritten at the same path with other
    scores (rows of two profiles are never mixed in one run), and resumes with the first profile's content at
    another path (the path is a source: recorded, not compared). Seeded bugs caught: the profile fingerprinted by
    its path (``sha256_json(config.profile)``); the profile left out of the resolved configuration."""
    model = tiny_model("llama", layers=2)
    profile = synthetic_profile(model)
    path = profile.save(tmp_path / "a.profile.json")
    config = EvalConfig(suite="needle", methods=("full", "ripplekv"), budgets=(0.5,), profile=str(path), window_size=8)
    out = tmp_path / "run"
    _open_eval_folder(out, config, model)
    _open_eval_folder(out, config, model)  # a resume
    rescored = tuple(0.01 * (i + 2) for i in range(len(profile.scores)))
    assert rescored != profile.scores
    dataclasses.replace(profile, scores=rescored, sample_scores=(rescored,), local_scores=rescored).save(path)
    with pytest.raises(ConfigMismatchError, match="profile: saved"):
        _open_eval_folder(out, config, model)
    moved = profile.save(tmp_path / "moved.profile.json")
    _open_eval_folder(out, dataclasses.replace(config, profile=str(moved)), model)
