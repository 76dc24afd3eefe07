"""Every committed eval run resumes from the committed tree: each profile its ``config.json`` fingerprints (under the
path its ``sources`` record) is the file in the tree. A profile rewritten after its run (a rerun of ``ripplekv
analyze`` that only moved the ``created`` time once did) makes ``COMMAND.sh`` refuse to resume; this catches it.
Seeded bug: a committed damage profile saved again with another ``created`` time fails the test."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ripplekv.profiling.profile import SensitivityProfile
from ripplekv_eval.running.results import CONFIG_FORMAT, sha256_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# Ran on 2026-11-30 with the first profile and that day's profile format; their COMMAND.sh says which commit resumes
# them. Every later run must resume from the tree as it is.
EARLY_RUNS = {"longbench-mini", "ruler-4k", "needle"}


def _fingerprinted_profiles(config: dict) -> list[tuple[str, str, bool]]:
    """(source path, recorded sha256, whether it hashes the file's bytes) of every profile a saved config names: an
    eval's profile and oracle profiles (hashed as JSON content), a tuning run's candidate profiles (file bytes)."""
    sources, resolved = config.get("sources", {}), config.get("config", {})
    found = []
    if sources.get("profile") and isinstance(resolved.get("profile"), dict):
        found.append((sources["profile"], resolved["profile"]["sha256"], False))
    for path, entry in zip(sources.get("oracle_profile") or [], resolved.get("oracle_profile") or [], strict=True):
        found.append((path, entry["sha256"], False))
    for label, path in (sources.get("profiles") or {}).items():
        found.append((path, resolved["profiles"][label], True))
    return found


def _eval_configs() -> list[Path]:
    found = []
    for path in sorted(RESULTS.rglob("config.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("format") == CONFIG_FORMAT and _fingerprinted_profiles(data):
            found.append(path)
    return found


CONFIGS = _eval_configs()


def test_the_committed_runs_with_profiles_are_found() -> None:
    names = {p.parent.relative_to(RESULTS).as_posix() for p in CONFIGS}
    assert {"oracle-fidelity", "qwen2.5-coder-0.5b/oracle-fidelity", "qwen2.5-coder-0.5b/tune"} <= names
    assert len(CONFIGS) >= 20


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.parent.relative_to(RESULTS).as_posix())
def test_a_committed_run_fingerprints_the_committed_profiles(path: Path) -> None:
    if path.parent.relative_to(RESULTS).as_posix() in EARLY_RUNS:
        pytest.skip("an early run: resumes from the commit its COMMAND.sh names")
    for source, recorded, by_bytes in _fingerprinted_profiles(json.loads(path.read_text())):
        profile = ROOT / source
        assert profile.is_file(), f"{path} names {source}, which is not in the tree"
        if by_bytes:
            found = hashlib.sha256(profile.read_bytes()).hexdigest()
        else:
            found = sha256_json(SensitivityProfile.load(profile).to_dict())
        assert found == recorded, f"{source} is not the profile {path} ran with: rerunning it would refuse to resume"
